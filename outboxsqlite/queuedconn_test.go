package outboxsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

// queueOf returns the write queue of a pool from Open.
func queueOf(t *testing.T, db *sql.DB) *writeQueue {
	t.Helper()
	conn, err := db.Conn(testenv.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var q *writeQueue
	if err := conn.Raw(func(dc any) error {
		qc, ok := dc.(*queuedConn)
		if !ok {
			return fmt.Errorf("connection of a pool from Open is a %T, not a *queuedConn", dc)
		}
		q = qc.c.q
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return q
}

type probeKey struct{}

// TestWriteTurnsFair is the relay against eight application goroutines that write as
// fast as they can, each beginning its next transaction as soon as the last committed:
// the case where SQLite's busy handler lets the eager writers keep the lock and the
// relay waits until they pause. A relay-like writer, on a pool of its own as the relay
// has, begins a transaction forty times, letting the writers go round between them as
// the relay fetches and publishes between its own; each time the test counts the writers'
// transactions that took the lock between the moment it asked (under the queue's mutex)
// and the moment it got the lock. First come, first served bounds that by the number
// of writers: the one holding the lock and those already waiting, each once.
func TestWriteTurnsFair(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "fair.db")
	app, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	relay, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	ctx := testenv.Context(t)
	if _, err := app.ExecContext(ctx, `CREATE TABLE log (seq INTEGER PRIMARY KEY, who TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	// locked counts the writers' transactions that got the lock: each adds one while it
	// holds it, so the count read by a holder is exact.
	var locked atomic.Int64
	var askedAt int64 // locked when the probe asked; written under the queue's mutex
	q := queueOf(t, relay)
	q.mu.Lock()
	q.asked = func(ctx context.Context) {
		if ctx.Value(probeKey{}) != nil {
			askedAt = locked.Load()
		}
	}
	q.mu.Unlock()

	const writers, probes = 8, 40
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, cancel := testenv.CallContext()
				err := func() error {
					tx, err := app.BeginTx(c, nil)
					if err != nil {
						return err
					}
					defer tx.Rollback()
					locked.Add(1)
					if _, err := tx.ExecContext(c, `INSERT INTO log (who) VALUES (?)`, fmt.Sprint("writer ", w)); err != nil {
						return err
					}
					return tx.Commit()
				}()
				cancel()
				if err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	testenv.Await(t, "the writers to write", func() (any, bool) { return locked.Load(), locked.Load() >= 4*writers })

	var ahead []int64
	var total int64
	pctx := context.WithValue(ctx, probeKey{}, true)
	for range probes {
		tx, err := relay.BeginTx(pctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		n := locked.Load() - askedAt
		ahead, total = append(ahead, n), total+n
		if _, err := tx.ExecContext(ctx, `INSERT INTO log (who) VALUES ('relay')`); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		// The relay does other work between its write transactions (fetching,
		// publishing): let the writers take the lock in turn a few times, so that the
		// next turn is asked while they keep it busy, not while the relay is ahead.
		from := locked.Load()
		testenv.Await(t, "the writers to write", func() (any, bool) { return locked.Load(), locked.Load() >= from+writers })
	}
	t.Logf("writer transactions that took the lock while the relay waited, per turn: %v", ahead)
	for i, n := range ahead {
		if n > writers {
			t.Errorf("turn %d: %d writer transactions took the lock while the relay waited; want at most %d (the writers ahead of it, once each)", i+1, n, writers)
		}
	}
	if total == 0 {
		t.Error("no writer transaction was ever ahead of the relay: the test did not contend for the lock")
	}
}

// TestStoreTransactionsTakeTurns: the store's own write transactions (the relay's
// outcomes and leases, the cleaner) wait in the queue behind the application's, on a
// pool of their own too.
func TestStoreTransactionsTakeTurns(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "outbox.db")
	app, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	relayDB, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer relayDB.Close()
	drv, err := New(relayDB, Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testenv.Context(t)
	if _, err := drv.MigrateUp(ctx, 0); err != nil {
		t.Fatal(err)
	}
	q := queueOf(t, app)
	asks := countAsks(q)

	hold, err := app.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := drv.DeletePublished(ctx, 0, 100)
		done <- err
	}()
	testenv.AwaitCond(t, "the cleaner's transaction to queue behind the application's", func() bool { return q.waiters() == 1 })
	if asks() != 2 {
		t.Fatalf("%d turns asked, want 2 (the application's, the cleaner's)", asks())
	}
	if err := hold.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := testenv.AwaitRecv(t, "the cleaner's transaction", done); err != nil {
		t.Fatal(err)
	}
	q.mu.Lock()
	held := q.held
	q.mu.Unlock()
	if held {
		t.Fatal("the write lock is still taken after every transaction ended")
	}
}

// TestWriteTurnGivenBack: a turn is given back however the transaction ends: commit,
// rollback, its context ending (database/sql rolls back from its own goroutine), a
// commit after that, a failed BEGIN. A leaked turn would make the next transaction wait
// BusyTimeout and fail with ErrWriteQueueTimeout.
func TestWriteTurnGivenBack(t *testing.T) {
	t.Parallel()
	db, err := Open(filepath.Join(t.TempDir(), "turns.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := testenv.Context(t)
	next := func(what string) {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatalf("after %s: begin: %v", what, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatalf("after %s: commit: %v", what, err)
		}
	}
	for _, end := range []struct {
		name string
		end  func(cancel context.CancelFunc, tx *sql.Tx) error
	}{
		{"commit", func(_ context.CancelFunc, tx *sql.Tx) error { return tx.Commit() }},
		{"rollback", func(_ context.CancelFunc, tx *sql.Tx) error { return tx.Rollback() }},
		{"context ended", func(cancel context.CancelFunc, _ *sql.Tx) error { cancel(); return nil }},
		{"commit after the context ended", func(cancel context.CancelFunc, tx *sql.Tx) error {
			cancel()
			if err := tx.Commit(); !errors.Is(err, context.Canceled) && !errors.Is(err, sql.ErrTxDone) {
				return fmt.Errorf("commit: %v, want context.Canceled or sql.ErrTxDone", err)
			}
			return nil
		}},
	} {
		c, cancel := context.WithCancel(ctx)
		tx, err := db.BeginTx(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := end.end(cancel, tx); err != nil {
			t.Fatalf("%s: %v", end.name, err)
		}
		cancel()
		next(end.name)
	}

	// A context that ends while the transaction waits for its turn.
	hold, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		tx, err := db.BeginTx(c, nil)
		if err == nil {
			tx.Rollback()
		}
		done <- err
	}()
	q := queueOf(t, db)
	testenv.AwaitCond(t, "a second transaction to wait for its turn", func() bool { return q.waiters() == 1 })
	cancel()
	if err := testenv.AwaitRecv(t, "the waiting transaction to give up", done); !errors.Is(err, context.Canceled) {
		t.Fatalf("waiting transaction: %v, want context.Canceled", err)
	}
	if err := hold.Commit(); err != nil {
		t.Fatal(err)
	}
	next("a transaction gave up waiting")

	// Read-only transactions take no turn: one runs while a writer holds the lock.
	hold, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ro, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var one int
	if err := ro.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatal(err)
	}
	ro.Rollback()
	hold.Rollback()
	next("a read-only transaction")
}
