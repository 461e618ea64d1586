package outboxpgx

import (
	"context"
	"errors"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
	"weak"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/broken"
)

// A statement waits for its answer as long as its context allows (30 seconds for a
// fetch). When the connection stops delivering without being closed (a partition that
// a firewall's or NAT's state did not survive, a peer gone without a reset), nothing on
// the client side ends the wait before that, or before the operating system's TCP
// timeouts, which are minutes. The stall watch asks the server instead: while one of the
// relay's statements has been out for longer than probeAfter, it looks the statement's
// session up in pg_stat_activity, over a connection of its own, and
//   - leaves a session that is running (active) alone, however long it takes: slow is
//     not silent;
//   - closes the connection of a session that has been waiting for its client (idle, or
//     idle in transaction) since before the statement was sent, once the statement has
//     been out for a probe's round trip plus probeAfter: it never arrived. Causality
//     makes this exact: a session that received the statement changed state after it
//     was sent, so its idle time is below the statement's age plus the probe's round
//     trip; one that did not has been idle for longer than that;
//   - does the same for a session that has been waiting for its client for a probe's
//     round trip plus stallMargin, its statement out as long: its answer never came
//     back, or sits unread in a client starved of CPU (which is why the margin);
//   - does the same for a session blocked sending to its client (ClientWrite) on two
//     probes in a row, and for a session that is gone, once some session it looked up
//     was found (so the process IDs the connections name are the server's), the
//     statement out for the longer margin.
//
// A closed session is terminated too, so that a statement arriving late cannot run
// after the one retried in its place.
//
// A statement that gave up at its own deadline (or was cancelled) leaves its session
// behind when the network is silent: pgx closes the socket, but the server never hears of
// it, and a session idle in a transaction keeps its locks until the server's TCP
// keepalive ends it, hours later. The watch terminates such a session at the next probe
// that answers, if it still exists and started before the statement gave up (so a new
// session that took over the process ID is left alone).
//
// It looks only at sessions of its own role. Through a pooler (PgBouncer) a connection
// names a process ID the pooler made up, which may be another client's session: the
// watch judges nothing once a connection names one no server process can have (above
// maxServerPID, as PgBouncer's random ones nearly always are).
//
// The statement then fails at once with errSilent, and onConn runs it again on another
// connection. After a verdict, the pool's idle connections are pinged with a short
// deadline and the ones that do not answer are closed (they crossed the same network),
// and Listen checks its session.
const (
	// probeAfter is how long a statement is out before the watch looks at its session,
	// and, past a probe's round trip, the most a statement that has not arrived may
	// still be on its way: waiting for the client's CPU to be written, or for the
	// server's to be read (a loaded server leaves a session idle with the statement in
	// its socket; the probe's own round trip need not show that).
	probeAfter = 250 * time.Millisecond
	// stallMargin is how long past a probe's round trip a statement must be out, and its
	// session waiting for it, before a session that did receive it counts as silent. A
	// client starved of CPU (a GC pause, a loaded host) leaves its session idle with the
	// answer unread: that must last this long to be taken for silence. After an outage
	// longer than it, the first probe's verdict is immediate.
	stallMargin = time.Second
	// A probe starts every probeEvery while statements are out, and every probeOverlap
	// while an earlier one has not answered: one sent into a silent network never
	// answers, and the first sent after the network is back gives the verdict.
	probeEvery   = 100 * time.Millisecond
	probeOverlap = 50 * time.Millisecond
	// After probes that failed in a row (no connection, or no answer in probeTimeout),
	// the next one waits probeOverlap doubled for each, up to probeBackoffMax: a server
	// too loaded to take a connection within probeTimeout is not sent twenty new ones a
	// second by every pool, which would keep it loaded (each connection is a process to
	// start). A network that comes back after a long outage is probed within this.
	probeBackoffMax = time.Second
	probeTimeout    = 500 * time.Millisecond // a probe's connect and query
	// probeLost is how much longer than a later probe took an earlier one must be out
	// for the watch to take it for lost: the network dropped it, so statements sent
	// before it that their sessions never received were dropped too.
	probeLost      = 50 * time.Millisecond
	maxProbes      = int(probeTimeout/probeOverlap) + 1
	acquireAttempt = 250 * time.Millisecond // see acquire
	maxServerPID   = 1 << 22                // Linux's PID_MAX_LIMIT: every process ID is below it
)

// errSilent is wrapped by the error of a statement whose connection the stall watch
// closed.
var errSilent = errors.New("the database connection stopped answering")

