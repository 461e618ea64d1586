package outboxnats_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testnats"
	"github.com/outboxkit/outbox/outboxnats"
)

// consumeSetup makes a stream, publishes n messages over keys through the publisher,
// and returns the stream and its subject prefix.
func consumeSetup(t *testing.T, js jetstream.JetStream, n, keys int) (stream, prefix string) {
	t.Helper()
	stream, prefix = testnats.Stream(t, js)
	pub, err := outboxnats.New(js, outboxnats.Config{Route: prefix + "{topic}"})
	if err != nil {
		t.Fatal(err)
	}
	var batch []*outbox.Message
	for i := range n {
		batch = append(batch, &outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "k" + strconv.Itoa(i%keys),
			Payload: []byte(strconv.Itoa(i)), ContentType: "text/plain", EventType: "placed"})
		if len(batch) == keys || i == n-1 {
			ctx, cancel := testenv.CallContext() // per batch: a hang bound, not a budget on all n
			errs := pub.Publish(ctx, batch)
			cancel()
			testenv.RequirePublishedAll(t, errs)
			batch = nil
		}
	}
	return stream, prefix
}

// consumeUntil runs Consume until stop closes, and returns its error. seen reports the
// handler's progress (a count): the test fails if it stops changing for testenv.Stall(),
// however long the whole run takes on a slow machine.
func consumeUntil(t *testing.T, js jetstream.JetStream, cfg outboxnats.ConsumerConfig, h outbox.Handler, stop <-chan struct{}, seen func() any) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- outboxnats.Consume(ctx, js, cfg, h) }()
	var err error
	ended := false
	werr := testenv.Progress(context.Background(), "the consumer to handle every message", testenv.Stall(), func() (any, bool) {
		select {
		case <-stop:
			return nil, true
		case err = <-errc:
			ended = true
			return nil, true
		default:
			return seen(), false
		}
	})
	cancel()
	if !ended {
		err = testenv.AwaitRecv(t, "Consume to return once its context ended", errc)
	}
	if werr != nil {
		t.Fatal(werr)
	}
	return err
}

func TestConsumeOrderAndAck(t *testing.T) {
	t.Parallel()
	js := testnats.JetStream(t, "")
	const n, keys = 400, 10
	stream, _ := consumeSetup(t, js, n, keys)
	var mu sync.Mutex
	last := map[string]int{}
	got := 0
	done := make(chan struct{})
	h := func(ctx context.Context, d *outbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		v, _ := strconv.Atoi(string(d.Payload))
		if prev, ok := last[d.Key]; ok && v <= prev {
			t.Errorf("key %s: %d handled after %d", d.Key, v, prev)
		}
		last[d.Key] = v
		if d.ID == "" || d.EventType != "placed" || d.Topic != "orders" || d.Attempt != 1 {
			t.Errorf("delivery lacks metadata: %+v", d)
		}
		if got++; got == n {
			close(done)
		}
		return nil
	}
	if err := consumeUntil(t, js, outboxnats.ConsumerConfig{Stream: stream, Durable: "order", Concurrency: 4}, h, done, func() any {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("%d of %d handled", got, n)
	}); err != nil {
		t.Fatal(err)
	}
	info, err := js.Consumer(context.Background(), stream, "order")
	if err != nil {
		t.Fatal(err)
	}
	if p := info.CachedInfo().NumAckPending; p != 0 {
		t.Fatalf("%d messages handled but not acked", p)
	}
}

