package outboxsqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxsqlite"
	"github.com/outboxkit/outbox/outboxtest"
)

func TestOpenSettings(t *testing.T) {
	t.Parallel()
	// A path that needs escaping in a file: URI.
	path := filepath.Join(t.TempDir(), "my outbox?#%.db")
	db, err := outboxsqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	c := testenv.Context(t)
	for pragma, want := range map[string]string{
		"journal_mode": "wal",
		"synchronous":  "2", // FULL
		"foreign_keys": "1",
		"busy_timeout": fmt.Sprint(outboxsqlite.BusyTimeout.Milliseconds()),
	} {
		var got string
		if err := db.QueryRowContext(c, "PRAGMA "+pragma).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("PRAGMA %s = %s, want %s", pragma, got, want)
		}
	}
	var file string
	if err := db.QueryRowContext(c, "SELECT file FROM pragma_database_list WHERE name = 'main'").Scan(&file); err != nil {
		t.Fatal(err)
	}
	if file != path {
		t.Errorf("opened %q, want %q", file, path)
	}
	for _, bad := range []string{"", ":memory:", "file:x?mode=memory"} {
		if db, err := outboxsqlite.Open(bad); err == nil {
			db.Close()
			t.Errorf("Open(%q) succeeded; want an error: a memory database is one per connection", bad)
		}
	}
}

// TestForeignPool runs a relay on a *sql.DB opened without Open's settings (its
// transactions begin deferred) while writers write through another pool: the
// store's own transactions begin IMMEDIATE whatever the DSN says, so they queue for the
// write lock instead of failing with SQLITE_BUSY.
func TestForeignPool(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "outbox.db")
	plain, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	drv, err := outboxsqlite.New(plain, outboxsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := testenv.Context(t)
	if _, err := drv.MigrateUp(c, 0); err != nil {
		t.Fatal(err)
	}
	writers := open(t, path)
	pub := &outboxtest.Publisher{}
	r, err := outbox.NewRelay(drv, pub, outbox.RelayConfig{ID: "plain", PollInterval: 10 * time.Millisecond, Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(testenv.Context(t)) }) // on a failure below; stopping twice is safe
	const n, each = 8, 25
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() {
			for i := range each {
				if err := writers.tryWrite(outbox.Message{Topic: "t", Key: fmt.Sprint("w", w), Payload: fmt.Appendf(nil, `{"n":%d}`, i)}); err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	pub.Await(t, n*each)
	if err := r.Stop(testenv.Context(t)); err != nil {
		t.Errorf("stop relay: %v", err)
	}
}

// TestReadThenWriteTransactions runs application transactions that read, then write the
// outbox, many at once, on a pool from Open: they begin IMMEDIATE (_txlock), so they take
// turns. Begun deferred, some would fail with SQLITE_BUSY, since a transaction that read
// a snapshot cannot write after another connection wrote.
func TestReadThenWriteTransactions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := testenv.Context(t)
	const n = 12
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			errs <- outbox.SQLTx(b.db, nil)(c, func(tx *sql.Tx) error {
				var pending int
				if err := tx.QueryRowContext(c, `SELECT COUNT(*) FROM outbox`).Scan(&pending); err != nil {
					return err
				}
				return b.w.Write(c, tx, outbox.Message{Topic: "t", Key: fmt.Sprint("k", i), Payload: fmt.Appendf(nil, `{"seen":%d}`, pending)})
			})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("read-then-write transaction: %v", err)
		}
	}
	if st, err := b.drv.Status(c); err != nil || st.Pending != n {
		t.Fatalf("status %+v, %v; want %d pending", st, err, n)
	}
}
