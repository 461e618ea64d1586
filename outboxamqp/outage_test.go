package outboxamqp_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testproxy"
	"github.com/outboxkit/outbox/outboxamqp"
)

// The tests in this file put a toxiproxy between the publisher and RabbitMQ and cut it.

func dialProxied(t *testing.T) (*testproxy.Proxy, *outboxamqp.Publisher) {
	t.Helper()
	proxy := testproxy.New(t, testHostPort(t))
	pub, err := outboxamqp.Dial(ctxT(t, 5*time.Second), viaAddr(t, proxy.Addr()), outboxamqp.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	return proxy, pub
}

func batchFor(queue string, n, size int) []*outbox.Message {
	batch := make([]*outbox.Message, n)
	for i := range batch {
		batch[i] = newMsg(queue, fmt.Sprintf("key-%d", i), make([]byte, size))
	}
	return batch
}

func waitPing(t *testing.T, pub *outboxamqp.Publisher, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := pub.Ping(ctxT(t, time.Second))
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reconnect within %v: %v", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
	go func() { done <- pub.Publish(ctxT(t, 10*time.Second), batch) }()
	time.Sleep(20 * time.Millisecond)
	proxy.Cut()
	errs := <-done
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
	waitPing(t, pub, 15*time.Second)
	requireNoErrs(t, pub.Publish(ctxT(t, 5*time.Second), batchFor(q, 5, 10)))
}

// TestOutageWhileCut: while the broker is unreachable, Publish and Ping fail at once as
// outages.
func TestOutageWhileCut(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	q := declareQueue(t, conn, unique("cut"), nil)
	proxy, pub := dialProxied(t)
	requireNoErrs(t, pub.Publish(ctxT(t, 5*time.Second), batchFor(q, 3, 10)))

	proxy.Cut()
	start := time.Now()
	requireAllOutages(t, pub.Publish(ctxT(t, 2*time.Second), batchFor(q, 5, 10)), 5)
	if err := pub.Ping(ctxT(t, 2*time.Second)); !outbox.IsOutage(err) {
		t.Errorf("Ping while cut = %v, want an outage", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Publish and Ping took %v while cut, want them bounded by their 2 s contexts", d)
	}

	proxy.Restore(t)
	waitPing(t, pub, 15*time.Second)
	requireNoErrs(t, pub.Publish(ctxT(t, 5*time.Second), batchFor(q, 4, 10)))
	if n := queueLen(t, conn, q); n != 3+4 {
		t.Errorf("queue holds %d messages, want %d", n, 3+4)
	}
}

func TestDialUnreachable(t *testing.T) {
	t.Parallel()
	proxy := testproxy.New(t, testHostPort(t))
	proxy.Cut()
	_, err := outboxamqp.Dial(ctxT(t, 2*time.Second), viaAddr(t, proxy.Addr()), outboxamqp.Config{})
	if err == nil {
		t.Fatal("Dial through a cut proxy succeeded")
	}
}
