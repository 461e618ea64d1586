package outboxsql_test

import (
	"context"
	"database/sql"
	"log"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxsql"
	"github.com/outboxkit/outbox/outboxtest"
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
	// A relay on this driver (see Example_relay), or on outboxpgx, now publishes the event.
}

// Run the relay on the same *sql.DB: no pgx pool needed. The relay polls for new
// messages every PollInterval (database/sql has no portable LISTEN).
func Example_relay() {
	ctx := context.Background()
	db, err := sql.Open("postgres", "postgres://localhost/app") // lib/pq this time
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	drv, err := outboxsql.New(db, outboxsql.Config{})
	if err != nil {
		log.Fatal(err)
	}
	pub := &outboxtest.Publisher{} // in production a broker publisher: outboxnats, outboxkafka, ...
	relay, err := outbox.NewRelay(drv, pub, outbox.RelayConfig{PollInterval: 200 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := relay.Stop(stopCtx); err != nil {
			log.Print(err)
		}
	}()

	// The operator's view, from the same driver.
	st, err := drv.Status(ctx)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("%d pending, %d dead, %d relays", st.Pending, st.Dead, len(st.Relays))
}
