package testrabbit_test

import (
	"strconv"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testrabbit"
)

// TestRestartKeepsConfirmedMessages stops and starts a private node and reads back the
// persistent messages it confirmed into a durable queue before the stop.
func TestRestartKeepsConfirmedMessages(t *testing.T) {
	s := testrabbit.StartServer(t)
	const n = 100

	conn := dial(t, s.URL())
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("kept", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx := testenv.Context(t)
	for i := range n {
		conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", "kept", true, false,
			amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(strconv.Itoa(i))})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := conf.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("message %d: ack %t, %v", i, ok, err)
		}
	}

	s.Stop()
	if c, err := amqp.Dial(s.URL()); err == nil {
		_ = c.Close()
		t.Fatal("the node still accepts connections after Stop")
	}
	s.Start()

	conn = dial(t, s.URL())
	ch, err = conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive("kept", true, false, false, false, nil)
	if err != nil {
		t.Fatalf("the durable queue did not survive the restart: %v", err)
	}
	if q.Messages != n {
		t.Fatalf("%d messages after the restart, want %d", q.Messages, n)
	}
	for i := range n {
		d, ok, err := ch.Get("kept", true)
		if err != nil || !ok {
			t.Fatalf("get message %d: %t, %v", i, ok, err)
		}
		if got := string(d.Body); got != strconv.Itoa(i) {
			t.Fatalf("message %d is %q", i, got)
		}
	}
}

func dial(t *testing.T, url string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}
