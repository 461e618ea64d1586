package outboxnats_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testnats"
	"github.com/outboxkit/outbox/outboxnats"
)

// The tests in this file stop and kill their broker, so each runs its own private
// nats-server, never the shared one.

// dialPrivate starts a private server and dials it with a fast reconnect, so that tests
// need not wait for the production backoff.
func dialPrivate(t *testing.T) (*testnats.Server, *outboxnats.Publisher) {
	t.Helper()
	srv := testnats.StartServer(t)
	pub, err := outboxnats.Dial(ctxT(t, 5*time.Second), srv.URL(), outboxnats.Config{Route: "events.{topic}"},
		nats.CustomReconnectDelay(func(int) time.Duration { return 20 * time.Millisecond }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	if err := pub.EnsureStream(ctxT(t, 5*time.Second), "EVENTS", []string{"events.>"}); err != nil {
		t.Fatal(err)
	}
	return srv, pub
}

func batchOf(n int) []*outbox.Message {
	batch := make([]*outbox.Message, n)
	for i := range batch {
		batch[i] = newMsg("orders", "k"+string(rune('a'+i)), []byte("x"))
	}
	return batch
}

func requireAllOutages(t *testing.T, errs []error, n int) {
	t.Helper()
	if len(errs) != n {
		t.Fatalf("errs = %v, want %d outages", errs, n)
	}
	for i, err := range errs {
		if !outbox.IsOutage(err) {
			t.Errorf("message %d: %v, want an outage", i, err)
		}
	}
}

func TestOutageKilledServerAndReconnect(t *testing.T) {
	t.Parallel()
	srv, pub := dialPrivate(t)
	requireNoErrs(t, pub.Publish(ctxT(t, 5*time.Second), batchOf(3)))

	srv.Kill()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	errs := pub.Publish(ctx, batchOf(5))
	cancel()
	requireAllOutages(t, errs, 5)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Publish took %v with a killed server, want it bounded by its 500ms ctx", d)
	}
	if err := pub.Ping(ctxT(t, 500*time.Millisecond)); !outbox.IsOutage(err) {
		t.Errorf("Ping with a killed server = %v, want an outage", err)
	}

	srv.Start()
	waitPing(t, pub, 10*time.Second)
	requireNoErrs(t, pub.Publish(ctxT(t, 5*time.Second), batchOf(4)))

	// The file-backed stream kept the messages acked before the crash.
	js := testnats.JetStream(t, srv.URL())
	s, err := js.Stream(ctxT(t, 5*time.Second), "EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 3+4 {
		t.Errorf("stream holds %d messages, want %d", n, 3+4)
	}
}

// TestOutageInFlight kills the server while PubAcks are awaited: the messages whose
// outcome is unknown must be outages, never rejections.
func TestOutageInFlight(t *testing.T) {
	t.Parallel()
	srv, pub := dialPrivate(t)
	batch := make([]*outbox.Message, 2000)
	for i := range batch {
		batch[i] = newMsg("orders", "key-"+string(rune(i)), make([]byte, 4096))
	}
	done := make(chan []error)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		done <- pub.Publish(ctx, batch)
	}()
	srv.Kill()
	errs := <-done
	for i, err := range errs {
		if err != nil && !outbox.IsOutage(err) {
			t.Fatalf("message %d: %v, want an outage or success", i, err)
		}
	}
}

func TestOutageStoppedServer(t *testing.T) {
	t.Parallel()
	srv, pub := dialPrivate(t)
	srv.Stop()
	errs := pub.Publish(ctxT(t, 2*time.Second), batchOf(2))
	requireAllOutages(t, errs, 2)
	for _, err := range errs {
		if errors.Is(err, outboxnats.ErrNoStream) {
			t.Errorf("a stopped server reported as a missing stream: %v", err)
		}
	}
}

func TestPublishAfterClose(t *testing.T) {
	t.Parallel()
	_, pub := dialPrivate(t)
	pub.Close()
	pub.Close() // twice is safe
	errs := pub.Publish(ctxT(t, time.Second), batchOf(2))
	requireAllOutages(t, errs, 2)
	if !errors.Is(errs[0], nats.ErrConnectionClosed) {
		t.Errorf("after Close: %v, want nats.ErrConnectionClosed", errs[0])
	}
}

// TestNewDoesNotOwnConnection checks that Close leaves a caller's connection open.
func TestNewDoesNotOwnConnection(t *testing.T) {
	t.Parallel()
	nc := testnats.Conn(t, "")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := outboxnats.New(js, outboxnats.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pub.Close()
	if nc.IsClosed() {
		t.Error("Close closed the caller's connection")
	}
}

func waitPing(t *testing.T, pub *outboxnats.Publisher, timeout time.Duration) {
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
