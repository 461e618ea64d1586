package outboxmysql

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outbox/internal/sqlstore"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// epoch is the zero of the integer microseconds times cross the driver as: a DATETIME
// literal, so that the arithmetic stays DATETIME(6) (a string would make it text).
const epoch = "TIMESTAMP'1970-01-01 00:00:00'"

// dialect is MySQL and MariaDB for the engine.
var dialect = &sqlstore.Dialect{
	Package:     "outboxmysql",
	MaxIdentLen: 64,
	// The protocol counts a statement's placeholders in 16 bits (65,535); stay below.
	MaxParams: 60_000,
	Quote:     func(s string) string { return "`" + s + "`" },

	Now:        "UTC_TIMESTAMP(6)",
	AddMicros:  func(t, n string) string { return "(" + t + " + INTERVAL (" + n + ") MICROSECOND)" },
	ToMicros:   func(t string) string { return "TIMESTAMPDIFF(MICROSECOND, " + epoch + ", " + t + ")" },
	FromMicros: func(n string) string { return "TIMESTAMPADD(MICROSECOND, " + n + ", " + epoch + ")" },
	Greatest:   "GREATEST",

	WaitingKey: "waiting_key", // a generated column: MySQL has no partial indexes
	UseIndex:   func(index string) string { return " FORCE INDEX (" + index + ")" },

	IntList: func(p string) string {
		return "SELECT j.v FROM JSON_TABLE(" + p + ", '$[*]' COLUMNS (v BIGINT PATH '$')) AS j"
	},
	StringList: func(p string) string {
		return "SELECT j.v FROM JSON_TABLE(" + p + ", '$[*]' COLUMNS (v VARBINARY(255) PATH '$')) AS j"
	},

	// ON DUPLICATE KEY UPDATE with a no-op assignment, not INSERT IGNORE: IGNORE would also
	// turn real errors (a value too long, in a non-strict sql_mode) into warnings, and
	// takes a shared lock on a duplicate, which lets two transactions waiting for a third's
	// key deadlock when it rolls back; this takes the exclusive lock, so they queue.
	OnConflictIgnore: func(col string) string { return " ON DUPLICATE KEY UPDATE " + col + " = " + col },
	OnConflictUpdate: func(string) string { return " ON DUPLICATE KEY UPDATE " },

	ForUpdate:           " FOR UPDATE",
	ForShare:            " LOCK IN SHARE MODE", // MySQL 8 and MariaDB both know this spelling
	ForUpdateSkipLocked: " FOR UPDATE SKIP LOCKED",

	BeginWrite: func(ctx context.Context, db *sql.DB) (sqlstore.Tx, error) {
		// READ COMMITTED: InnoDB then locks only the rows a statement changes or reads
		// FOR UPDATE/SHARE, and releases the rows it scanned but did not keep, instead of
		// holding next-key locks on everything scanned until commit.
		return db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	},
	SnapshotIsolation: sql.LevelRepeatableRead,
	Retry:             isDeadlock,

	PublishedEstimate: `SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`,

	IsDuplicate: isDuplicate,
	Undefined:   isUndefined,

	Migrations: sqlstore.Migrations{
		FS:          mustSub(migrationFiles, "migrations"),
		Table:       "CREATE TABLE IF NOT EXISTS %s (version INT NOT NULL PRIMARY KEY, name VARCHAR(255) NOT NULL, applied_at DATETIME(6) NOT NULL) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4",
		TableExists: `SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`,
		Locked:      withMigrationLock,
		Redone:      isRedone,
	},
}

// isDeadlock reports whether err made InnoDB roll the transaction back as a deadlock
// victim: running it again is the documented cure.
func isDeadlock(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1213
}

// migrationLockWait is how long MigrateUp and MigrateDown wait for another migration of
// the same outbox to finish.
const migrationLockWait = 60

// withMigrationLock runs fn on one connection holding a named lock (GET_LOCK) of the
// outbox: MySQL DDL commits as it goes, so a transaction cannot serialize migrators.
// The lock belongs to the session and is released when fn returns or the connection
// drops.
func withMigrationLock(ctx context.Context, db *sql.DB, name string, fn func(sqlstore.Querier) error) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	// Lock names are at most 64 characters: hash the database and outbox names.
	lock := `CONCAT('outbox_migrate_', MD5(CONCAT(DATABASE(), '.', ?)))`
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(`+lock+`, ?)`, name, migrationLockWait).Scan(&got); err != nil {
		return fmt.Errorf("take the migration lock: %w", err)
	}
	if got.Int64 != 1 {
		return fmt.Errorf("take the migration lock: another migration of this outbox has held it for %ds", migrationLockWait)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), `DO RELEASE_LOCK(`+lock+`)`, name)
	return fn(conn)
}

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err)
	}
	return sub
}

// isDuplicate reports a duplicate-key error (ER_DUP_ENTRY).
func isDuplicate(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1062
}

// isRedone: ER_DUP_FIELDNAME (a column that exists), ER_DUP_KEYNAME (an index that
// exists), ER_CANT_DROP_FIELD_OR_KEY (a column or index that is gone).
func isRedone(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1060 || me.Number == 1061 || me.Number == 1091)
}

// isUndefined: ER_BAD_FIELD_ERROR ("Unknown column"), ER_KEY_DOES_NOT_EXIST (an index
// hint naming an index that is not there).
func isUndefined(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1054 || me.Number == 1176)
}
