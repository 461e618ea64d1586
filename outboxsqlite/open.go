package outboxsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"modernc.org/sqlite" // also registers the database/sql driver "sqlite"
)

// BusyTimeout is how long a connection opened by Open waits for SQLite's write lock
// before a statement fails with SQLITE_BUSY. Writers queue on that one lock; ten seconds
// is far longer than any outbox transaction holds it, and short enough that a writer
// stuck behind a transaction left open by mistake gets an error instead of hanging.
const BusyTimeout = 10 * time.Second

// MaxOpenConns is the size of the pool Open returns. Readers (the relay's fetches,
// Status) run in parallel under WAL; writers wait for their turn in the write queue
// holding a connection each, so the pool should be larger than the number of
// goroutines that write at once, plus the relay's three: beyond that, database/sql
// hands a freed connection to a random waiter, which is fair on average but not first
// come, first served. Change it with db.SetMaxOpenConns.
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
// # Fair turns at the write lock
//
// SQLite's own wait for the write lock is not fair: a waiting connection sleeps 1, 2,
// 5, ... up to 100 ms between tries, and a writer that has just committed and begins
// again finds the lock free before any sleeper wakes. A few application goroutines
// writing in a loop would keep the lock among themselves, and the relay's transactions
// (recording what was published, renewing leases) and the retention cleaner would wait
// until they pause: events published seconds late. So every read-write transaction of
// a pool from Open first takes a turn in a first-come, first-served queue of the
// process, then begins IMMEDIATE, and gives the turn back when it commits or rolls back:
// a transaction that asks while k others wait begins after at most k+1 transactions,
// whoever else keeps writing. The queue covers, per database file (all the pools opened
// with Open on one file in a process share it):
//
//   - the application's transactions: db.BeginTx and db.Begin, outbox.SQLTx, and those
//     of a *sql.Conn from the pool;
//   - the store's own (Driver: the relay's outcomes and leases, the cleaner, dead-letter
//     tooling, migrations).
//
// It does not cover statements run outside a transaction (db.ExecContext), read-only
// transactions that write anyway, transactions begun by executing BEGIN yourself, pools
// opened otherwise, nor other processes: those wait for the lock in SQLite's busy
// handler, as before, and stay correct (the relay's leases are fenced) but get no
// ordering. Across processes there is no fairness beyond that busy handler: give one
// process the writes to a file where latency matters. A transaction that waits
// BusyTimeout for its turn fails with ErrWriteQueueTimeout, as one waiting that long in
// SQLite fails with SQLITE_BUSY. The turn is given back exactly once per transaction,
// also when its context ends first (database/sql rolls it back) or when database/sql
// discards the connection. (*sql.Conn).Raw sees a wrapper of the modernc.org/sqlite
// connection; its Unwrap method returns the connection itself.
//
// path must name a file on a local disk: WAL needs shared memory between the processes
// that open the file, which network file systems do not give, and Open fails if the
// database cannot be put in WAL mode. An in-memory database (":memory:") is refused: each
// connection of a pool would get a database of its own.
//
// Open is a convenience: a *sql.DB opened otherwise works too, provided it uses the
// "sqlite" driver (modernc.org/sqlite), and should set the same options (the store's own
// transactions begin immediate whatever the DSN says; the application's follow it), but
// it gets no write queue.
func Open(path string) (*sql.DB, error) {
	if path == "" || strings.HasPrefix(path, ":memory:") || strings.Contains(path, "mode=memory") {
		return nil, errors.New("outboxsqlite: Open needs the path of a database file (an in-memory database is one per connection)")
	}
	dsn := "file:" + strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path) +
		fmt.Sprintf("?_pragma=busy_timeout(%d)", BusyTimeout.Milliseconds()) +
		"&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=foreign_keys(1)&_txlock=immediate"
	base, err := sqlite.NewConnector(dsn)
	if err != nil {
		return nil, fmt.Errorf("outboxsqlite: open %s: %w", path, err)
	}
	connector := &queuedConnector{base: base}
	db := sql.OpenDB(connector)
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
	// The file exists now: find its queue.
	if connector.q, connector.drop, err = queueFor(path); err != nil {
		db.Close()
		return nil, fmt.Errorf("outboxsqlite: open %s: %w", path, err)
	}
	return db, nil
}
