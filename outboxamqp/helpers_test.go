package outboxamqp_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testrabbit"
	"github.com/outboxkit/outbox/outboxamqp"
)

// testURL is the RabbitMQ the tests use: OUTBOX_TEST_AMQP_URL, or the local server.
func testURL() string { return testrabbit.URL() }

// testHostPort is testURL's host:port, for a proxy in front of it.
func testHostPort(t *testing.T) string {
	t.Helper()
	u, err := amqp.ParseURI(testURL())
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort(u.Host, strconv.Itoa(u.Port))
}

// viaAddr returns testURL with its host:port replaced by addr.
func viaAddr(t *testing.T, addr string) string {
	t.Helper()
	u, err := amqp.ParseURI(testURL())
	if err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = host
	if u.Port, err = strconv.Atoi(port); err != nil {
		t.Fatal(err)
	}
	return u.String()
}

// dialTest opens a connection to the test server, closed when the test ends. A missing
// server fails the test: it never skips.
func dialTest(t *testing.T) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(testURL())
	if err != nil {
		t.Fatalf("RabbitMQ is needed at %s (set OUTBOX_TEST_AMQP_URL, or start it: rabbitmq-server -detached): %v",
			outboxamqp.RedactURL(testURL()), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// channel opens a plain channel on conn, closed when the test ends.
func channel(t *testing.T, conn *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.Close() })
	return ch
}

func unique(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// declareQueue declares a fresh durable queue with args and deletes it when the test
// ends.
func declareQueue(t *testing.T, conn *amqp.Connection, name string, args amqp.Table) string {
	t.Helper()
	ch := channel(t, conn)
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		t.Fatalf("declare queue %s: %v", name, err)
	}
	t.Cleanup(func() { deleteQueue(name) })
	return name
}

func deleteQueue(name string) {
	conn, err := amqp.Dial(testURL())
	if err != nil {
		return
	}
	defer conn.Close()
	if ch, err := conn.Channel(); err == nil {
		_, _ = ch.QueueDelete(name, false, false, false)
	}
}

func deleteExchange(name string) {
	conn, err := amqp.Dial(testURL())
	if err != nil {
		return
	}
	defer conn.Close()
	if ch, err := conn.Channel(); err == nil {
		_ = ch.ExchangeDelete(name, false, false)
	}
}

// declareExchange declares a durable exchange and deletes it when the test ends.
func declareExchange(t *testing.T, conn *amqp.Connection, name, kind string, args amqp.Table) {
	t.Helper()
	ch := channel(t, conn)
	if err := ch.ExchangeDeclare(name, kind, true, false, false, false, args); err != nil {
		t.Fatalf("declare exchange %s: %v", name, err)
	}
	t.Cleanup(func() { deleteExchange(name) })
}

func bind(t *testing.T, conn *amqp.Connection, queue, key, exchange string) {
	t.Helper()
	if err := channel(t, conn).QueueBind(queue, key, exchange, false, nil); err != nil {
		t.Fatalf("bind %s to %s with %q: %v", queue, exchange, key, err)
	}
}

// readQueue reads the messages of queue without taking them (they are requeued when it
// returns), in queue order. It waits until n are there, or until their number has stopped
// growing for testenv.Stall() (then it returns those, for the caller to report what is
// missing), and then 300 ms more for messages beyond n.
func readQueue(t *testing.T, conn *amqp.Connection, queue string, n int) []amqp.Delivery {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close() // requeues everything unacked
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume %s: %v", queue, err)
	}
	var out []amqp.Delivery
	receive := func(d amqp.Delivery, ok bool) {
		if !ok {
			t.Fatalf("consume %s: the channel closed after %d messages", queue, len(out))
		}
		out = append(out, d)
	}
	err = testenv.Progress(context.Background(), fmt.Sprintf("%d messages in queue %s", n, queue), testenv.Stall(), func() (any, bool) {
		// Receive for a while: the client hands messages over one at a time.
		timer := time.NewTimer(100 * time.Millisecond)
		defer timer.Stop()
		for len(out) < n {
			select {
			case d, ok := <-deliveries:
				receive(d, ok)
			case <-timer.C:
				return len(out), false
			}
		}
		return len(out), true
	})
	if err != nil {
		t.Logf("reading what there is: %v", err)
		return out
	}
	// Messages beyond n would be a fault (a duplicate, a phantom): the pause gives them the
	// chance to show.
	for {
		select {
		case d, ok := <-deliveries:
			receive(d, ok)
		case <-time.After(300 * time.Millisecond):
			return out
		}
	}
}

// queueLen counts the messages in queue.
func queueLen(t *testing.T, conn *amqp.Connection, queue string) int {
	t.Helper()
	q, err := channel(t, conn).QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspect queue %s: %v", queue, err)
	}
	return q.Messages
}

func newPublisher(t *testing.T, conn *amqp.Connection, cfg outboxamqp.Config) *outboxamqp.Publisher {
	t.Helper()
	pub, err := outboxamqp.New(conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	return pub
}
