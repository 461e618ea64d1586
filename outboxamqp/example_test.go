package outboxamqp_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxamqp"
)

func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	amqpURL := testURL() // "amqp://guest:guest@127.0.0.1:5672/"
	pub, err := outboxamqp.Dial(ctx, amqpURL, outboxamqp.Config{
		Exchange: "outboxamqp-example",
		Route:    "{aggregate_type}.{event_type}",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	// Once, at start-up (or with `outbox rabbitmq declare -f topology.yaml`): a topic
	// exchange and a queue for order events.
	err = pub.Declare(ctx, &outboxamqp.Topology{
		Exchanges: []outboxamqp.Exchange{{Name: "outboxamqp-example", Type: "topic"}},
		Queues:    []outboxamqp.Queue{{Name: "outboxamqp-example.orders", MessageTTL: outboxamqp.Duration(time.Minute)}},
		Bindings:  []outboxamqp.Binding{{Exchange: "outboxamqp-example", Queue: "outboxamqp-example.orders", RoutingKey: "order.*"}},
	})
	if err != nil {
		log.Fatal(err)
	}

	// The relay does this (outbox.NewRelay(store, pub, ...)); here by hand.
	placed := &outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "order-42", AggregateType: "order",
		EventType: "placed", Payload: []byte(`{"id":42}`), ContentType: outbox.ContentTypeJSON}
	shipped := &outbox.Message{ID: outbox.NewID(), Topic: "shipping", Key: "parcel-7", AggregateType: "parcel",
		EventType: "shipped", Payload: []byte(`{"id":7}`), ContentType: outbox.ContentTypeJSON}
	errs := pub.Publish(ctx, []*outbox.Message{placed, shipped})
	fmt.Println("order confirmed:", errs[0] == nil)
	// No queue binds parcel.*, and the exchange has no alternate exchange: RabbitMQ
	// returns the message, a rejection the relay retries and then dead-letters.
	fmt.Println("parcel unroutable:", errors.Is(errs[1], outbox.ErrUnroutable), outbox.IsOutage(errs[1]))
	// Output:
	// order confirmed: true
	// parcel unroutable: true false
}
