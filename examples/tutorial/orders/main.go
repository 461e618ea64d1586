// Command orders is the order service of docs/tutorial.md: it places orders, and writes
// an order.placed event for each in the same transaction as the order itself.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxpgx"
)

// errDeclined stands for any reason to roll an order back.
var errDeclined = errors.New("card declined")

func main() {
	dbURL := flag.String("database-url", "postgres://postgres@127.0.0.1:5432/shop?sslmode=disable", "the service's database")
	n := flag.Int("orders", 5, "how many orders to place; the last one is declined")
	flag.Parse()
	ctx := context.Background()

	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (
		id          text PRIMARY KEY,
		customer    text NOT NULL,
		total_cents bigint NOT NULL,
		placed_at   timestamptz NOT NULL DEFAULT now())`); err != nil {
		log.Fatal(err)
	}

	// The outbox tables are in the same database, made by `outbox migrate up`.
	drv, err := outboxpgx.New(pool, outboxpgx.Config{})
	if err != nil {
		log.Fatal(err)
	}
	w, err := outbox.NewWriter(drv, outbox.WriterConfig{})
	if err != nil {
		log.Fatal(err)
	}

	for i := 1; i <= *n; i++ {
		id := outbox.NewID().String()
		err := placeOrder(ctx, pool, w, id, "customer-7", int64(1000*i), i == *n)
		switch {
		case errors.Is(err, errDeclined):
			fmt.Printf("order %s declined: rolled back, no event\n", id)
		case err != nil:
			log.Fatal(err)
		default:
			fmt.Printf("order %s placed\n", id)
		}
	}
}

// placeOrder inserts the order and its event in one transaction: both commit, or neither.
func placeOrder(ctx context.Context, pool *pgxpool.Pool, w *outbox.Writer[pgx.Tx], id, customer string, cents int64, decline bool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx,
			`INSERT INTO orders (id, customer, total_cents) VALUES ($1, $2, $3)`,
			id, customer, cents); err != nil {
			return err
		}
		payload, err := json.Marshal(map[string]any{"id": id, "customer": customer, "total_cents": cents})
		if err != nil {
			return err
		}
		if err := w.Write(ctx, tx, outbox.Message{
			Topic:         "orders",
			Key:           id, // the events of one order are published in order
			AggregateType: "order",
			EventType:     "order.placed",
			Payload:       payload,
		}); err != nil {
			return err
		}
		if decline {
			return errDeclined // BeginFunc rolls back: the order and its event are gone
		}
		return nil
	})
}
