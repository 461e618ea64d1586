package outboxpgx_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// gateHolder returns the process ID of the session that holds the outbox's gate, or 0.
func (b *testBundle) gateHolder(t *testing.T) int32 {
	t.Helper()
	var pid int32
	err := b.Pool.QueryRow(context.Background(), `SELECT coalesce((SELECT pid FROM pg_locks WHERE locktype = 'advisory'
		AND (classid::bigint << 32 | objid::bigint) = $1 AND mode = 'ExclusiveLock' AND granted), 0)`, b.wakeKey(t)).Scan(&pid)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// runWatch runs w until the test ends, telling report of each failure of its session.
func runWatch(t *testing.T, w *outboxpgx.IdleWatch, report func(error)) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx, report)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func woken(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestIdleWatch: an outbox watched while its relay is stopped is woken by the first
// write (the watch holds its gate, so the writer notifies), at once when messages were
// due before it was watched, by the periodic check for a delayed message that comes
// due (no one notifies then), and when its schema is gone; one removed is not woken, and
// the watch lets go of the gates of the outboxes it no longer watches.
func TestIdleWatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w := outboxpgx.NewIdleWatch(b.Pool, time.Second)
	runWatch(t, w, func(err error) { t.Errorf("idle watch: %v", err) })
	msg := func(key string) outbox.Message { return outbox.Message{Topic: "t", Key: key, Payload: []byte(`1`)} }

	// Nothing due: it waits, holding the gate.
	ch := w.Add(b.Driver)
	testenv.AwaitCond(t, "the watch to hold the gate", func() bool { return b.gateHolder(t) != 0 })
	if woken(ch) {
		t.Fatal("woken with nothing to publish")
	}
	b.Write(t, msg("first"))
	testenv.AwaitChan(t, "the wake after a write", ch, func() any { return "not woken" })
	testenv.AwaitCond(t, "the watch to let go of the gate", func() bool { return b.gateHolder(t) == 0 })

	// Due before it was watched: woken at once.
	ch = w.Add(b.Driver)
	testenv.AwaitChan(t, "the wake for a message already due", ch, func() any { return "not woken" })

	// Removed: not woken, and the gate let go of.
	b.Exec(t, `DELETE FROM %[1]s.outbox`)
	ch = w.Add(b.Driver)
	testenv.AwaitCond(t, "the watch to hold the gate", func() bool { return b.gateHolder(t) != 0 })
	w.Remove(b.Driver)
	testenv.AwaitCond(t, "the watch to let go of the gate", func() bool { return b.gateHolder(t) == 0 })
	b.Write(t, msg("unwatched"))
	if woken(ch) {
		t.Fatal("woken after it was removed")
	}

	// A writer between its insert and its commit when the watch asks for the gate: woken,
	// and the watch holds nothing of it.
	b.Exec(t, `DELETE FROM %[1]s.outbox`)
	tx, err := b.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Writer.Write(ctx, tx, msg("in flight")); err != nil {
		t.Fatal(err)
	}
	ch = w.Add(b.Driver)
	testenv.AwaitChan(t, "the wake for a writer in flight", ch, func() any { return "not woken" })
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.AwaitCond(t, "no session to hold the gate", func() bool { return b.gateHolder(t) == 0 })

	// A delayed message coming due notifies no one: the periodic check finds it.
	b.Exec(t, `DELETE FROM %[1]s.outbox`)
	delayed := msg("delayed")
	delayed.DeliverAt = time.Now().Add(1500 * time.Millisecond)
	b.Write(t, delayed)
	ch = w.Add(b.Driver)
	testenv.AwaitChan(t, "the wake when the delayed message is due", ch, func() any { return "not woken" })

	// Its schema dropped: woken, so that the relay finds out.
	other := setup(t)
	if _, err := b.Pool.Exec(ctx, `DROP SCHEMA "`+other.Schema+`" CASCADE`); err != nil {
		t.Fatal(err)
	}
	ch = w.Add(other.Driver)
	testenv.AwaitChan(t, "the wake for a dropped outbox", ch, func() any { return "not woken" })
}

