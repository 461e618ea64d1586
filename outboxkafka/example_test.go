package outboxkafka_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxkafka"
)

func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// An in-process Kafka cluster with the topic "events.orders", for the example;
	// give Dial your brokers' addresses ("kafka-1:9092", ...).
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "events.orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()

	pub, err := outboxkafka.Dial(ctx, cluster.ListenAddrs(), outboxkafka.Config{Route: "events.{topic}"})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	// The relay does this (outbox.NewRelay(store, pub, ...)); here by hand. The key
	// becomes the record key, so the events of one order share a partition, in order.
	msg := &outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "order-42",
		Payload: []byte(`{"id":42}`), ContentType: outbox.ContentTypeJSON}
	errs := pub.Publish(ctx, []*outbox.Message{msg})
	fmt.Println("acknowledged by all in-sync replicas:", errs == nil)
	// Output: acknowledged by all in-sync replicas: true
}
