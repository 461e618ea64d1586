// Command shipping is the consumer of docs/tutorial.md: it reads order.placed events from
// NATS JetStream and ships each order exactly once, with the inbox.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxnats"
	"github.com/outboxkit/outbox/outboxpgx"
)

func main() {
	dbURL := flag.String("database-url", "postgres://postgres@127.0.0.1:5432/shop?sslmode=disable", "the consumer's database")
	natsURL := flag.String("nats-url", nats.DefaultURL, "the NATS server")
	durable := flag.String("durable", "shipping", "the JetStream durable consumer to read with")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// No unique constraint: a second shipment of one order would show up as a second row.
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS shipments (
		id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		order_id   text NOT NULL,
		shipped_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		log.Fatal(err)
	}

	// The inbox table (outbox_inbox) comes with `outbox migrate up` too.
	drv, err := outboxpgx.New(pool, outboxpgx.Config{})
	if err != nil {
		log.Fatal(err)
	}
	inbox, err := outbox.NewInbox[pgx.Tx](drv, outbox.InboxConfig{Consumer: "shipping"})
	if err != nil {
		log.Fatal(err)
	}
	handler := func(ctx context.Context, d *outbox.Delivery) error {
		if d.EventType != "order.placed" {
			return nil // not ours: ack it and move on
		}
		var order struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(d.Payload, &order); err != nil {
			return outbox.Permanent(err) // retrying cannot fix a malformed event
		}
		// One transaction for the inbox record and the shipment: both commit, or neither.
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			fresh, err := inbox.Claim(ctx, tx, d.ID) // first thing in the transaction
			if err != nil {
				return err
			}
			if !fresh {
				log.Printf("order %s: event %s already handled, skipped", order.ID, d.ID)
				return nil // acked, nothing done twice
			}
			if _, err := tx.Exec(ctx, `INSERT INTO shipments (order_id) VALUES ($1)`, order.ID); err != nil {
				return err // rolls back the shipment and the inbox record; delivered again
			}
			log.Printf("order %s: shipped (event %s, delivery %d)", order.ID, d.ID, d.Attempt)
			return nil
		})
	}

	nc, err := nats.Connect(*natsURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("consuming stream SHOP as %q; Ctrl-C to stop", *durable)
	err = outboxnats.Consume(ctx, js, outboxnats.ConsumerConfig{
		Stream:      "SHOP",
		Durable:     *durable,
		Concurrency: 4,
	}, handler)
	if err != nil {
		log.Fatal(err)
	}
}
