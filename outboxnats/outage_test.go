package outboxnats_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testnats"
	"github.com/outboxkit/outbox/outboxnats"
)

// The tests in this file stop and kill their broker, so each runs its own private
// nats-server, never the shared one.

// dialPrivate starts a private server and dials it with a fast reconnect, so that tests
// need not wait for the production backoff.
func dialPrivate(t *testing.T) (*testnats.Server, *outboxnats.Publisher) {
	t.Helper()
	srv := testnats.StartServer(t)
	pub, err := outboxnats.Dial(testenv.Context(t), srv.URL(), outboxnats.Config{Route: "events.{topic}"},
		nats.CustomReconnectDelay(func(int) time.Duration { return 20 * time.Millisecond }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	if err := pub.EnsureStream(testenv.Context(t), "EVENTS", []string{"events.>"}); err != nil {
		t.Fatal(err)
	}
	return srv, pub
}

func batchOf(n int) []*outbox.Message {
	batch := make([]*outbox.Message, n)
	for i := range batch {
		batch[i] = testenv.Message("orders", "k"+string(rune('a'+i)), []byte("x"))
	}
	return batch
}

func TestOutageKilledServerAndReconnect(t *testing.T) {
	t.Parallel()
	srv, pub := dialPrivate(t)
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batchOf(3)))

	srv.Kill()
	// The 500 ms deadline is the caller's: Publish must return by it (or sooner, seeing
	// the connection down) with outages. That it does is checked without a clock, which a
	// loaded machine would fail: each outage must be that deadline or the connection's
	// state (nats.go fails what awaits a PubAck with ErrDisconnected when the connection
	// drops; the publisher refuses to send while it reconnects or after it closed, and a
	// send that races the drop meets the client's disabled reconnect buffer), never
	// some longer timeout of the client's own. AwaitRecv bounds a Publish that ignores
	// its ctx altogether.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	done := make(chan []error, 1)
	go func() { done <- pub.Publish(ctx, batchOf(5)) }()
	errs := testenv.AwaitRecv(t, "Publish with a killed server and a 500 ms deadline to return", done)
	testenv.RequireAllOutages(t, errs, 5)
	for i, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrDisconnected) &&
			!errors.Is(err, nats.ErrConnectionReconnecting) && !errors.Is(err, nats.ErrConnectionClosed) &&
			!errors.Is(err, nats.ErrReconnectBufExceeded) {
			t.Errorf("message %d: %v, want the Publish's own deadline or the lost connection as the cause", i, err)
		}
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 500*time.Millisecond) // an input, as above
	defer pcancel()
	if err := pub.Ping(pctx); !outbox.IsOutage(err) {
		t.Errorf("Ping with a killed server = %v, want an outage", err)
	}

	select {
	case <-pub.Reconnected():
		t.Fatal("Reconnected before the server came back")
	default:
	}
	srv.Start()
	// The relay learns of the reconnection from the publisher, without probing.
	testenv.AwaitRecv(t, "the publisher to report its reconnection", pub.Reconnected())
	awaitPing(t, pub)
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batchOf(4)))

	// The file-backed stream kept the messages acked before the crash.
	js := testnats.JetStream(t, srv.URL())
	s, err := js.Stream(testenv.Context(t), "EVENTS")
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
		batch[i] = testenv.Message("orders", "key-"+string(rune(i)), make([]byte, 4096))
	}
	done := make(chan []error)
	go func() {
		// The deadline is an input: it ends the wait for PubAcks the killed server will
		// never send, so that their messages come back as outages.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		done <- pub.Publish(ctx, batch)
	}()
	srv.Kill()
	errs := testenv.AwaitRecv(t, "Publish to return after the kill", done)
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
	// The deadline is an input: if the client has not yet seen the connection close, it
	// is what ends the wait for the PubAcks, as outages.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	errs := pub.Publish(ctx, batchOf(2))
	testenv.RequireAllOutages(t, errs, 2)
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
	errs := pub.Publish(testenv.Context(t), batchOf(2))
	testenv.RequireAllOutages(t, errs, 2)
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
	if pub.Reconnected() != nil {
		t.Error("a publisher on the caller's connection reports reconnections (the handler is the caller's)")
	}
	pub.Close()
	if nc.IsClosed() {
		t.Error("Close closed the caller's connection")
	}
}

// awaitPing waits until pub's connection is back and Ping succeeds.
func awaitPing(t *testing.T, pub *outboxnats.Publisher) {
	t.Helper()
	testenv.Await(t, "Ping to succeed after the restart", func() (any, bool) {
		ctx, cancel := testenv.CallContext() // per ping: a hang bound
		defer cancel()
		err := pub.Ping(ctx)
		return err, err == nil
	})
}