// stallWatch follows the statements onConn runs. Its goroutine runs while statements
// are out and stops when none is.
type stallWatch struct {
	pool weak.Pointer[pgxpool.Pool] // weak: the watches registry must not keep a pool alive
	conn *pgx.ConnConfig            // the pool's, for the probes' own connections

	mu      sync.Mutex
	out     map[*tracked]struct{}
	running bool
	direct  bool                 // a followed session was seen in pg_stat_activity
	pooled  bool                 // a connection named a process ID above maxServerPID
	spare   []*pgx.Conn          // probe connections not in use
	stalled chan struct{}        // closed at each verdict, then replaced
	purging bool                 // a purge of the pool's idle connections runs
	orphans map[uint32]time.Time // sessions of statements that gave up, by process ID: when
	judged  int                  // probe results judged (for tests)
	unsent  int                  // verdicts on statements that never reached their session (for tests)
}

// tracked is one statement (or transaction) out on a connection.
type tracked struct {
	pid    uint32
	conn   net.Conn
	since  time.Time
	writes int  // probes in a row that saw the session blocked sending to us
	closed bool // by the watch: the statement's error wraps errSilent
}

// probeResult is what one probe saw of the sessions it looked up.
type probeResult struct {
	started  time.Time // when the probe began, connecting included
	lost     time.Time // the start of the latest earlier probe taken for lost; zero if none
	sent     time.Time
	rtt      time.Duration
	sessions map[uint32]session
	err      error
}

type session struct {
	state, wait string
	idleFor     time.Duration // since the session last changed state
	age         time.Duration // since the session started
}

// watches holds the stall watch of each pool, which every driver and idle watch of the
// pool shares: a process serving many outboxes on one pool probes the server for all of
// their statements at once, with at most maxProbes connections, not maxProbes per outbox.
// A pool's entry goes when the pool is collected.
var watches struct {
	mu sync.Mutex
	m  map[weak.Pointer[pgxpool.Pool]]*stallWatch
}

// stallWatchOf returns pool's stall watch, made on first use.
func stallWatchOf(pool *pgxpool.Pool) *stallWatch {
	key := weak.Make(pool)
	watches.mu.Lock()
	defer watches.mu.Unlock()
	if w := watches.m[key]; w != nil {
		return w
	}
	if watches.m == nil {
		watches.m = map[weak.Pointer[pgxpool.Pool]]*stallWatch{}
	}
	w := newStallWatch(pool)
	watches.m[key] = w
	runtime.AddCleanup(pool, func(key weak.Pointer[pgxpool.Pool]) {
		watches.mu.Lock()
		delete(watches.m, key)
		watches.mu.Unlock()
	}, key)
	return w
}

func newStallWatch(pool *pgxpool.Pool) *stallWatch {
	return &stallWatch{pool: weak.Make(pool), conn: pool.Config().ConnConfig, out: map[*tracked]struct{}{}, orphans: map[uint32]time.Time{}, stalled: make(chan struct{})}
}

// track follows a statement about to be sent on pc until done is called; done reports
// whether the watch closed the connection meanwhile.
func (w *stallWatch) track(pc *pgconn.PgConn) (done func() (closed bool)) {
	if broken.Has(broken.NoStallWatch) { // canary: nothing is watched
		return func() bool { return false }
	}
	t := &tracked{pid: pc.PID(), conn: pc.Conn(), since: time.Now()}
	w.mu.Lock()
	if w.pooled = w.pooled || t.pid >= maxServerPID; w.pooled {
		w.mu.Unlock()
		return func() bool { return false }
	}
	w.out[t] = struct{}{}
	w.start()
	w.mu.Unlock()
	return func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.out, t)
		return t.closed
	}
}

// start starts the watch's goroutine unless it runs. w.mu is held.
func (w *stallWatch) start() {
	if !w.running {
		w.running = true
		go w.run()
	}
}

// orphan records that a statement on the session of pid gave up and its connection is
// closed, so that the session is terminated once the server answers.
func (w *stallWatch) orphan(pid uint32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pooled || pid == 0 || pid >= maxServerPID {
		return
	}
	w.orphans[pid] = time.Now()
	w.start()
}

// stalls returns a channel closed at the next verdict.
func (w *stallWatch) stalls() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stalled
}

