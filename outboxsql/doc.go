// Package outboxsql is the PostgreSQL driver for database/sql: it writes outbox messages
// in the caller's *sql.Tx and is the relay's store and the operator's, with any
// database/sql driver: pgx's stdlib ("pgx"), lib/pq ("postgres"), or the *sql.DB under
// sqlx, GORM, ent or bun. An application on database/sql runs the whole outbox without
// pgx.
//
// A message exists if and only if the caller's transaction commits: the rows are
// ordinary rows of that transaction, so a rollback, or a rollback to a savepoint taken
// before the write, removes them, and no relay sees them before commit.
//
//	db, err := sql.Open("pgx", dsn) // import _ "github.com/jackc/pgx/v5/stdlib"
//	drv, err := outboxsql.New(db, outboxsql.Config{})
//	_, err = drv.MigrateUp(ctx, 0) // or apply drv.MigrationSQL() with your own tool
//	w, err := outbox.NewWriter(drv, outbox.WriterConfig{})
//
//	tx, err := db.BeginTx(ctx, nil)
//	defer tx.Rollback()
//	// ... the business writes, in tx ...
//	err = w.Write(ctx, tx, outbox.Message{Topic: "orders", Key: orderID, Payload: body})
//	err = tx.Commit()
//
// Libraries built on database/sql hand out the *sql.Tx: sqlx's *sqlx.Tx and bun's bun.Tx
// embed it (tx.Tx), and a GORM transaction holds it in tx.Statement.ConnPool.
//
// # Writes
//
// One Write inserts its messages with multi-row INSERT statements of at most 6,000
// messages each (PostgreSQL caps a statement at 65,535 parameters), in call order, so
// messages of one key are published in the order they were written. Dedup keys and the
// errors behave as described on outbox.Writer: a taken dedup key skips the message and
// Write returns an *outbox.DuplicateError while the transaction stays usable.
//
// Every parameter is a string, []byte, time.Time or nil, so no driver-specific type is
// needed. A driver that prepares and caches statements (pgx's stdlib does by default)
// keeps one prepared statement per batch size it has seen on each connection.
//
// # Relay
//
// The Driver is an outboxdriver.Store, so a relay runs on the same *sql.DB:
//
//	relay, err := outbox.NewRelay(drv, publisher, outbox.RelayConfig{})
//	err = relay.Start(ctx)
//	defer relay.Stop(ctx)
//
// It runs the same statements as outboxpgx (shard leases and their takeover in database
// time, fenced outcomes, per-key order, retries, dead letters), and passes the same
// conformance suite with pgx's stdlib and with lib/pq. Array parameters travel as
// PostgreSQL array literals, which every driver binds as a string, so no driver-specific
// type such as pq.Array is needed. Each fetch and each batch of outcomes runs in a short
// transaction of its own that turns JIT compilation off for that statement only (SET
// LOCAL): four round trips where outboxpgx needs one, and no setting left on the pool's
// connections.
//
// Relays on outboxsql and outboxpgx can share one outbox: the rows, the migrations
// (recorded in the same table) and the statements are the same.
//
// # Wake-up latency
//
// database/sql has no portable LISTEN, so the Driver does not implement outboxdriver.Listener
// and a relay on it finds new messages by polling: once it has caught up, a message
// committed just after a poll waits up to RelayConfig.PollInterval (500ms by default,
// half that on average) before it is fetched. A relay working through a backlog fetches
// again as soon as it has room, so polling delays only what arrives while it is caught
// up. Lower PollInterval for less latency, at the cost of one cheap, indexed fetch per
// interval per relay. For wake-ups at commit, run the relay on outboxpgx (LISTEN/NOTIFY
// on a pgx pool) with the same Schema and Prefix while the application keeps writing
// through this package: every write, and every DeadReplay, sends the notification,
// whichever package made it.
//
// # Operations
//
// The Driver is an outboxdriver.Admin too: Status and the dead-letter calls (DeadList,
// DeadCount, DeadReplay, DeadPurge, DeadPurgeAll) behave as outboxpgx's.
package outboxsql
