package outboxamqp_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testproxy"
	"github.com/outboxkit/outbox/outboxamqp"
)

// The tests in this file put a toxiproxy between the publisher and RabbitMQ and cut it.

func dialProxied(t *testing.T) (*testproxy.Proxy, *outboxamqp.Publisher) {
	t.Helper()
	proxy := testproxy.New(t, testHostPort(t))
	pub, err := outboxamqp.Dial(testenv.Context(t), viaAddr(t, proxy.Addr()), outboxamqp.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	return proxy, pub
}

func batchFor(queue string, n, size int) []*outbox.Message {
	batch := make([]*outbox.Message, n)
	for i := range batch {
		batch[i] = testenv.Message(queue, fmt.Sprintf("key-%d", i), make([]byte, size))
	}
	return batch
}

// awaitPing waits until pub has reconnected and Ping succeeds.
func awaitPing(t *testing.T, pub *outboxamqp.Publisher) {
	t.Helper()
	testenv.Await(t, "Ping to succeed once the network healed", func() (any, bool) {
		ctx, cancel := testenv.CallContext() // per ping: a hang bound
		defer cancel()
		err := pub.Ping(ctx)
		return err, err == nil
	})
}

// TestOutageInFlight cuts the connection while confirms are awaited: every message whose
// outcome is unknown is an outage, never a rejection, and every confirmed one is in the
// queue. Once the network heals, the publisher reconnects by itself.
func TestOutageInFlight(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	q := declareQueue(t, conn, unique("inflight"), nil)
	proxy, pub := dialProxied(t)

	batch := batchFor(q, 2000, 4096)
	done := make(chan []error)
	go func() { done <- pub.Publish(testenv.Context(t), batch) }()
	time.Sleep(20 * time.Millisecond) // shapes the fault: cut while the batch is in flight
	proxy.Cut()
	errs := testenv.AwaitRecv(t, "Publish to return after the cut", done)
	confirmed := map[string]bool{}
	for i, m := range batch {
		var err error
		if errs != nil {
			err = errs[i]
		}
		switch {
		case err == nil:
			confirmed[m.ID.String()] = true
		case !outbox.IsOutage(err):
			t.Fatalf("message %d: %v, want an outage or success", i, err)
		}
	}
	t.Logf("%d of %d confirmed before the cut", len(confirmed), len(batch))
	stored := map[string]bool{}
	for _, d := range readQueue(t, conn, q, len(confirmed)) {
		stored[d.Headers[outbox.HeaderID].(string)] = true
	}
	for id := range confirmed {
		if !stored[id] {
			t.Errorf("lost: message %s was confirmed but is not in the queue", id)
		}
	}

	proxy.Restore(t)
	awaitPing(t, pub)
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batchFor(q, 5, 10)))
}

// TestOutageWhileCut: while the broker is unreachable, Publish and Ping fail at once as
// outages. "At once" is checked without a clock: their contexts only bound a hang, so an
// outage that is their deadline means they waited for it instead of failing by
// themselves.
func TestOutageWhileCut(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	q := declareQueue(t, conn, unique("cut"), nil)
	proxy, pub := dialProxied(t)
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batchFor(q, 3, 10)))

	proxy.Cut()
	errs := pub.Publish(testenv.Context(t), batchFor(q, 5, 10))
	testenv.RequireAllOutages(t, errs, 5)
	for i, err := range errs {
		if errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("message %d: %v, want an outage without waiting for the deadline", i, err)
		}
	}
	if err := pub.Ping(testenv.Context(t)); !outbox.IsOutage(err) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Ping while cut = %v, want an outage without waiting for the deadline", err)
	}

	select {
	case <-pub.Reconnected():
		t.Fatal("Reconnected while the broker is cut off")
	default:
	}
	proxy.Restore(t)
	// The relay learns of the new connection from the publisher, without probing.
	testenv.AwaitRecv(t, "the publisher to report its new connection", pub.Reconnected())
	awaitPing(t, pub)
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batchFor(q, 4, 10)))
	if n := queueLen(t, conn, q); n != 3+4 {
		t.Errorf("queue holds %d messages, want %d", n, 3+4)
	}
}

func TestDialUnreachable(t *testing.T) {
	t.Parallel()
	proxy := testproxy.New(t, testHostPort(t))
	proxy.Cut()
	_, err := outboxamqp.Dial(testenv.Context(t), viaAddr(t, proxy.Addr()), outboxamqp.Config{})
	if err == nil {
		t.Fatal("Dial through a cut proxy succeeded")
	}
}
