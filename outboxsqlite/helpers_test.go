package outboxsqlite_test

import (
	"database/sql"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxsqlite"
)

// testBundle is one test's outbox: a fresh database file, migrated, with a driver and a
// writer on it.
type testBundle struct {
	path string
	db   *sql.DB
	drv  *outboxsqlite.Driver
	w    *outbox.Writer[*sql.Tx]
}

// setup returns a bundle on a fresh, migrated database file.
func setup(t testing.TB) *testBundle {
	t.Helper()
	b := open(t, filepath.Join(t.TempDir(), "outbox.db"))
	if _, err := b.drv.MigrateUp(testenv.Context(t), 0); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return b
}

// open opens path (a second open of one file stands for a second process) with a driver
// and a writer, not migrated.
func open(t testing.TB, path string) *testBundle {
	t.Helper()
	db, err := outboxsqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	drv, err := outboxsqlite.New(db, outboxsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter(drv, outbox.WriterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{path: path, db: db, drv: drv, w: w}
}

// write commits msgs in one transaction.
func (b *testBundle) write(t testing.TB, msgs ...outbox.Message) {
	t.Helper()
	if err := b.tryWrite(msgs...); err != nil {
		t.Fatalf("write: %v", err)
	}
}

// tryWrite commits msgs in one transaction and returns what failed: for goroutines other
// than the test's, which must not call t.Fatal.
func (b *testBundle) tryWrite(msgs ...outbox.Message) error {
	c, cancel := testenv.CallContext()
	defer cancel()
	return outbox.SQLTx(b.db, nil)(c, func(tx *sql.Tx) error { return b.w.Write(c, tx, msgs...) })
}

func logger() *slog.Logger {
	if os.Getenv("OUTBOX_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
