package outboxsql_test

import (
	"context"
	"database/sql"
	"log"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxsql"
)

// Write an event in the same database/sql transaction as the business change. Any
// PostgreSQL driver works; here pgx's stdlib, registered as "pgx".
func Example() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	drv, err := outboxsql.New(db, outboxsql.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := drv.MigrateUp(ctx, 0); err != nil {
		log.Fatal(err)
	}
	w, err := outbox.NewWriter(drv, outbox.WriterConfig{})
	if err != nil {
		log.Fatal(err)
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `UPDATE orders SET state = 'placed' WHERE id = $1`, "o-1"); err != nil {
		log.Fatal(err)
	}
	err = w.Write(ctx, tx, outbox.Message{Topic: "orders", Key: "o-1", EventType: "order.placed", Payload: []byte(`{"id":"o-1"}`)})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	// A relay running outboxpgx on the same database now publishes the event.
}
