package outboxpgx

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/outboxdriver"
)

// IdleWatch watches outboxes whose relays are not running, and says when one has
// messages to publish: a process that serves many outboxes stops the relay of one that
// has had nothing to do for a while, and starts it again when the watch wakes it. An
// idle outbox then costs nothing but its share of the watch.
//
// From one connection for every outbox of its pool, the watch listens on each outbox's
// channel and holds each one's gate (schema version 7), so that writers notify; a
// notification wakes its outbox. A writer between its insert and its commit when the
// watch asks for the gate wakes it too. And every interval, in one statement per
// hundred of them, it looks for messages due (delayed, retried, or committed while no one held the
// gate): correctness never rests on a notification. Adding an outbox makes the same
// check for it once it listens and holds the gate, so that messages committed before
// that are found.
//
// The same connection listens for the running relays of the pool's outboxes too
// (Listen), so that a process serving many outboxes of a database has one listening
// session there, whether they are parked or running: PostgreSQL signals every listening
// session of a database at each notifying commit, and each one reads every
// notification, so the cost of listening grows with the sessions, not the channels.
//
// Run keeps the connection; its statements are followed by the stall watch, and a lost
// connection is made again, with every outbox listened to and checked anew (the running
// relays' Listen calls return, and the relays listen again).
type IdleWatch struct {
	pool   *pgxpool.Pool
	every  time.Duration
	stalls *stallWatch
	chunk  int // dueChunk, or less in a test

	mu      sync.Mutex
	watched map[*Driver]*idleEntry
	gone    []idleGone    // removed, still listened to on the connection
	changed chan struct{} // a send (never blocking) after each change
	running map[*Driver]*listenEntry
	leaving []*listenEntry     // Listen returned: let go of on the connection
	check   bool               // a stall verdict: check the connection
	byChan  map[string]*Driver // the outboxes watched or running, by channel
}

// listenEntry is a running relay's Listen call. The session goroutine alone uses the
// fields after listening, and calls wake and answer only with w.mu held and the entry
// still in w.running, so that none comes after Listen returned.
type listenEntry struct {
	d      *Driver
	wake   func(outboxdriver.Wake, int64)
	answer func(outboxdriver.GateState) // nil: no gate
	ended  chan error                   // the session's failure, which ends the call

	asked     bool // under w.mu: an ask not yet answered
	listening bool // under w.mu: listening on the current connection

	fixed outboxdriver.GateState // what an ask gets without asking the database; GateArmed: ask it
	held  bool                   // the session holds the gate for it
}

type idleGone struct {
	d     *Driver
	gated bool
}

type idleEntry struct {
	woken chan struct{}
	ready bool // listening and holding the gate on the current connection
	gated bool // holding the gate (schema version 7): let go of at the wake
}

// NewIdleWatch returns a watch over pool's outboxes that looks for messages due every
// every (at least a second).
func NewIdleWatch(pool *pgxpool.Pool, every time.Duration) *IdleWatch {
	return &IdleWatch{pool: pool, every: max(every, time.Second), stalls: stallWatchOf(pool), chunk: dueChunk,
		watched: map[*Driver]*idleEntry{}, changed: make(chan struct{}, 1),
		running: map[*Driver]*listenEntry{}, byChan: map[string]*Driver{}}
}

// Listen is d's Listen (outboxdriver.Listener) on the watch's connection, for the
// relay of d's outbox (a driver on the watch's pool), which must not be watched
// (Add) meanwhile. It returns when ctx ends, or with the error that ended the
// connection: the relay polls until it listens again.
func (w *IdleWatch) Listen(ctx context.Context, d *Driver, wake func(outboxdriver.Wake, int64), gate outboxdriver.Gate) error {
	if err := d.needPool(); err != nil {
		return err
	}
	e := &listenEntry{d: d, wake: wake, answer: gate.Answer, ended: make(chan error, 1)}
	w.mu.Lock()
	if _, dup := w.running[d]; dup {
		w.mu.Unlock()
		return errors.New("idle watch: the outbox's relay listens already")
	}
	w.running[d] = e
	w.byChan[d.names.Channel] = d
	w.poke()
	w.mu.Unlock()
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for {
			select {
			case <-fctx.Done():
				return
			case <-gate.Asks:
				w.mu.Lock()
				e.asked = true
				w.poke()
				w.mu.Unlock()
			case <-d.stalls.stalls():
				w.mu.Lock()
				w.check = true
				w.poke()
				w.mu.Unlock()
			}
		}
	}()
	select {
	case err := <-e.ended:
		return err
	case <-ctx.Done():
		w.mu.Lock()
		if w.running[d] == e {
			delete(w.running, d)
			w.unmapLocked(d)
			if e.listening {
				w.leaving = append(w.leaving, e)
			}
			w.poke()
		}
		w.mu.Unlock()
		return ctx.Err()
	}
}