func (w *stallWatch) run() {
	tick := time.NewTicker(probeOverlap / 2)
	defer tick.Stop()
	results := make(chan probeResult, maxProbes)
	var probes []time.Time // the start of each probe out, oldest first
	var last time.Time     // when the last probe started
	failed := 0            // probes that failed in a row
	for {
		select {
		case r := <-results:
			probes = slices.DeleteFunc(probes, func(s time.Time) bool { return s.Equal(r.started) })
			r.lost = lostProbe(probes, r)
			if failed = min(failed+1, 16); r.err == nil {
				failed = 0
			}
			w.judge(r)
		case now := <-tick.C:
			inFlight := len(probes)
			var latest time.Time // the latest probe out
			if inFlight > 0 {
				latest = probes[inFlight-1]
			}
			w.mu.Lock()
			if len(w.out) == 0 && len(w.orphans) == 0 && inFlight == 0 {
				w.running = false
				spare := w.spare
				w.spare = nil
				w.mu.Unlock()
				for _, c := range spare {
					closeConn(c)
				}
				return
			}
			var pids []int32
			for t := range w.out {
				// Statements sent before a probe that has not answered are looked up
				// too: if that probe turns out lost, so may they be (judge).
				if now.Sub(t.since) >= probeAfter || !t.since.After(latest) {
					pids = append(pids, int32(t.pid))
				}
			}
			for pid := range w.orphans {
				pids = append(pids, int32(pid))
			}
			w.mu.Unlock()
			every := probeEvery
			if inFlight > 0 {
				every = probeOverlap
			}
			if failed > 0 {
				every = min(probeOverlap<<failed, probeBackoffMax)
			}
			if len(pids) > 0 && inFlight < maxProbes && now.Sub(last) >= every {
				probes = append(probes, now)
				last = now
				go func() { results <- w.probe(now, pids) }()
			}
		}
	}
}

