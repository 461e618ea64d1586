package outboxpgx_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxtest"
)

// Example writes an event in the same transaction as the business change, and a relay
// publishes it once the transaction commits. The in-memory publisher of outboxtest
// stands in for a broker; in production use outboxnats (or the `outbox relay` daemon).
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.URL()) // your database
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	_, _ = pool.Exec(ctx, `DROP SCHEMA IF EXISTS outbox_example CASCADE`)
	defer pool.Exec(ctx, `DROP SCHEMA IF EXISTS outbox_example CASCADE`)

	drv, err := outboxpgx.New(pool, outboxpgx.Config{Schema: "outbox_example"})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := drv.MigrateUp(ctx, 0); err != nil { // or `outbox migrate up`
		log.Fatal(err)
	}
	w, err := outbox.NewWriter(drv, outbox.WriterConfig{})
	if err != nil {
		log.Fatal(err)
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... insert the order itself here, in tx ...
		return w.Write(ctx, tx, outbox.Message{
			Topic:         "orders",
			Key:           "order-42", // events of one order keep their order
			AggregateType: "order",
			EventType:     "order.placed",
			Payload:       []byte(`{"id":"order-42","total":1999}`),
		})
	})
	if err != nil {
		log.Fatal(err)
	}

	pub := &outboxtest.Publisher{}
	relay, err := outbox.NewRelay(drv, pub, outbox.RelayConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil {
		log.Fatal(err)
	}
	// A bound on a hang, not on how long publishing takes: generous for a loaded machine.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	msgs, err := pub.WaitFor(wctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Stop(wctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println(msgs[0].Topic, msgs[0].EventType, string(msgs[0].Payload))
	// Output: orders order.placed {"id":"order-42","total":1999}
}