func TestConsumeRetryAndDeadLetter(t *testing.T) {
	t.Parallel()
	js := testnats.JetStream(t, "")
	stream, prefix := consumeSetup(t, js, 3, 3) // payloads 0, 1, 2
	dlq, dlqPrefix := testnats.Stream(t, js)
	var mu sync.Mutex
	attempts := map[string][]int{}
	done := make(chan struct{})
	var once sync.Once
	h := func(ctx context.Context, d *outbox.Delivery) error {
		mu.Lock()
		attempts[string(d.Payload)] = append(attempts[string(d.Payload)], d.Attempt)
		a0, a1, a2 := len(attempts["0"]), len(attempts["1"]), len(attempts["2"])
		mu.Unlock()
		if a0 >= 2 && a1 >= 3 && a2 >= 1 {
			// Every expected delivery has come. Stop 300 ms later: the pause gives a wrong
			// extra delivery (a third of "0", a fourth of "1", a second of "2") the chance
			// to show. Nothing below depends on its length: Consume settles the message in
			// hand before it returns.
			defer once.Do(func() { time.AfterFunc(300*time.Millisecond, func() { close(done) }) })
		}
		switch string(d.Payload) {
		case "0": // succeeds on its second delivery
			if d.Attempt < 2 {
				return outbox.Retry(errors.New("not yet"), 10*time.Millisecond)
			}
			return nil
		case "1": // always fails: dead after MaxDeliver
			return errors.New("always")
		default: // poison
			return outbox.Permanent(errors.New("bad payload"))
		}
	}
	cfg := outboxnats.ConsumerConfig{Stream: stream, Durable: "retry", MaxDeliver: 3, RetryDelay: 10 * time.Millisecond, DeadLetterSubject: dlqPrefix + "dead"}
	seen := func() any {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprint("attempts ", attempts)
	}
	if err := consumeUntil(t, js, cfg, h, done, seen); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(attempts["0"]) != "[1 2]" || fmt.Sprint(attempts["1"]) != "[1 2 3]" || fmt.Sprint(attempts["2"]) != "[1]" {
		t.Fatalf("attempts %v", attempts)
	}
	dead := readAll(t, js, dlq, 2)
	reasons := map[string]string{}
	for _, m := range dead {
		reasons[string(m.Data())] = m.Headers().Get(outboxnats.HeaderDeadReason)
		if m.Headers().Get(outboxnats.HeaderDeadStream) != stream || m.Headers().Get(outboxnats.HeaderDeadSubject) != prefix+"orders" || m.Headers().Get(outbox.HeaderID) == "" {
			t.Errorf("dead letter headers %v", m.Headers())
		}
	}
	if reasons["1"] != "always" || reasons["2"] != "permanent: bad payload" {
		t.Fatalf("dead letters %v", reasons)
	}
}

