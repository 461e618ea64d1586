package outboxsqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"io/fs"
	"strings"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/outboxkit/outbox/internal/sqlstore"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// dialect is SQLite for the engine.
var dialect = &sqlstore.Dialect{
	Package:     "outboxsqlite",
	MaxIdentLen: 64, // SQLite has no limit; MySQL's keeps the names portable
	// SQLite's default SQLITE_MAX_VARIABLE_NUMBER since 3.32.
	MaxParams: 32766,
	Quote:     func(s string) string { return `"` + s + `"` },

	// Times are integer microseconds. SQLite's clock has millisecond resolution;
	// rounding keeps a float product such as ...122.9999 from truncating a millisecond.
	Now:        `(CAST(round(unixepoch('now', 'subsec') * 1000) AS INTEGER) * 1000)`,
	AddMicros:  func(t, n string) string { return "(" + t + " + " + n + ")" },
	ToMicros:   func(t string) string { return t },
	FromMicros: func(n string) string { return n },
	Greatest:   "max",

	WaitingKey: "key", // with the partial index "waiting"
	UseIndex:   func(string) string { return "" },

	IntList:    func(p string) string { return "SELECT value FROM json_each(" + p + ")" },
	StringList: func(p string) string { return "SELECT value FROM json_each(" + p + ")" },
	KeySeqList: func(p string) string {
		return "SELECT value ->> 0 AS k, value ->> 1 AS s FROM json_each(" + p + ")"
	},

	OnConflictIgnore: func(col string) string { return " ON CONFLICT (" + col + ") DO NOTHING" },
	OnConflictUpdate: func(col string) string { return " ON CONFLICT (" + col + ") DO UPDATE SET " },

	// No row locks: every write transaction of the store begins IMMEDIATE, holding the
	// database's single write lock until it commits.
	BeginWrite:        beginImmediate,
	SnapshotIsolation: sql.LevelDefault,

	IsDuplicate: isDuplicate,
	Undefined:   isUndefined,

	Migrations: sqlstore.Migrations{
		FS:          mustSub(migrationFiles, "migrations"),
		Table:       `CREATE TABLE IF NOT EXISTS %s (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL) STRICT`,
		TableExists: `SELECT COUNT(*) FROM sqlite_schema WHERE type = 'table' AND name = ?`,
		Locked: func(ctx context.Context, db *sql.DB, _ string, fn func(sqlstore.Querier) error) error {
			// DDL is transactional in SQLite: a migration applies whole or not at all, and
			// the IMMEDIATE transaction is the lock.
			tx, err := beginImmediate(ctx, db)
			if err != nil {
				return err
			}
			if err := fn(tx); err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		},
		ScriptBegin: "BEGIN IMMEDIATE;\n",
		ScriptEnd:   "COMMIT;\n",
	},
}

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err)
	}
	return sub
}

// immediateTx is a transaction begun with BEGIN IMMEDIATE on a connection of its own.
//
// database/sql begins transactions the way the DSN says (_txlock), and a deferred one
// that reads, then writes, fails with SQLITE_BUSY when another connection wrote in
// between, however long busy_timeout is. The store's own transactions all read, then
// write, so they take the write lock up front, whatever DSN the *sql.DB was opened with.
// On a pool from Open they first take their turn in the file's write queue, as the
// application's transactions do, so the relay and the cleaner are served in the order
// they asked, not after every eager writer.
type immediateTx struct {
	conn *sql.Conn
}

func beginImmediate(ctx context.Context, db *sql.DB) (sqlstore.Tx, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	err = conn.Raw(func(dc any) error {
		if qc, ok := dc.(*queuedConn); ok {
			return qc.takeTurn(ctx)
		}
		return nil
	})
	if err != nil {
		conn.Close()
		return nil, err
	}
	t := &immediateTx{conn: conn}
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

func (t *immediateTx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return t.conn.ExecContext(ctx, q, args...)
}

func (t *immediateTx) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return t.conn.QueryContext(ctx, q, args...)
}

func (t *immediateTx) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return t.conn.QueryRowContext(ctx, q, args...)
}

// Commit commits, and rolls back if the commit failed. It runs whatever the state of the
// context the statements ran under: ending the transaction is never optional.
func (t *immediateTx) Commit() error {
	if _, err := t.conn.ExecContext(context.Background(), "COMMIT"); err != nil {
		_ = t.Rollback()
		return err
	}
	t.close()
	return nil
}

// Rollback rolls back. A connection whose ROLLBACK failed is discarded rather than
// handed back to the pool inside a transaction.
func (t *immediateTx) Rollback() error {
	_, err := t.conn.ExecContext(context.Background(), "ROLLBACK")
	if err != nil {
		// Closing the connection ends the transaction and gives its turn back.
		_ = t.conn.Raw(func(any) error { return driver.ErrBadConn })
	}
	t.close()
	return err
}

// close gives the connection's turn in the write queue back, if it holds one, and
// returns the connection to the pool.
func (t *immediateTx) close() {
	_ = t.conn.Raw(func(dc any) error {
		if qc, ok := dc.(*queuedConn); ok {
			qc.giveTurnBack()
		}
		return nil
	})
	_ = t.conn.Close()
}

// isDuplicate reports a primary-key or unique violation.
// isUndefined: SQLite reports a missing column with its generic error code, so the
// message tells ("no such column: x" in a query, "table t has no column named x" in an
// INSERT's column list).
func isUndefined(err error) bool {
	var e *sqlite.Error
	if !errors.As(err, &e) || e.Code() != sqlite3.SQLITE_ERROR {
		return false
	}
	msg := e.Error()
	return strings.Contains(msg, "no such column") || strings.Contains(msg, "has no column named")
}

func isDuplicate(err error) bool {
	var e *sqlite.Error
	return errors.As(err, &e) && (e.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY || e.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE)
}
