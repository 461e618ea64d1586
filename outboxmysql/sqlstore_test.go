package outboxmysql_test

import (
	"database/sql"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/sqlstore/sqlstoretest"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testmysql"
	"github.com/outboxkit/outbox/outboxmysql"
)

// TestSQLStore runs the suite of the database/sql stores; each test gets a database of its
// own, and each pool opened on it stands for a process of its own.
func TestSQLStore(t *testing.T) {
	sqlstoretest.Run(t, sqlstoretest.Harness{
		NewDatabase: func(t *testing.T) func(*testing.T) *sql.DB {
			dsn := testmysql.NewDatabase(t)
			return func(t *testing.T) *sql.DB { return testmysql.Open(t, dsn) }
		},
		NewDriver: func(db *sql.DB, prefix string) (sqlstoretest.Driver, error) {
			d, err := outboxmysql.New(db, outboxmysql.Config{Prefix: prefix})
			if err != nil {
				return nil, err
			}
			return d, nil
		},
		WaitBlocked: waitLockWait,
		HourLater:   func(c string) string { return "(" + c + " + INTERVAL 1 HOUR)" },
	})
}

// waitLockWait waits until a transaction on db's database waits for a row lock.
func waitLockWait(t *testing.T, db *sql.DB) {
	t.Helper()
	ctx := testenv.Context(t) // a bound on a hang: one event awaited
	for {
		var n int
		err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.INNODB_TRX t
JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
WHERE t.trx_state = 'LOCK WAIT' AND p.DB = DATABASE()`).Scan(&n)
		if err != nil {
			t.Fatalf("waiting for a transaction to wait for the dedup key's lock: %v", err)
		}
		if n > 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no transaction started waiting for the dedup key's lock within %v", testenv.Stall())
		// InnoDB refreshes information_schema.INNODB_TRX only when it was last read more
		// than 100 ms ago: polling faster would read the same stale rows forever.
		case <-time.After(200 * time.Millisecond):
		}
	}
}
