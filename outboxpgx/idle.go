package outboxpgx

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/pgsql"
)

// IdleWatch watches outboxes whose relays are not running, and says when one has
// messages to publish: a process that serves many outboxes stops the relay of one that
// has had nothing to do for a while, and starts it again when the watch wakes it. An
// idle outbox then costs nothing but its share of the watch.
//
// From one connection for every outbox of its pool, the watch listens on each outbox's
// channel and holds each one's gate (schema version 7), so that writers notify; a
// notification wakes its outbox. A writer between its insert and its commit when the
// watch asks for the gate wakes it too. And every interval, in one statement for all of
// them, it looks for messages due (delayed, retried, or committed while no one held the
// gate): correctness never rests on a notification. Adding an outbox makes the same
// check for it once it listens and holds the gate, so that messages committed before
// that are found.
//
// Run keeps the connection; its statements are followed by the stall watch, and a lost
// connection is made again, with every outbox listened to and checked anew.
type IdleWatch struct {
	pool   *pgxpool.Pool
	every  time.Duration
	stalls *stallWatch

	mu      sync.Mutex
	watched map[*Driver]*idleEntry
	gone    []idleGone    // removed, still listened to on the connection
	changed chan struct{} // a send (never blocking) after each Add or Remove
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
	return &IdleWatch{pool: pool, every: max(every, time.Second), stalls: newStallWatch(pool),
		watched: map[*Driver]*idleEntry{}, changed: make(chan struct{}, 1)}
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
func (w *IdleWatch) session(ctx context.Context) error {
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
	w.gone = nil // the new session holds nothing of theirs
	w.mu.Unlock()
	defer func() {
		// The server may keep the session, and the gates it holds, a while (or until
		// TCP keepalive, when the network went silent): each outbox's own listener takes
		// it for a session to end, not another relay's (leftSessions).
		w.mu.Lock()
		defer w.mu.Unlock()
		for d, e := range w.watched {
			if e.gated {
				d.left.add(pid, started)
			}
			e.ready, e.gated = false, false
		}
		for _, g := range w.gone {
			if g.gated {
				g.d.left.add(pid, started)
			}
		}
	}()

	nextCheck := time.Now().Add(w.every)
	for {
		// Let go of the outboxes removed or woken.
		w.mu.Lock()
		gone := w.gone
		w.gone = nil
		var fresh []*Driver
		for d, e := range w.watched {
			if !e.ready {
				fresh = append(fresh, d)
			}
		}
		w.mu.Unlock()
		for _, g := range gone {
			if err := exec("UNLISTEN " + g.d.names.ChannelIdent); err != nil {
				return fmt.Errorf("idle watch: unlisten: %w", err)
			}
			if !g.gated {
				continue
			}
			var ok bool
			if err := queryRow(g.d.names.GateRelease(), []any{pid}, &ok); err != nil {
				return fmt.Errorf("idle watch: let go of the gate: %w", err)
			}
		}
		// Listen to the new ones and take their gates, then look for what was
		// committed before: a writer that committed earlier notified no one.
		var check []*Driver
		again := false
		for _, d := range fresh {
			if err := exec("LISTEN " + d.names.ChannelIdent); err != nil {
				return fmt.Errorf("idle watch: listen: %w", err)
			}
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
				check = append(check, d)
			case ok:
				close(e.woken)
				delete(w.watched, d)
				w.gone = append(w.gone, idleGone{d, false})
			default:
				w.gone = append(w.gone, idleGone{d, state == "armed"})
			}
			w.mu.Unlock()
		}
		if len(check) < len(fresh) || again {
			w.poke() // let go of those at once, or ask again, after the check
		}
		if !time.Now().Before(nextCheck) {
			check = w.all()
			nextCheck = time.Now().Add(w.every)
		}
		if err := w.checkDue(ctx, queryRow, check); err != nil {
			return err
		}

		// Wait for a notification, the next check, or a change.
		wctx, cancel := context.WithDeadline(ctx, nextCheck)
		go func() {
			select {
			case <-w.changed:
				cancel()
			case <-wctx.Done():
			}
		}()
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil && wctx.Err() != nil: // the check is due, or a change: the connection is usable
		case err != nil:
			return fmt.Errorf("idle watch: %w", err)
		case n.Payload == pgsql.NotifyLeases || pgsql.IsNotifyProbe(n.Payload):
		default:
			if d := w.byChannel(n.Channel); d != nil {
				w.wake(d)
			}
		}
	}
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

func (w *IdleWatch) byChannel(ch string) *Driver {
	w.mu.Lock()
	defer w.mu.Unlock()
	for d := range w.watched {
		if d.names.Channel == ch {
			return d
		}
	}
	return nil
}

// checkDue wakes those of ds that have messages due, in one statement.
func (w *IdleWatch) checkDue(ctx context.Context, queryRow func(string, []any, ...any) error, ds []*Driver) error {
	if len(ds) == 0 {
		return nil
	}
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