// TestIdleWatchLeftSessionEnded: an outbox whose relay's listener session the server
// kept, holding the gate, after the relay stopped: the watch does not take the gate for
// another relay's (that session would end without a notification, and no write would
// wake the outbox after): it ends that session, holds the gate, and the next write wakes
// the outbox.
func TestIdleWatchLeftSessionEnded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	drv, left := b.leftListener(t)
	w := outboxpgx.NewIdleWatch(b.Pool, time.Hour)
	runWatch(t, w, func(err error) { t.Errorf("idle watch: %v", err) })

	ch := w.Add(drv)
	testenv.AwaitCond(t, "the watch to hold the gate", func() bool {
		pid := b.gateHolder(t)
		return pid != 0 && pid != left
	})
	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`1`)})
	testenv.AwaitChan(t, "the wake after a write", ch, func() any { return fmt.Sprintf("not woken; the gate's holder %d", b.gateHolder(t)) })
}

// TestIdleWatchRunningRelays: the watch's one session serves running relays (Listen)
// and parked outboxes at once: each relay's gate and each parked outbox's are held by
// that session, a write wakes its own outbox only, an outbox goes from running to
// parked and back with its gate taken again each time, and when the session is ended
// the relays' Listen calls return, and listen again on the next session.
func TestIdleWatchRunningRelays(t *testing.T) {
	t.Parallel()
	a, p := setup(t), setup(t)
	ctx := t.Context()
	w := outboxpgx.NewIdleWatch(a.Pool, time.Hour)
	var failures atomic.Int32
	runWatch(t, w, func(err error) { failures.Add(1) })
	msg := outbox.Message{Topic: "t", Key: "k", Payload: []byte(`1`)}
	lis := listenFunc(func(ctx context.Context, wake func(outboxdriver.Wake, int64), gate outboxdriver.Gate) error {
		return w.Listen(ctx, a.Driver, wake, gate)
	})

	// a runs, p is parked: one session holds both gates.
	events, ask, stop := listenGate(t, lis)
	if s := ask(); s != outboxdriver.GateArmed {
		t.Fatalf("answer %d, want GateArmed", s)
	}
	parked := w.Add(p.Driver)
	testenv.AwaitCond(t, "the watch to hold the parked outbox's gate", func() bool { return p.gateHolder(t) != 0 })
	if ha, hp := a.gateHolder(t), p.gateHolder(t); ha != hp {
		t.Fatalf("the running relay's gate is held by %d, the parked outbox's by %d: want one session", ha, hp)
	}
	a.Write(t, msg)
	if e := testenv.AwaitRecv(t, "the running relay's wake-up", events); !e.wake || e.from == 0 {
		t.Fatalf("event %+v, want a wake-up from a seq", e)
	}
	if woken(parked) {
		t.Fatal("a write into the running relay's outbox woke the parked one")
	}
	testenv.AwaitCond(t, "the session to let go of the running relay's gate", func() bool { return a.gateHolder(t) == 0 })

	// a parks (its relay stopped, its outbox watched) while p is woken and its relay
	// runs.
	a.Exec(t, `DELETE FROM %[1]s.outbox`)
	stop()
	ch := w.Add(a.Driver)
	testenv.AwaitCond(t, "the watch to hold the parked outbox's gate", func() bool { return a.gateHolder(t) != 0 })
	p.Write(t, msg)
	testenv.AwaitChan(t, "the parked outbox's wake", parked, func() any { return "not woken" })
	pEvents, pAsk, pStop := listenGate(t, listenFunc(func(ctx context.Context, wake func(outboxdriver.Wake, int64), gate outboxdriver.Gate) error {
		return w.Listen(ctx, p.Driver, wake, gate)
	}))
	defer pStop()
	p.Exec(t, `DELETE FROM %[1]s.outbox`)
	testenv.AwaitCond(t, "p's gate to be taken", func() bool { return pAsk() == outboxdriver.GateArmed })
	p.Write(t, msg)
	if e := testenv.AwaitRecv(t, "p's relay's wake-up", pEvents); !e.wake || e.from == 0 {
		t.Fatalf("event %+v, want a wake-up from a seq", e)
	}
	a.Write(t, msg)
	testenv.AwaitChan(t, "a's wake while parked", ch, func() any { return "not woken" })

	// The session ended: a relay's Listen returns with the error, the next Listen
	// listens on the next session, and the parked outbox is watched there.
	pStop()
	a.Exec(t, `DELETE FROM %[1]s.outbox`)
	ch = w.Add(a.Driver)
	testenv.AwaitCond(t, "the watch to hold the parked outbox's gate", func() bool { return a.gateHolder(t) != 0 })
	ended := make(chan error, 1)
	woke := make(chan struct{}, 8)
	listen := func() {
		ended <- w.Listen(ctx, p.Driver, func(outboxdriver.Wake, int64) { woke <- struct{}{} }, outboxdriver.Gate{})
	}
	go listen()
	testenv.AwaitRecv(t, "the first wake-up", woke)
	pid := a.gateHolder(t)
	if _, err := p.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	testenv.AwaitCond(t, "the watch to report its session's end", func() bool { return failures.Load() > 0 })
	if err := testenv.AwaitRecv(t, "Listen to return when its session ended", ended); err == nil {
		t.Fatal("Listen returned nil when its session ended")
	}
	go listen()
	testenv.AwaitRecv(t, "the first wake-up on the next session", woke)
	testenv.AwaitCond(t, "the next session to hold the parked outbox's gate", func() bool {
		holder := a.gateHolder(t)
		return holder != 0 && holder != pid
	})
	a.Write(t, msg)
	testenv.AwaitChan(t, "the parked outbox's wake on the next session", ch, func() any { return "not woken" })
}

