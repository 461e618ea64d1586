// Package outboxmysql is the MySQL and MariaDB store: it writes messages in the caller's
// database/sql transaction, and it is the relay's outboxdriver.Store and the operator's
// outboxdriver.Admin. It uses github.com/go-sql-driver/mysql (driver name "mysql") and needs
// MySQL 8.0.4+ or MariaDB 10.6+ (SKIP LOCKED and JSON_TABLE), InnoDB, and a utf8mb4
// connection (the driver's default).
//
//	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app")
//	drv, err := outboxmysql.New(db, outboxmysql.Config{})
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
// ordinary InnoDB rows of that transaction, so a rollback, or a rollback to a savepoint
// taken before the write, removes them, and no relay sees them before the commit.
// "Committed" means committed on the server the application writes to, and durable as
// that server makes commits durable: keep innodb_flush_log_at_trx_commit=1 (and
// sync_binlog=1 where the binary log is on), the defaults, or a crash can lose the last
// commits and their events. With asynchronous replication, a failover to a replica that
// had not received the last commits loses them too, events included.
//
// # Database time
//
// Database time is the server's clock, UTC_TIMESTAMP(6), read by the statement that
// decides: leases, retry and DeliverAt due times, retention ages. Relays on any number of
// hosts share it, so their own clocks may disagree without effect. Times are stored as
// DATETIME(6) in UTC and cross the driver as integer microseconds, so the session's
// time_zone and the DSN's parseTime and loc change nothing.
//
// # Guarantees
//
// The outbox's guarantees hold as with PostgreSQL: atomic writes; at-least-once
// publishing, a message marked published only after the broker confirmed it; stable IDs
// and dedup keys; per-key order across retries and relays; any number of relays with
// leases in database time, fenced by tokens; retries with backoff, dead letters and
// replay; retention. How, and what differs:
//
//   - Leases are taken, and the retention cleaner picks rows, with FOR UPDATE SKIP
//     LOCKED, so concurrent relays pass each other by. Recording outcomes locks the
//     messages' rows, then the relay's lease rows in share mode, in one transaction: a
//     takeover (an update of a lease row) waits for it, and one that committed first
//     makes it refuse the outcomes. The store's own transactions run at READ COMMITTED,
//     which keeps InnoDB from locking gaps and the rows it only scanned; the server's
//     binlog_format must therefore be ROW or MIXED (the defaults), not STATEMENT.
//   - seq is AUTO_INCREMENT, assigned at insert, so transactions can commit out of seq
//     order, as with PostgreSQL's identity column: the relay's periodic full fetches
//     find a late commit; it never trusts a cursor over seqs across keys.
//   - Dedup keys are claimed with INSERT ... ON DUPLICATE KEY UPDATE on a unique key:
//     a writer whose key an uncommitted transaction holds waits for it, then skips its
//     message if that one committed or writes it if that one rolled back. InnoDB may
//     still pick a deadlock victim among transactions that also lock the application's
//     rows; that transaction fails (error 1213) and is the application's to retry, as
//     any InnoDB transaction is. The store's own transactions retry deadlocks by
//     themselves.
//   - No notifications: relays poll (RelayConfig.PollInterval, 500 ms by default).
//   - DDL is not transactional: a migration applies statement by statement, every
//     statement idempotent (a column or index already added counts as done), under a named lock (GET_LOCK); one interrupted halfway is
//     finished by running it again.
//   - Status counts published messages exactly while InnoDB estimates the published
//     table below 100,000 rows, and reports that estimate above (on MySQL 8 it can be as
//     old as information_schema_stats_expiry, a day by default).
//
// # Storage
//
// The tables are those of PostgreSQL (pending, published, dead, dedup keys, leases,
// relays, migrations), in the connection's database, with an optional name prefix. Keys
// and dedup keys are VARBINARY, compared byte for byte as in PostgreSQL ("a", "A" and
// "a " are three keys; MySQL's text collations would merge them). Payloads are LONGBLOB;
// headers are JSON text; IDs are BINARY(16). A key's shard is computed by the writer from
// md5, as PostgreSQL computes it. One Write inserts its messages in multi-row INSERT
// statements of at most 5,454 messages and about 2 MiB (below max_allowed_packet), in
// call order; lists of thousands of seqs or keys travel to the server as one JSON array
// expanded by JSON_TABLE, never as thousands of placeholders.
package outboxmysql
