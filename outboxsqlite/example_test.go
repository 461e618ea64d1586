package outboxsqlite_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxsqlite"
	"github.com/outboxkit/outbox/outboxtest"
)

// Example writes an event in the same transaction as the business change, and a relay
// publishes it once the transaction commits. The in-memory publisher of outboxtest
// stands in for a broker.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "outbox-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	db, err := outboxsqlite.Open(filepath.Join(dir, "app.db")) // WAL, synchronous=FULL, immediate transactions
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	drv, err := outboxsqlite.New(db, outboxsqlite.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := drv.MigrateUp(ctx, 0); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER)`); err != nil {
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
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, total) VALUES (?, ?)`, "order-42", 1999); err != nil {
		log.Fatal(err)
	}
	err = w.Write(ctx, tx, outbox.Message{
		Topic:     "orders",
		Key:       "order-42", // events of one order keep their order
		EventType: "order.placed",
		Payload:   []byte(`{"id":"order-42","total":1999}`),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
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
