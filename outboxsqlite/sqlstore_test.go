package outboxsqlite_test

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/outboxkit/outbox/internal/sqlstore/sqlstoretest"
	"github.com/outboxkit/outbox/outboxsqlite"
)

// TestSQLStore runs the suite of the database/sql stores; each test gets a database file
// of its own, and each pool opened on it stands for a process of its own.
func TestSQLStore(t *testing.T) {
	sqlstoretest.Run(t, sqlstoretest.Harness{
		NewDatabase: func(t *testing.T) func(*testing.T) *sql.DB {
			path := filepath.Join(t.TempDir(), "outbox.db")
			return func(t *testing.T) *sql.DB {
				db, err := outboxsqlite.Open(path)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = db.Close() })
				return db
			}
		},
		HourLater: func(c string) string { return "(" + c + " + 3600000000)" },
		NewDriver: func(db *sql.DB, prefix string) (sqlstoretest.Driver, error) {
			d, err := outboxsqlite.New(db, outboxsqlite.Config{Prefix: prefix})
			if err != nil {
				return nil, err
			}
			return d, nil
		},
	})
}
