// Package outboxsqlite is the SQLite store: it writes messages in the caller's
// database/sql transaction, and it is the relay's outboxdriver.Store and the operator's
// outboxdriver.Admin. It uses modernc.org/sqlite (driver name "sqlite"): pure Go, no cgo.
//
//	db, err := outboxsqlite.Open("app.db") // WAL, synchronous=FULL, immediate transactions
//	drv, err := outboxsqlite.New(db, outboxsqlite.Config{})
//	_, err = drv.MigrateUp(ctx, 0) // or apply drv.MigrationSQL() with your own tool
//	w, err := outbox.NewWriter(drv, outbox.WriterConfig{})
//
//	tx, err := db.BeginTx(ctx, nil)
//	defer tx.Rollback()
//	// ... the business writes, in tx ...
//	err = w.Write(ctx, tx, outbox.Message{Topic: "orders", Key: orderID, Payload: body})
//	err = tx.Commit()
//
//	relay, err := outbox.NewRelay(drv, publisher, outbox.RelayConfig{})
//
// # Committed
//
// A message exists if and only if the transaction that wrote it commits: its rows are
// ordinary rows of that transaction, so a rollback, or a rollback to a savepoint taken
// before the write, removes them, and no relay sees them before the commit. With the
// settings of Open (journal_mode=WAL, synchronous=FULL) a commit that returned is on
// disk: a crash of the process or of the machine, power cut included, loses no committed
// message. A database opened otherwise must keep synchronous=FULL to say the same: in WAL
// mode, NORMAL is safe against a crash of the process but can lose the last commits on
// power loss, and a lost commit is a lost event.
//
// # Database time
//
// SQLite has no server, so "database time" is the clock of the machine that runs the
// statement, read by SQLite itself (unixepoch('now', 'subsec'), millisecond resolution)
// in the statement that decides: leases, retry and DeliverAt due times, retention ages.
// Every process that opens the file runs on the machine that holds it (WAL needs memory
// shared between them, which network file systems do not give), so every relay of a
// SQLite outbox reads the same clock, and leases measured in it are as sound as
// PostgreSQL's. A step of that clock moves every lease and due time at once: forward, and
// leases may expire early, another relay on the machine may take the shards, and the old
// owner's outcomes are refused (fencing), at the cost of some duplicates; backward, and
// leases and retries last longer by the step.
//
// # Guarantees
//
// The outbox's guarantees hold as with PostgreSQL: atomic writes; at-least-once
// publishing, a message marked published only after the broker confirmed it; stable IDs
// and dedup keys; per-key order across retries and relays; any number of relays (in one
// process or several) with leases fenced by tokens, so a relay that lost its lease cannot
// record anything; retries with backoff, dead letters and replay; retention. What differs,
// and why:
//
//   - One writer at a time. SQLite has one write lock per database: writers, the relays'
//     outcome and lease transactions and the retention cleaner take turns, each commit
//     costing an fsync. SQLite's own wait for that lock is not fair (eager writers keep
//     it and the relay waits until they pause), so the write transactions of pools from
//     Open queue first come, first served within the process (see Open); across
//     processes, SQLite's busy handler is all there is. Because inserts commit in seq
//     order, the commit-order trap of PostgreSQL and MySQL (a lower seq committing after
//     a higher one) cannot happen here.
//   - Transactions must begin IMMEDIATE. A deferred transaction that reads, then writes,
//     fails with SQLITE_BUSY when another connection wrote in between, whatever the busy
//     timeout. The store's own transactions always begin IMMEDIATE; the application's
//     follow the DSN, and Open sets _txlock=immediate. A transaction that waits longer
//     than the busy timeout (BusyTimeout with Open) for the lock fails with SQLITE_BUSY;
//     the relay retries such failures on its own.
//   - No notifications. SQLite cannot wake another process, so relays poll
//     (RelayConfig.PollInterval, 500 ms by default): that is the added latency.
//   - DeadFilter.ErrorContains folds the case of ASCII letters only.
//   - Status counts published messages exactly, reading an index of the published table.
//
// # Storage
//
// The tables are those of PostgreSQL (pending, published, dead, dedup keys, leases,
// relays, migrations), as STRICT tables. Times are integers: microseconds since the Unix
// epoch; read one with datetime(created_at / 1e6, 'unixepoch', 'subsec'). IDs are 16-byte
// blobs. A key's shard is computed by the writer from md5, as PostgreSQL computes it.
package outboxsqlite
