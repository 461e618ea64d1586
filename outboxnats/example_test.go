package outboxnats_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testnats"
	"github.com/outboxkit/outbox/outboxnats"
)

func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	natsURL := testnats.URL() // "nats://127.0.0.1:4222"; credentials may go in the URL
	pub, err := outboxnats.Dial(ctx, natsURL, outboxnats.Config{Route: "outboxnats-example.{topic}"})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	// Once, at start-up: a stream must capture the subjects, or every publish is an outage.
	if err := pub.EnsureStream(ctx, "OUTBOXNATS_EXAMPLE", []string{"outboxnats-example.>"}); err != nil {
		log.Fatal(err)
	}

	// The relay does this (outbox.NewRelay(store, pub, ...)); here by hand.
	msg := &outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "order-42",
		Payload: []byte(`{"id":42}`), ContentType: outbox.ContentTypeJSON}
	errs := pub.Publish(ctx, []*outbox.Message{msg})
	fmt.Println("acked:", errs == nil)
	// Output: acked: true
}
