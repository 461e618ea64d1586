package outboxpgx_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
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
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	w := outboxpgx.NewIdleWatch(b.Pool, time.Second)
	go func() {
		defer close(done)
		w.Run(ctx, func(err error) { t.Errorf("idle watch: %v", err) })
	}()
	defer func() { cancel(); <-done }()
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
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	w := outboxpgx.NewIdleWatch(b.Pool, time.Hour)
	go func() {
		defer close(done)
		w.Run(ctx, func(err error) { t.Errorf("idle watch: %v", err) })
	}()
	defer func() { cancel(); <-done }()

	ch := w.Add(drv)
	testenv.AwaitCond(t, "the watch to hold the gate", func() bool {
		pid := b.gateHolder(t)
		return pid != 0 && pid != left
	})
	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`1`)})
	testenv.AwaitChan(t, "the wake after a write", ch, func() any { return fmt.Sprintf("not woken; the gate's holder %d", b.gateHolder(t)) })
}
