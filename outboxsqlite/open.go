package outboxsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	_ "modernc.org/sqlite" // database/sql driver "sqlite"
)

// BusyTimeout is how long a connection opened by Open waits for SQLite's write lock
// before a statement fails with SQLITE_BUSY. Writers queue on that one lock; ten seconds
// is far longer than any outbox transaction holds it, and short enough that a writer
// stuck behind a transaction left open by mistake gets an error instead of hanging.
const BusyTimeout = 10 * time.Second

// MaxOpenConns is the size of the pool Open returns. Readers (the relay's fetches,
// Status) run in parallel under WAL; writers wait for the write lock in SQLite, not in
// the pool, so a pool a little larger than the number of concurrent transactions is
// enough. Change it with db.SetMaxOpenConns.
const MaxOpenConns = 16

// Open opens (creating it if missing) the SQLite database file at path for an outbox and
// the application that shares it, and returns a pool of connections to it. Every
// connection is set up with:
//
//   - journal_mode=WAL: readers do not block the writer, nor the writer readers;
//   - synchronous=FULL: a commit is on disk (the WAL fsynced) before it returns, so a
//     power cut loses no committed transaction. NORMAL would fsync only at checkpoints
//     and could lose the last transactions on power loss; that is a lost event for an
//     outbox, so FULL it is. It costs one fsync per commit;
//   - busy_timeout (BusyTimeout): a writer waits for the lock instead of failing;
//   - foreign_keys=ON, which applications usually want and SQLite leaves off;
//   - _txlock=immediate: every read-write transaction (db.BeginTx) takes the write lock
//     when it begins. SQLite has one writer at a time, and a transaction that begins
//     deferred, reads, then writes, fails with SQLITE_BUSY if another connection wrote
//     meanwhile, whatever the busy timeout; beginning immediate makes it wait its turn
//     instead. Read-only transactions (sql.TxOptions{ReadOnly: true}) still begin
//     deferred and run in parallel.
//
// path must name a file on a local disk: WAL needs shared memory between the processes
// that open the file, which network file systems do not give, and Open fails if the
// database cannot be put in WAL mode. An in-memory database (":memory:") is refused: each
// connection of a pool would get a database of its own.
//
// Open is a convenience: a *sql.DB opened otherwise works too, provided it uses the
// "sqlite" driver (modernc.org/sqlite), and should set the same options (the store's own
// transactions begin immediate whatever the DSN says; the application's follow it).
func Open(path string) (*sql.DB, error) {
	if path == "" || strings.HasPrefix(path, ":memory:") || strings.Contains(path, "mode=memory") {
		return nil, errors.New("outboxsqlite: Open needs the path of a database file (an in-memory database is one per connection)")
	}
	dsn := "file:" + strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path) +
		fmt.Sprintf("?_pragma=busy_timeout(%d)", BusyTimeout.Milliseconds()) +
		"&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=foreign_keys(1)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("outboxsqlite: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(MaxOpenConns)
	db.SetMaxIdleConns(MaxOpenConns) // a new connection re-reads the schema: keep them
	ctx, cancel := context.WithTimeout(context.Background(), BusyTimeout+5*time.Second)
	defer cancel()
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		db.Close()
		return nil, fmt.Errorf("outboxsqlite: open %s: %w", path, err)
	}
	if !strings.EqualFold(mode, "wal") {
		db.Close()
		return nil, fmt.Errorf("outboxsqlite: open %s: the database is in journal mode %q, not WAL (is it on a network file system?)", path, mode)
	}
	return db, nil
}
