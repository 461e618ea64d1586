package outboxredis_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxredis"
)

func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	redisURL := "redis://" + sharedAddr() // "redis://127.0.0.1:6379"; user:password@ may go in the URL
	pub, err := outboxredis.Dial(ctx, redisURL, outboxredis.Config{
		Route:  "outboxredis-example.{topic}", // topic "orders": stream "outboxredis-example.orders"
		MaxLen: 10_000,                        // each XADD trims the stream to about 10,000 entries
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	// The relay does this (outbox.NewRelay(store, pub, ...)); here by hand.
	msg := &outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "order-42",
		Payload: []byte(`{"id":42}`), ContentType: outbox.ContentTypeJSON}
	errs := pub.Publish(ctx, []*outbox.Message{msg})
	fmt.Println("added:", errs == nil)

	// A consumer reads entries (here with XREVRANGE; usually XREADGROUP) and decodes them.
	client := redis.NewClient(&redis.Options{Addr: sharedAddr()})
	defer client.Close()
	xs, err := client.XRevRangeN(ctx, "outboxredis-example.orders", "+", "-", 1).Result()
	if err != nil {
		log.Fatal(err)
	}
	e := outboxredis.ParseEntry(xs[0])
	fmt.Println(string(e.Payload), e.Headers[outbox.HeaderKey], e.Headers[outbox.HeaderContentType])
	// Output:
	// added: true
	// {"id":42} order-42 application/json
}
