package outboxmysql_test

import (
	"database/sql"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testmysql"
	"github.com/outboxkit/outbox/outboxmysql"
)

// testBundle is one test's outbox: a fresh database, migrated, with a driver and a
// writer on it.
type testBundle struct {
	dsn string
	db  *sql.DB
	drv *outboxmysql.Driver
	w   *outbox.Writer[*sql.Tx]
}

// setup returns a bundle on a fresh, migrated database.
func setup(t testing.TB) *testBundle {
	t.Helper()
	b := open(t, testmysql.NewDatabase(t))
	if _, err := b.drv.MigrateUp(testenv.Context(t), 0); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return b
}

// open opens a pool on dsn (a second pool on one database stands for a second process)
// with a driver and a writer, not migrated.
func open(t testing.TB, dsn string) *testBundle {
	t.Helper()
	db := testmysql.Open(t, dsn)
	drv, err := outboxmysql.New(db, outboxmysql.Config{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter(drv, outbox.WriterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{dsn: dsn, db: db, drv: drv, w: w}
}

// write commits msgs in one transaction.
func (b *testBundle) write(t testing.TB, msgs ...outbox.Message) {
	t.Helper()
	c := testenv.Context(t)
	if err := outbox.SQLTx(b.db, nil)(c, func(tx *sql.Tx) error { return b.w.Write(c, tx, msgs...) }); err != nil {
		t.Fatalf("write: %v", err)
	}
}