// unmapLocked forgets d's channel unless d is still watched or running.
func (w *IdleWatch) unmapLocked(d *Driver) {
	_, watched := w.watched[d]
	_, running := w.running[d]
	if !watched && !running {
		delete(w.byChan, d.names.Channel)
	}
}

// Add watches d's outbox, a driver on the watch's pool, until its channel is closed:
// when it has messages to publish. Adding it again while watched returns the same
// channel.
func (w *IdleWatch) Add(d *Driver) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e, ok := w.watched[d]; ok {
		return e.woken
	}
	e := &idleEntry{woken: make(chan struct{})}
	w.watched[d] = e
	w.byChan[d.names.Channel] = d
	w.poke()
	return e.woken
}

// Remove stops watching d's outbox without waking it.
func (w *IdleWatch) Remove(d *Driver) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.removeLocked(d)
}

func (w *IdleWatch) removeLocked(d *Driver) {
	e, ok := w.watched[d]
	if !ok {
		return
	}
	delete(w.watched, d)
	w.unmapLocked(d)
	if e.ready {
		w.gone = append(w.gone, idleGone{d, e.gated})
	}
	w.poke()
}

// wake closes d's channel and stops watching it.
func (w *IdleWatch) wake(d *Driver) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e, ok := w.watched[d]; ok {
		close(e.woken)
		w.removeLocked(d)
	}
}

