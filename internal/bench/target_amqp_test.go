package bench

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox/internal/testinfra/testrabbit"
)

// TestAMQPEmpty: the RabbitMQ target empties a queue the raw phase filled, as the run does
// after each drain.
func TestAMQPEmpty(t *testing.T) {
	ctx := context.Background()
	target, err := openAMQP(ctx, testrabbit.URL())
	if err != nil {
		t.Fatalf("RabbitMQ is needed (set OUTBOX_TEST_AMQP_URL, or start it: rabbitmq-server -detached): %v", err)
	}
	defer target.Close()
	route, drop, err := target.Prepare(ctx, "bench_empty_"+randomTag())
	if err != nil {
		t.Fatal(err)
	}
	defer drop()
	if _, err := rawPublish(ctx, target, route, []byte("x"), 500, 10); err != nil {
		t.Fatal(err)
	}
	depth := func() int {
		ch, err := target.(*amqpTarget).conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(route, true, false, false, false, amqp.Table{"x-queue-version": 2})
		if err != nil {
			t.Fatal(err)
		}
		return q.Messages
	}
	if n := depth(); n != 500 {
		t.Fatalf("queue holds %d messages after the raw publish; want 500", n)
	}
	if err := target.(emptier).Empty(ctx, route); err != nil {
		t.Fatal(err)
	}
	if n := depth(); n != 0 {
		t.Fatalf("queue holds %d messages after Empty; want 0", n)
	}
}
