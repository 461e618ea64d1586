package outboxtest_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest"
)

// ExampleStore runs a relay without a database server: a Store stands in for the
// database and a Publisher for the broker. Messages written in a transaction that rolls
// back are never published; the committed ones are, in their key's order. In a
// testing/synctest bubble the same test runs on the bubble's clock, so backoffs and
// lease expiries take no wall-clock time.
func ExampleStore() {
	ctx := context.Background()
	store := outboxtest.NewStore(outboxtest.StoreConfig{})
	w, err := outbox.NewWriter(store, outbox.WriterConfig{})
	if err != nil {
		log.Fatal(err)
	}

	tx := store.Begin()
	defer tx.Rollback()
	err = w.Write(ctx, tx,
		outbox.Message{Topic: "orders", Key: "order-42", EventType: "order.placed", Payload: []byte(`{"n":1}`)},
		outbox.Message{Topic: "orders", Key: "order-42", EventType: "order.paid", Payload: []byte(`{"n":2}`)},
	)
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	gone := store.Begin()
	if err := w.Write(ctx, gone, outbox.Message{Topic: "orders", Key: "order-43", EventType: "order.placed", Payload: []byte(`{}`)}); err != nil {
		log.Fatal(err)
	}
	if err := gone.Rollback(); err != nil {
		log.Fatal(err)
	}

	pub := &outboxtest.Publisher{}
	relay, err := outbox.NewRelay(store, pub, outbox.RelayConfig{
		PollInterval: 10 * time.Millisecond, // the store has no LISTEN: the relay polls
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil {
		log.Fatal(err)
	}
	// A bound on a hang, not on how long publishing takes: generous for a loaded machine.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	msgs, err := pub.WaitFor(wctx, 2)
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Stop(wctx); err != nil {
		log.Fatal(err)
	}
	for _, m := range msgs {
		fmt.Println(m.Key, m.EventType, string(m.Payload))
	}
	// Output:
	// order-42 order.placed {"n":1}
	// order-42 order.paid {"n":2}
}