func (w *IdleWatch) poke() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// Run keeps the watch's connection until ctx ends, making it again after a failure
// (report is told of each, and may be nil).
func (w *IdleWatch) Run(ctx context.Context, report func(error)) {
	for failures := 0; ctx.Err() == nil; failures++ {
		started := time.Now()
		err := w.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if report != nil {
			report(err)
		}
		if time.Since(started) > time.Minute {
			failures = 0
		}
		t := time.NewTimer(dbRetryDelay(failures))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// dbRetryDelay is the wait before making a lost connection again: 100 ms doubling up
// to 10 s.
func dbRetryDelay(failures int) time.Duration {
	return min(100*time.Millisecond<<min(failures, 7), 10*time.Second)
}

// session runs the watch on one connection until it fails or ctx ends.
func (w *IdleWatch) session(ctx context.Context) (err error) {
	pc, err := acquire(ctx, w.pool)
	if err != nil {
		return err
	}
	conn := pc.Hijack()
	defer conn.Close(context.WithoutCancel(ctx))
	exec := func(sql string, args ...any) error {
		return w.stalls.follow(conn.PgConn(), func() error { _, err := conn.Exec(ctx, sql, args...); return err })
	}
	queryRow := func(sql string, args []any, dest ...any) error {
		return w.stalls.follow(conn.PgConn(), func() error { return conn.QueryRow(ctx, sql, args...).Scan(dest...) })
	}
	pid := conn.PgConn().PID()
	var started time.Time // the session's, which with its process ID names it
	if err := queryRow(`SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()`, nil, &started); err != nil {
		return fmt.Errorf("idle watch: %w", err)
	}
	w.mu.Lock()
	for _, e := range w.watched {
		e.ready, e.gated = false, false
	}
	w.gone, w.leaving, w.check = nil, nil, false // the new session holds nothing of theirs
	w.mu.Unlock()
	asked := map[*Driver]bool{} // every outbox whose gate the session was asked to take
	defer func() {
		// The server may keep the session, and the gates it holds, a while (or until
		// TCP keepalive, when the network went silent): each outbox's own listener takes
		// it for a session to end, not another relay's (leftSessions). Every outbox whose
		// gate was asked for is told, whether or not the answer came back: one lost with
		// the connection may have taken it. The running relays' Listen calls end.
		w.mu.Lock()
		defer w.mu.Unlock()
		for d := range asked {
			d.left.add(pid, started)
		}
		for _, e := range w.watched {
			e.ready, e.gated = false, false
		}
		if err == nil {
			err = ctx.Err()
		}
		for d, e := range w.running {
			e.ended <- err
			delete(w.running, d)
			w.unmapLocked(d)
		}
	}()

	// LISTEN and UNLISTEN by channel, counted: an outbox's relay may stop and its outbox
	// be watched (or the other way round) before the connection let go of it.
	listens := map[string]int{}
	listen := func(d *Driver) error {
		if listens[d.names.Channel]++; listens[d.names.Channel] > 1 {
			return nil
		}
		if err := exec("LISTEN " + d.names.ChannelIdent); err != nil {
			return fmt.Errorf("idle watch: listen: %w", err)
		}
		return nil
	}
	unlisten := func(d *Driver) error {
		if listens[d.names.Channel]--; listens[d.names.Channel] > 0 {
			return nil
		}
		delete(listens, d.names.Channel)
		if err := exec("UNLISTEN " + d.names.ChannelIdent); err != nil {
			return fmt.Errorf("idle watch: unlisten: %w", err)
		}
		return nil
	}
	release := func(d *Driver) error {
		var ok bool
		if err := queryRow(d.names.GateRelease(), []any{pid}, &ok); err != nil {
			return fmt.Errorf("idle watch: let go of the gate: %w", err)
		}
		if !ok {
			return errSessionMoved
		}
		return nil
	}
	// The session answers running relays' asks only once its own notification came
	// back, which proves it is kept from one statement to the next (through PgBouncer in
	// transaction pooling mode it is not, and a gate it took would stay with whichever
	// server process ran the statement).
	probe, probing, verified := pgsql.NotifyProbe(), "", false

	nextCheck := time.Now().Add(w.every)
	for {
		// Let go of the outboxes removed, woken or whose relay stopped.
		w.mu.Lock()
		gone, leaving, check := w.gone, w.leaving, w.check
		w.gone, w.leaving, w.check = nil, nil, false
		var fresh []*Driver
		for d, e := range w.watched {
			if !e.ready {
				fresh = append(fresh, d)
			}
		}
		var starting, asking []*listenEntry
		for _, e := range w.running {
			switch {
			case !e.listening:
				starting = append(starting, e)
			case e.asked && (verified || e.fixed != outboxdriver.GateArmed):
				e.asked = false
				asking = append(asking, e)
			}
		}
		w.mu.Unlock()
		for _, e := range leaving {
			if e.held {
				if err := release(e.d); err != nil {
					return err
				}
			}
			if err := unlisten(e.d); err != nil {
				return err
			}
			if probing == e.d.names.Channel && listens[probing] == 0 {
				probing = "" // the probe may not come back: send another
			}
		}
		for _, g := range gone {
			if err := unlisten(g.d); err != nil {
				return err
			}
			if g.gated {
				if err := release(g.d); err != nil && !errors.Is(err, errSessionMoved) {
					return err
				}
			}
		}
		if check {
			if err := exec("SELECT 1"); err != nil {
				return fmt.Errorf("idle watch: %w", err)
			}
		}
		// Running relays: listen, then wake them for what was written before.
		for _, e := range starting {
			if err := listen(e.d); err != nil {
				return err
			}
			var version int
			if err := queryRow(e.d.names.SchemaVersion(), nil, &version); err != nil {
				if conn.IsClosed() || pgsql.SQLState(err) == "" {
					return fmt.Errorf("idle watch: read the schema version: %w", err)
				}
				// This outbox's tables cannot be read (dropped, not granted): its Listen
				// ends with the error, as on a session of its own; the others' go on.
				if err := unlisten(e.d); err != nil {
					return err
				}
				w.mu.Lock()
				if w.running[e.d] == e {
					e.ended <- fmt.Errorf("listen: read the schema version: %w", err)
					delete(w.running, e.d)
					w.unmapLocked(e.d)
				}
				w.mu.Unlock()
				continue
			}
			e.fixed = outboxdriver.GateArmed
			if version < pgsql.GateVersion {
				e.fixed = outboxdriver.GateAlways
			}
			if !verified && probing == "" && e.fixed == outboxdriver.GateArmed {
				if err := exec("SELECT pg_notify($1, $2)", e.d.names.Channel, probe); err != nil {
					return fmt.Errorf("idle watch: %w", err)
				}
				probing = e.d.names.Channel
			}
			w.mu.Lock()
			e.listening = true
			if w.running[e.d] == e {
				e.wake(outboxdriver.WakeWritten, 0)
			} else { // its Listen returned meanwhile
				w.leaving = append(w.leaving, e)
				w.poke()
			}
			w.mu.Unlock()
		}
		for _, e := range asking {
			asked[e.d] = true
			state, err := w.ask(e, pid, queryRow)
			if err != nil {
				return err
			}
			w.mu.Lock()
			w.tellLocked(e, func() {
				if e.answer != nil {
					e.answer(state)
				}
			})
			w.mu.Unlock()
		}
		// Parked outboxes: listen to the new ones and take their gates, then look for
		// what was committed before: a writer that committed earlier notified no one.
		var checkDue []*Driver
		again := false
		for _, d := range fresh {
			if err := listen(d); err != nil {
				return err
			}
			asked[d] = true
			state, err := w.arm(d, pid, queryRow)
			if err != nil {
				return err
			}
			// Marked ready, the outbox is let go of when it is woken or removed; one
			// woken here (its outbox gone, a writer committing) or removed meanwhile is
			// let go of now.
			w.mu.Lock()
			e, ok := w.watched[d]
			switch {
			case ok && state == "again": // not ready: the next round asks again
				w.gone = append(w.gone, idleGone{d, false})
				again = true
			case ok && state != "wake":
				e.ready, e.gated = true, state == "armed"
				checkDue = append(checkDue, d)
			case ok:
				close(e.woken)
				delete(w.watched, d)
				w.unmapLocked(d)
				w.gone = append(w.gone, idleGone{d, false})
			default:
				w.gone = append(w.gone, idleGone{d, state == "armed"})
			}
			w.mu.Unlock()
		}
		if len(checkDue) < len(fresh) || again {
			w.poke() // let go of those at once, or ask again, after the check
		}
		if !time.Now().Before(nextCheck) {
			checkDue = w.all()
			nextCheck = time.Now().Add(w.every)
			if len(checkDue) == 0 {
				// No parked outbox to check: the running relays rely on the connection.
				if err := exec("SELECT 1"); err != nil {
					return fmt.Errorf("idle watch: %w", err)
				}
			}
		}
		if err := w.checkDue(queryRow, checkDue); err != nil {
			return err
		}

		// Wait for a notification, the next check, or a change. The goroutine that
		// interrupts the wait at a change is done before the next round: a change it took
		// after the wait ended is one the next round sees, not one lost.
		wctx, cancel := context.WithDeadline(ctx, nextCheck)
		interrupter := make(chan struct{})
		go func() {
			defer close(interrupter)
			select {
			case <-w.changed:
				cancel()
			case <-wctx.Done():
			}
		}()
		n, err := conn.WaitForNotification(wctx)
		interrupted := wctx.Err() != nil // before cancel, which ends wctx in any case
		cancel()
		<-interrupter
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil && interrupted && !conn.IsClosed(): // the check is due, or a change: the connection is usable
		case err != nil:
			return fmt.Errorf("idle watch: %w", err)
		case n.Payload == probe:
			verified = true
			w.poke() // the asks that waited for it
		case pgsql.IsNotifyProbe(n.Payload): // another relay's
		default:
			if err := w.notified(n.Channel, n.Payload, pid, release); err != nil {
				return err
			}
		}
	}
}

// errSessionMoved: a statement ran in another server process than the session's.
var errSessionMoved = errors.New("idle watch: the watch's session moved to another server process (PgBouncer in transaction pooling mode?); " +
	"the gates stay with the process that took them until that process ends, and writers notify meanwhile: " +
	"give the relays a direct connection or a session-mode pool")

// tellLocked calls f, which wakes or answers e's relay, if e's Listen has not
// returned; w.mu must be held.
func (w *IdleWatch) tellLocked(e *listenEntry, f func()) {
	if w.running[e.d] == e {
		f()
	}
}

// notified handles a notification on ch: it wakes the parked outbox, or the running
// relay, whose channel it is, and lets go of the relay's gate (it is busy again).
func (w *IdleWatch) notified(ch, payload string, pid uint32, release func(*Driver) error) error {
	w.mu.Lock()
	d := w.byChan[ch]
	e := w.running[d]
	if e == nil || !e.listening {
		w.mu.Unlock()
		if d != nil && payload != pgsql.NotifyLeases {
			w.wake(d)
		}
		return nil
	}
	if payload == pgsql.NotifyLeases {
		e.wake(outboxdriver.WakeLeases, 0)
		w.mu.Unlock()
		return nil
	}
	e.wake(outboxdriver.WakeWritten, pgsql.NotifiedFrom(payload))
	w.mu.Unlock()
	if !e.held {
		return nil
	}
	e.held = false
	return release(d)
}

// ask answers a running relay's ask for the gate: from what the session knows, or by
// taking the gate.
func (w *IdleWatch) ask(e *listenEntry, pid uint32, queryRow func(string, []any, ...any) error) (outboxdriver.GateState, error) {
	if e.held || e.fixed != outboxdriver.GateArmed {
		return e.fixed, nil
	}
	state, err := e.d.takeGate(queryRow, pid)
	if err != nil {
		return 0, fmt.Errorf("idle watch: %w", err)
	}
	switch state {
	case outboxdriver.GateArmed:
		e.held = true
	case outboxdriver.GateUnavailable:
		e.fixed = state
	}
	return state, nil
}

// arm takes d's gate on the session of pid: "armed", "covered" (another session
// holds it: writers notify all the same; so they do before the gate, schema version 6
// and older), "again" (a session d's listener closed held it: ended now, ask again), or
// "wake": the outbox has work or may have (a writer between its insert and its commit,
// a session not kept from one statement to the next, its tables gone).
func (w *IdleWatch) arm(d *Driver, pid uint32, queryRow func(string, []any, ...any) error) (string, error) {
	var version int
	if err := queryRow(d.names.SchemaVersion(), nil, &version); err != nil {
		if isUndefinedTable(err) {
			return "wake", nil
		}
		return "", fmt.Errorf("idle watch: read the schema version: %w", err)
	}
	if version < pgsql.GateVersion {
		return "covered", nil
	}
	var state string
	if err := queryRow(d.names.GateArm(), []any{pid}, &state); err != nil {
		return "", fmt.Errorf("idle watch: take the gate: %w", err)
	}
	switch state {
	case "busy", "moved":
		return "wake", nil
	case "covered":
		// Held by the session of the outbox's stopped relay, which the server has not
		// ended yet? It would end without a notification: end it, and ask again.
		ended, err := d.left.endHolder(queryRow, d.names.WakeKey)
		if err != nil {
			return "", fmt.Errorf("idle watch: %w", err)
		}
		if ended {
			return "again", nil
		}
	}
	return state, nil
}

// all returns the outboxes watched and ready on the connection.
func (w *IdleWatch) all() []*Driver {
	w.mu.Lock()
	defer w.mu.Unlock()
	var ds []*Driver
	for d, e := range w.watched {
		if e.ready {
			ds = append(ds, d)
		}
	}
	return ds
}

// dueChunk bounds the outboxes one statement of checkDue looks at. The statement locks
// every table it reads until it ends (a few per outbox: the pending ring's buckets and
// the rest), and the server's lock table is shared and small (max_locks_per_transaction
// times max_connections, 6,400 by default): a thousand outboxes in one statement took
// 8,000 locks, and other sessions' statements failed meanwhile with "out of shared
// memory".
const dueChunk = 100

// checkDue wakes those of ds that have messages due, in one statement per w.chunk.
func (w *IdleWatch) checkDue(queryRow func(string, []any, ...any) error, ds []*Driver) error {
	for chunk := range slices.Chunk(ds, w.chunk) {
		if err := w.checkDueChunk(queryRow, chunk); err != nil {
			return err
		}
	}
	return nil
}

func (w *IdleWatch) checkDueChunk(queryRow func(string, []any, ...any) error, ds []*Driver) error {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = fmt.Sprintf("CASE WHEN %s THEN %d END", d.names.AnyDue(), i)
	}
	var due []*int32
	err := queryRow("SELECT ARRAY["+strings.Join(parts, ", ")+"]::int[]", nil, &due)
	if err != nil {
		if isUndefinedTable(err) { // an outbox was dropped: find which one by one
			for _, d := range ds {
				var one []*int32
				if err := queryRow("SELECT ARRAY[CASE WHEN "+d.names.AnyDue()+" THEN 0 END]::int[]", nil, &one); err != nil {
					if !isUndefinedTable(err) {
						return fmt.Errorf("idle watch: look for messages due: %w", err)
					}
					w.wake(d) // gone: its relay finds out and says so
				}
			}
			return nil
		}
		return fmt.Errorf("idle watch: look for messages due: %w", err)
	}
	for _, i := range due {
		if i != nil {
			w.wake(ds[*i])
		}
	}
	return nil
}

// isUndefinedTable reports whether err is PostgreSQL's undefined_table (42P01) or
// invalid_schema_name (3F000) or undefined_function (42883): the outbox's tables, or its
// schema, are gone.
func isUndefinedTable(err error) bool {
	switch pgsql.SQLState(err) {
	case "42P01", "3F000", "42883":
		return true
	}
	return false
}