// TestIdleWatchListenUnreadableOutbox: a relay whose outbox's tables cannot be read (its
// schema dropped) listens on the watch's session: its Listen returns the error, as on a
// session of its own, and the session goes on for the others: a parked outbox is still
// woken by a write.
func TestIdleWatchListenUnreadableOutbox(t *testing.T) {
	t.Parallel()
	p := setup(t)
	gone, err := outboxpgx.New(p.Pool, outboxpgx.Config{Schema: p.Schema + "_gone"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	w := outboxpgx.NewIdleWatch(p.Pool, time.Hour)
	var failures atomic.Int32
	runWatch(t, w, func(err error) { failures.Add(1); t.Logf("idle watch: %v", err) })

	parked := w.Add(p.Driver)
	testenv.AwaitCond(t, "the watch to hold the parked outbox's gate", func() bool { return p.gateHolder(t) != 0 })
	ended := make(chan error, 1)
	go func() { ended <- w.Listen(ctx, gone, func(outboxdriver.Wake, int64) {}, outboxdriver.Gate{}) }()
	if err := testenv.AwaitRecv(t, "Listen on an unreadable outbox to return", ended); err == nil || ctx.Err() != nil {
		t.Fatalf("Listen returned %v, want the error reading its outbox", err)
	}
	p.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`1`)})
	testenv.AwaitChan(t, "the parked outbox's wake", parked, func() any { return "not woken" })
	if n := failures.Load(); n != 0 {
		t.Errorf("the watch's session failed %d times for one unreadable outbox", n)
	}
}

// TestIdleWatchDueChunks: the periodic look for messages due goes over the parked
// outboxes a few per statement (the statement locks every table it reads); one in a
// later statement than the first is woken as well.
func TestIdleWatchDueChunks(t *testing.T) {
	t.Parallel()
	bs := []*testBundle{setup(t), setup(t), setup(t)}
	w := outboxpgx.NewIdleWatch(bs[0].Pool, time.Second)
	outboxpgx.SetDueChunk(w, 1)
	runWatch(t, w, func(err error) { t.Errorf("idle watch: %v", err) })
	// Delayed messages written before the watch held the gates notified no one: the
	// periodic look finds them once they are due.
	for _, b := range bs {
		delayed := outbox.Message{Topic: "t", Key: "k", Payload: []byte(`1`), DeliverAt: time.Now().Add(1500 * time.Millisecond)}
		b.Write(t, delayed)
	}
	var chans []<-chan struct{}
	for _, b := range bs {
		chans = append(chans, w.Add(b.Driver))
	}
	for i, ch := range chans {
		testenv.AwaitChan(t, fmt.Sprintf("outbox %d woken when its delayed message is due", i), ch, func() any { return "not woken" })
	}
}