// probe looks the sessions of pids up, on a spare probe connection or a new one.
func (w *stallWatch) probe(started time.Time, pids []int32) probeResult {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	w.mu.Lock()
	var c *pgx.Conn
	if n := len(w.spare); n > 0 {
		c, w.spare = w.spare[n-1], w.spare[:n-1]
	}
	w.mu.Unlock()
	if c == nil {
		var err error
		if c, err = pgx.ConnectConfig(ctx, w.conn); err != nil {
			return probeResult{started: started, err: err}
		}
	}
	r := probeResult{started: started, sent: time.Now(), sessions: map[uint32]session{}}
	rows, err := c.Query(ctx, `SELECT pid, coalesce(state, ''), coalesce(wait_event, ''),
		coalesce(extract(epoch FROM clock_timestamp() - state_change), 0)::float8,
		extract(epoch FROM clock_timestamp() - backend_start)::float8
		FROM pg_stat_activity WHERE pid = ANY($1) AND usename = current_user`, pids)
	if err == nil {
		for rows.Next() {
			var pid int32
			var s session
			var idle, age float64
			if err = rows.Scan(&pid, &s.state, &s.wait, &idle, &age); err != nil {
				break
			}
			s.idleFor = time.Duration(idle * float64(time.Second))
			s.age = time.Duration(age * float64(time.Second))
			r.sessions[uint32(pid)] = s
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	r.rtt = time.Since(r.sent)
	if err != nil {
		closeConn(c)
		r.err = err
		return r
	}
	w.mu.Lock()
	w.spare = append(w.spare, c)
	w.mu.Unlock()
	return r
}

// judge closes the connections r shows to be silent.
func (w *stallWatch) judge(r probeResult) {
	if r.err != nil {
		if !unanswered(r.err) { // refused: the server, or the way to it, is up to close sessions itself
			w.mu.Lock()
			w.dropOrphans(r)
			w.mu.Unlock()
		}
		return // the server is out of reach too: nothing to tell a silent connection from an outage by
	}
	var silent []*tracked
	w.mu.Lock()
	if w.pooled {
		clear(w.orphans) // their process IDs may name other clients' sessions now
		w.mu.Unlock()
		return
	}
	terminate := w.dropOrphans(r) // and the sessions of the connections found silent
	w.direct = w.direct || len(r.sessions) > 0
	w.judged++
	for t := range w.out {
		dead, unsent := t.verdict(r, w.direct)
		if unsent {
			w.unsent++
		}
		if dead {
			t.closed = true
			silent = append(silent, t)
			if _, found := r.sessions[t.pid]; found {
				terminate = append(terminate, int32(t.pid))
			}
		}
	}
	if len(silent) == 0 {
		w.mu.Unlock()
		if len(terminate) > 0 {
			go w.terminate(terminate)
		}
		return
	}
	close(w.stalled)
	w.stalled = make(chan struct{})
	purge := !w.purging
	w.purging = true
	w.mu.Unlock()
	for _, t := range silent {
		_ = t.conn.Close()
	}
	go w.terminate(terminate)
	if purge {
		go w.purge(r.rtt)
	}
}

// verdict says, from what r saw of its session, whether t's connection has gone
// silent (dead), and whether that is because the statement never reached the session
// (unsent). direct: some session the watch looked up was found. It counts the probes in
// a row that saw the session blocked sending to us.
func (t *tracked) verdict(r probeResult, direct bool) (dead, unsent bool) {
	age := r.sent.Sub(t.since)
	limit := r.rtt + stallMargin
	// A statement sent before a probe that was lost was sent into the same outage: if
	// its session has been idle since before it was sent, it was lost too, and there is
	// no reason to wait for a loaded server to read it.
	sentIntoLoss := !r.lost.IsZero() && !t.since.After(r.lost)
	if t.closed || age < r.rtt+probeAfter && !sentIntoLoss {
		return false, false
	}
	s, found := r.sessions[t.pid]
	switch {
	case !found:
		return direct && age >= limit, false
	case s.state == "active" && s.wait == "ClientWrite":
		t.writes++
		return t.writes >= 2 && age >= limit, false
	case s.state == "active" && broken.Has(broken.StallKillsSlow): // canary: slow taken for silent
		return true, false
	case s.state == "active":
		t.writes = 0
		return false, false
	case !strings.HasPrefix(s.state, "idle"):
		return false, false
	case s.idleFor >= age+r.rtt || broken.Has(broken.StallIdleUnsent): // idle since before it was sent
		return true, true
	default: // it arrived; its answer did not, or is unread
		return age >= limit && s.idleFor >= limit, false
	}
}

// lostProbe returns the start of the latest probe out (probes, oldest first) that
// started at least probeLost before r, which answered: the network dropped it. Zero if
// none, or if r did not answer.
func lostProbe(probes []time.Time, r probeResult) time.Time {
	var lost time.Time
	for _, s := range probes {
		if r.err == nil && r.started.Sub(s) >= probeLost {
			lost = s
		}
	}
	return lost
}

// dropOrphans forgets the orphans r looked up, and returns those of them it found still
// the session that gave up. w.mu is held.
func (w *stallWatch) dropOrphans(r probeResult) []int32 {
	var found []int32
	for pid, at := range w.orphans {
		if at.After(r.started) {
			continue
		}
		delete(w.orphans, pid)
		// A session that took over the process ID since started after the statement
		// gave up, so it is younger than the time from then to the probe's answer.
		if s, ok := r.sessions[pid]; ok && s.age >= r.sent.Sub(at)+r.rtt {
			found = append(found, int32(pid))
		}
	}
	return found
}

// unanswered reports whether err is a probe's timeout.
func unanswered(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// terminate ends the sessions of pids, so that a statement still on its way to one of
// them cannot run.
func (w *stallWatch) terminate(pids []int32) {
	if len(pids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	c, err := pgx.ConnectConfig(ctx, w.conn)
	if err != nil {
		return
	}
	defer closeConn(c)
	_, _ = c.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = ANY($1) AND usename = current_user", pids)
}

// purge pings every idle connection of the pool at once and closes the ones that do
// not answer within a few probe round trips.
func (w *stallWatch) purge(rtt time.Duration) {
	defer func() {
		w.mu.Lock()
		w.purging = false
		w.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 4*rtt+stallMargin)
	defer cancel()
	var wg sync.WaitGroup
	pool := w.pool.Value()
	if pool == nil {
		return
	}
	for _, c := range pool.AcquireAllIdle(ctx) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Ping(ctx); err != nil {
				closeConn(c.Hijack())
				return
			}
			c.Release()
		}()
	}
	wg.Wait()
}

// closeConn closes c's socket without a goodbye, which a silent connection would not
// deliver.
func closeConn(c *pgx.Conn) { _ = c.PgConn().Conn().Close() }

// acquire takes a connection of the pool in attempts of at most acquireAttempt each:
// the pool pings a connection idle for over a second before lending it, and a silent
// one would hold the attempt until the statement's own deadline. A later attempt takes
// another.
func acquire(ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Conn, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, acquireAttempt)
		c, err := pool.Acquire(actx)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return c, err
		}
	}
}

// onConn runs op on a connection of the pool while the stall watch follows it, again
// on another connection at once each time the connection turned out to be gone or
// silent (onLiveConn). op must be safe to repeat.
func onConn[T any](ctx context.Context, d *Driver, op func(*pgxpool.Conn) (T, error)) (T, error) {
	return onLiveConn(ctx, d.pool, func() (T, error) {
		c, err := acquire(ctx, d.pool)
		if err != nil {
			var zero T
			return zero, err
		}
		defer c.Release()
		var v T
		err = d.stalls.follow(c.Conn().PgConn(), func() (err error) {
			v, err = op(c)
			return err
		})
		return v, err
	})
}

// follow runs f, statements on pc, while the watch follows them; an error of f after the
// watch closed pc wraps errSilent.
func (w *stallWatch) follow(pc *pgconn.PgConn, f func() error) error {
	done := w.track(pc)
	err := f()
	switch closed := done(); {
	case closed && err != nil:
		err = errors.Join(errSilent, err)
	case err != nil && pc.IsClosed() && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) &&
		!broken.Has(broken.StallKeepsOrphans): // canary: a session given up on is left to the server
		w.orphan(pc.PID())
	}
	return err
}