// TestConsumeGracefulShutdown cancels Consume while a handler is working: Consume must
// wait for it, not cancel its context, and ack its message before it returns.
func TestConsumeGracefulShutdown(t *testing.T) {
	t.Parallel()
	js := testnats.JetStream(t, "")
	stream, _ := consumeSetup(t, js, 1, 1)
	started, release := make(chan struct{}), make(chan struct{})
	defer func() {
		select {
		case <-release:
		default:
			close(release) // on a failure below: let the handler end
		}
	}()
	h := func(ctx context.Context, d *outbox.Delivery) error {
		close(started)
		<-release // still working when the shutdown begins
		if ctx.Err() != nil {
			t.Error("the handler's context was cancelled by the shutdown")
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- outboxnats.Consume(ctx, js, outboxnats.ConsumerConfig{Stream: stream, Durable: "grace"}, h)
	}()
	testenv.Await(t, "the first delivery", func() (any, bool) {
		select {
		case <-started:
			return nil, true
		case err := <-errc:
			t.Fatalf("Consume returned before the first delivery: %v", err)
		default:
		}
		return "no delivery yet", false
	})
	cancel()
	// The pause gives a Consume that does not wait for its handlers the chance to return.
	select {
	case err := <-errc:
		t.Fatalf("Consume returned (%v) while a handler was still working", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if err := testenv.AwaitRecv(t, "Consume to return once its handler finished", errc); err != nil {
		t.Fatal(err)
	}
	// Consume flushed the ack to the server before returning; the server applies it to
	// the consumer on its own time, so read the consumer until it shows (or stalls).
	testenv.Await(t, "the message handled during shutdown to be acked", func() (any, bool) {
		ctx, cancel := testenv.CallContext()
		defer cancel()
		info, err := js.Consumer(ctx, stream, "grace")
		if err != nil {
			return err, false
		}
		c := info.CachedInfo()
		return fmt.Sprintf("ack pending %d, ack floor %d", c.NumAckPending, c.AckFloor.Consumer), c.NumAckPending == 0 && c.AckFloor.Consumer == 1
	})
}

func TestConsumeConfig(t *testing.T) {
	js := testnats.JetStream(t, "")
	for _, cfg := range []outboxnats.ConsumerConfig{{}, {Stream: "S"}, {Stream: "S", Durable: "d", AckWait: time.Millisecond}, {Stream: "S", Durable: "d", MaxDeliver: -1}} {
		if err := outboxnats.Consume(context.Background(), js, cfg, nil); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("Consume(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

func TestDeadLetterReplay(t *testing.T) {
	t.Parallel()
	js := testnats.JetStream(t, "")
	stream, _ := consumeSetup(t, js, 2, 2) // payloads 0 and 1
	dlq, dlqPrefix := testnats.Stream(t, js)
	var mu sync.Mutex
	poisoned := true
	handled := map[string]int{}
	h := func(ctx context.Context, d *outbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		if poisoned && string(d.Payload) == "1" {
			return outbox.Permanent(errors.New("poison"))
		}
		handled[string(d.Payload)]++
		return nil
	}
	cfg := outboxnats.ConsumerConfig{Stream: stream, Durable: "dead", DeadLetterSubject: dlqPrefix + "dead"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- outboxnats.Consume(ctx, js, cfg, h) }()

	var dead []outboxnats.DeadLetter
	testenv.Await(t, "the poison message to be dead-lettered", func() (any, bool) {
		var err error
		if dead, err = outboxnats.ListDead(ctx, js, dlq, 0); err != nil {
			t.Fatal(err)
		}
		return len(dead), len(dead) > 0
	})
	if len(dead) != 1 || string(dead[0].Payload) != "1" || dead[0].Reason != "permanent: poison" || dead[0].Stream != stream || dead[0].ID == "" || dead[0].Seq == 0 {
		t.Fatalf("dead letters %+v", dead)
	}
	mu.Lock()
	poisoned = false // the fix is deployed
	mu.Unlock()
	if n, err := outboxnats.ReplayDead(ctx, js, dlq, []uint64{dead[0].Seq}); err != nil || n != 1 {
		t.Fatalf("ReplayDead = %d, %v", n, err)
	}
	testenv.Await(t, "the replayed message to be handled", func() (any, bool) {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprint("handled ", handled), handled["1"] == 1
	})
	cancel()
	if err := testenv.AwaitRecv(t, "Consume to return once its context ended", errc); err != nil {
		t.Fatal(err)
	}
	if handled["0"] != 1 || handled["1"] != 1 {
		t.Fatalf("handled %v, want each once", handled)
	}
	if left, err := outboxnats.ListDead(context.Background(), js, dlq, 0); err != nil || len(left) != 0 {
		t.Fatalf("dead letters left after replay: %v, %v", left, err)
	}
}

// A consumer limited to one subject gets that subject's messages only, on every server
// version (servers before 2.10 refuse a list of filter subjects).
func TestConsumeFilterSubject(t *testing.T) {
	t.Parallel()
	js := testnats.JetStream(t, "")
	const n = 10
	stream, prefix := consumeSetup(t, js, n, 5)
	pub, err := outboxnats.New(js, outboxnats.Config{Route: prefix + "{topic}"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := testenv.CallContext()
	errs := pub.Publish(ctx, []*outbox.Message{{ID: outbox.NewID(), Topic: "billing", Key: "b", Payload: []byte("bill")}})
	cancel()
	testenv.RequirePublishedAll(t, errs)
	var mu sync.Mutex
	got := 0
	done := make(chan struct{})
	h := func(ctx context.Context, d *outbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		if d.Topic != "orders" {
			t.Errorf("a %s message reached a consumer of %sorders", d.Topic, prefix)
		}
		if got++; got == n {
			close(done)
		}
		return nil
	}
	cfg := outboxnats.ConsumerConfig{Stream: stream, Durable: "orders-only", FilterSubjects: []string{prefix + "orders"}}
	if err := consumeUntil(t, js, cfg, h, done, func() any {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("%d of %d handled", got, n)
	}); err != nil {
		t.Fatal(err)
	}
}
