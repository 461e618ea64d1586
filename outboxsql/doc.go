// Package outboxsql writes outbox messages in a database/sql transaction on PostgreSQL,
// with any database/sql driver: pgx's stdlib ("pgx"), lib/pq ("postgres"), or the
// *sql.DB under sqlx, GORM, ent or bun.
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
// This package only writes. The relay, which reads the outbox and publishes it, runs on
// pgx: point an outboxpgx.Driver with the same Schema and Prefix at the same database.
// The rows are the same whichever package wrote them, and the migrations here and in
// outboxpgx are the same migrations, recorded in the same table.
package outboxsql
