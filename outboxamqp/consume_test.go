package outboxamqp_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testproxy"
	"github.com/outboxkit/outbox/outboxamqp"
)

// consumerConfig returns a config for a fresh work queue, whose queues are deleted when
// the test ends, with the retry delay short.
func consumerConfig(t *testing.T, q outboxamqp.Queue) outboxamqp.ConsumerConfig {
	t.Helper()
	if q.Name == "" {
		q.Name = unique("work")
	}
	t.Cleanup(func() {
		for _, name := range []string{q.Name, q.Name + ".retry", q.Name + ".dead"} {
			deleteQueue(name)
		}
	})
	return outboxamqp.ConsumerConfig{Queue: q, RetryDelay: 20 * time.Millisecond}
}

// declareConsumer declares cfg's queues, so that messages can be published before
// Consume starts.
func declareConsumer(t *testing.T, conn *amqp.Connection, cfg outboxamqp.ConsumerConfig) {
	t.Helper()
	top, err := cfg.Topology()
	if err != nil {
		t.Fatal(err)
	}
	if err := top.Declare(testenv.Context(t), channel(t, conn)); err != nil {
		t.Fatal(err)
	}
}

// publishN publishes n messages to queue through the publisher (the default exchange),
// over keys, with payloads "0", "1", ...
func publishN(t *testing.T, conn *amqp.Connection, queue string, n, keys int) {
	t.Helper()
	pub := newPublisher(t, conn, outboxamqp.Config{})
	var batch []*outbox.Message
	for i := range n {
		batch = append(batch, &outbox.Message{ID: outbox.NewID(), Topic: queue, Key: "k" + strconv.Itoa(i%keys),
			Payload: []byte(strconv.Itoa(i)), ContentType: "text/plain", EventType: "placed", AggregateType: "order"})
		if len(batch) == 1000 || i == n-1 {
			ctx, cancel := testenv.CallContext() // per batch: a hang bound, not a budget on all n
			errs := pub.Publish(ctx, batch)
			cancel()
			testenv.RequirePublishedAll(t, errs)
			batch = nil
		}
	}
}

// consumer runs Consume in the background until stop is called, which returns Consume's
// error.
type consumerRun struct {
	cancel context.CancelFunc
	errc   chan error
}

func startConsumer(t *testing.T, conn *amqp.Connection, cfg outboxamqp.ConsumerConfig, h outbox.Handler) *consumerRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &consumerRun{cancel: cancel, errc: make(chan error, 1)}
	go func() { r.errc <- outboxamqp.Consume(ctx, conn, cfg, h) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *consumerRun) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	err := testenv.AwaitRecv(t, "Consume to return once its context ended", r.errc)
	r.errc <- err // for a second stop
	return err
}

// depth counts the messages ready in queue (queueLen keeps a channel per call open until
// the test ends; this one is for polling).
func depth(t *testing.T, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspect queue %s: %v", queue, err)
	}
	return q.Messages
}

// awaitDepth waits until queue holds n ready messages.
func awaitDepth(t *testing.T, conn *amqp.Connection, queue string, n int) {
	t.Helper()
	testenv.Await(t, fmt.Sprintf("%d messages in %s", n, queue), func() (any, bool) {
		got := depth(t, conn, queue)
		return got, got == n
	})
}

// syncBuffer is the output of a command the test reads while it is written.
type syncBuffer = testenv.Buffer

func TestConsumeOrderAndAck(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	cfg := consumerConfig(t, outboxamqp.Queue{})
	cfg.Concurrency = 4
	declareConsumer(t, conn, cfg)
	const n, keys = 400, 10
	publishN(t, conn, cfg.Queue.Name, n, keys)

	var mu sync.Mutex
	last := map[string]int{}
	got := 0
	run := startConsumer(t, conn, cfg, func(ctx context.Context, d *outbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		v, _ := strconv.Atoi(string(d.Payload))
		if prev, ok := last[d.Key]; ok && v <= prev {
			t.Errorf("key %s: %d handled after %d", d.Key, v, prev)
		}
		last[d.Key] = v
		if d.ID == "" || d.EventType != "placed" || d.Topic != cfg.Queue.Name || d.AggregateType != "order" ||
			d.ContentType != "text/plain" || d.Attempt != 1 || d.Destination != cfg.Queue.Name {
			t.Errorf("delivery lacks metadata: %+v", d)
		}
		got++
		return nil
	})
	testenv.Await(t, "every message handled", func() (any, bool) {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("%d of %d handled", got, n), got == n
	})
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	// Anything handled but not acked would be back in the queue now that the channel
	// is closed.
	if left := depth(t, conn, cfg.Queue.Name); left != 0 {
		t.Fatalf("%d messages handled but not acked", left)
	}
	if got != n {
		t.Fatalf("%d handled, want %d", got, n)
	}
}

func TestConsumeRetryAndDeadLetter(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"classic", "quorum"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			testRetryAndDeadLetter(t, kind)
		})
	}
}

// testRetryAndDeadLetter: "0" succeeds on its second attempt, "1" always fails and is
// dead-lettered after MaxAttempts, "2" is poison (permanent) and dead-lettered at once,
// while 50 more messages flow past them.
func testRetryAndDeadLetter(t *testing.T, kind string) {
	conn := dialTest(t)
	cfg := consumerConfig(t, outboxamqp.Queue{Type: kind})
	cfg.MaxAttempts = 3
	cfg.Concurrency = 2
	declareConsumer(t, conn, cfg)
	publishN(t, conn, cfg.Queue.Name, 53, 53)

	var mu sync.Mutex
	attempts := map[string][]int{}
	var logs syncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	run := startConsumer(t, conn, cfg, func(ctx context.Context, d *outbox.Delivery) error {
		mu.Lock()
		attempts[string(d.Payload)] = append(attempts[string(d.Payload)], d.Attempt)
		mu.Unlock()
		switch string(d.Payload) {
		case "0":
			if d.Attempt < 2 {
				return outbox.Retry(errors.New("not yet"), time.Hour) // the delay is the retry queue's
			}
			return nil
		case "1":
			return errors.New("always")
		case "2":
			return outbox.Permanent(errors.New("bad payload"))
		}
		return nil
	})
	dead := cfg.Queue.Name + ".dead"
	awaitDepth(t, conn, dead, 2)
	testenv.Await(t, "every message handled", func() (any, bool) {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("%d of 53 messages handled, %q attempted %v", len(attempts), "0", attempts["0"]),
			len(attempts) == 53 && len(attempts["0"]) == 2
	})
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(attempts["0"]) != "[1 2]" || fmt.Sprint(attempts["1"]) != "[1 2 3]" || fmt.Sprint(attempts["2"]) != "[1]" {
		t.Fatalf("attempts %v %v %v", attempts["0"], attempts["1"], attempts["2"])
	}
	for p, a := range attempts {
		if n, _ := strconv.Atoi(p); n > 2 && len(a) != 1 {
			t.Errorf("message %s handled %d times", p, len(a))
		}
	}
	for _, q := range []string{cfg.Queue.Name, cfg.Queue.Name + ".retry"} {
		if n := depth(t, conn, q); n != 0 {
			t.Errorf("%d messages left in %s", n, q)
		}
	}

	letters, err := outboxamqp.ListDead(testenv.Context(t), conn, dead, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(letters) != 2 {
		t.Fatalf("%d dead letters, want 2", len(letters))
	}
	byPayload := map[string]outboxamqp.DeadLetter{}
	for _, dl := range letters {
		byPayload[string(dl.Payload)] = dl
		if dl.Queue != cfg.Queue.Name || !dl.Known || dl.Exchange != "" || fmt.Sprint(dl.RoutingKeys) != "["+cfg.Queue.Name+"]" ||
			dl.ID == "" || dl.MessageID == "" || dl.DeadAt.IsZero() || dl.EventType != "placed" || dl.Headers[outbox.HeaderKey] == "" {
			t.Errorf("dead letter %+v", dl)
		}
	}
	// Consume's copy carries the x-death header it was delivered with (RabbitMQ 4 may
	// drop x- headers that a client publishes: then there is none).
	if dl := byPayload["1"]; dl.Reason != "always" || dl.Attempts != 3 {
		t.Errorf("dead letter of the always failing message: %+v", dl)
	} else if len(dl.Deaths) > 0 && outboxamqp.Attempt(amqp.Table{"x-death": deathsTable(dl.Deaths)}, cfg.Queue.Name) != 3 {
		t.Errorf("its x-death does not count two rejections: %+v", dl.Deaths)
	}
	if dl := byPayload["2"]; dl.Reason != "permanent: bad payload" || dl.Attempts != 1 {
		t.Errorf("dead letter of the poison message: %+v", dl)
	}
	// One log line per retry and per dead letter, with the keys of the style guide.
	out := logs.String()
	if c := strings.Count(out, "handler failed; retrying"); c != 3 { // "0" once, "1" twice
		t.Errorf("%d retry log lines, want 3:\n%s", c, out)
	}
	if c := strings.Count(out, "message dead-lettered"); c != 2 {
		t.Errorf("%d dead-letter log lines, want 2:\n%s", c, out)
	}
	for _, k := range []string{"event_id=", "aggregate_id=", "event_type=placed", "attempt=3", "err=always"} {
		if !strings.Contains(out, k) {
			t.Errorf("logs lack %s:\n%s", k, out)
		}
	}
}

// deathsTable turns Deaths back into an x-death header.
func deathsTable(ds []outboxamqp.Death) []any {
	var out []any
	for _, d := range ds {
		out = append(out, amqp.Table{"queue": d.Queue, "reason": d.Reason, "count": d.Count})
	}
	return out
}

func TestConsumePanicIsPermanent(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	cfg := consumerConfig(t, outboxamqp.Queue{})
	declareConsumer(t, conn, cfg)
	publishN(t, conn, cfg.Queue.Name, 1, 1)
	var calls atomic.Int32
	startConsumer(t, conn, cfg, func(ctx context.Context, d *outbox.Delivery) error {
		calls.Add(1)
		panic("boom")
	})
	dead := cfg.Queue.Name + ".dead"
	awaitDepth(t, conn, dead, 1)
	letters, err := outboxamqp.ListDead(testenv.Context(t), conn, dead, 0)
	if err != nil || len(letters) != 1 || !strings.Contains(letters[0].Reason, "handler panicked: boom") || calls.Load() != 1 {
		t.Fatalf("dead letters %+v, %v; %d calls", letters, err, calls.Load())
	}
}

func TestConsumeGracefulShutdown(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	cfg := consumerConfig(t, outboxamqp.Queue{})
	declareConsumer(t, conn, cfg)
	publishN(t, conn, cfg.Queue.Name, 3, 1) // one key: handled one after another

	started, release := make(chan struct{}), make(chan struct{})
	var handled []string
	run := startConsumer(t, conn, cfg, func(ctx context.Context, d *outbox.Delivery) error {
		if len(handled) == 0 {
			close(started)
			<-release // still working when the shutdown begins
		}
		if ctx.Err() != nil {
			t.Error("the handler's context was cancelled by the shutdown")
		}
		handled = append(handled, string(d.Payload))
		return nil
	})
	testenv.AwaitChan(t, "the first delivery", started, func() any { return "no delivery yet" })
	run.cancel()
	close(release) // Consume has seen its context end: the lanes start nothing more
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(handled) != "[0]" {
		t.Fatalf("handled %v during shutdown, want only the message in progress", handled)
	}
	// The one handled was acked; the two prefetched and not started went back, in order.
	left := readQueue(t, conn, cfg.Queue.Name, 2)
	if len(left) != 2 || string(left[0].Body) != "1" || string(left[1].Body) != "2" || !left[0].Redelivered {
		t.Fatalf("left in the queue: %d messages", len(left))
	}
}

func TestConsumeConfig(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	h := func(context.Context, *outbox.Delivery) error { return nil }
	q := outboxamqp.Queue{Name: "q"}
	for name, cfg := range map[string]outboxamqp.ConsumerConfig{
		"no queue":         {},
		"queue with a DLX": {Queue: outboxamqp.Queue{Name: "q", DeadLetterExchange: "events.dlx"}},
		"DLX argument":     {Queue: outboxamqp.Queue{Name: "q", Arguments: map[string]any{"x-dead-letter-exchange": "x"}}},
		"negative":         {Queue: q, Concurrency: -1},
		"max attempts":     {Queue: q, MaxAttempts: -1},
		"retry delay":      {Queue: q, RetryDelay: -time.Second},
		"sub-ms delay":     {Queue: q, RetryDelay: time.Microsecond},
		"prefetch":         {Queue: q, Prefetch: 70000},
		"prefetch < conc":  {Queue: q, Prefetch: 2, Concurrency: 4},
		"same queues":      {Queue: q, RetryQueue: "q"},
		"retry = dead":     {Queue: q, RetryQueue: "r", DeadLetterQueue: "r"},
		"long name":        {Queue: outboxamqp.Queue{Name: strings.Repeat("q", 250)}},
	} {
		if err := outboxamqp.Consume(context.Background(), conn, cfg, h); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("%s: Consume = %v, want ErrInvalidConfig", name, err)
		}
		if _, err := cfg.Topology(); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("%s: Topology = %v, want ErrInvalidConfig", name, err)
		}
	}
	if err := outboxamqp.Consume(context.Background(), conn, outboxamqp.ConsumerConfig{Queue: q}, nil); err == nil {
		t.Error("Consume accepted a nil handler")
	}
	if err := outboxamqp.Consume(context.Background(), nil, outboxamqp.ConsumerConfig{Queue: q}, h); err == nil {
		t.Error("Consume accepted a nil connection")
	}
	if err := outboxamqp.DialConsume(context.Background(), testURL(), outboxamqp.ConsumerConfig{}, h); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("DialConsume = %v, want ErrInvalidConfig", err)
	}

	// The defaults, as Topology shows them.
	top, err := outboxamqp.ConsumerConfig{Queue: outboxamqp.Queue{Name: "orders", Type: "quorum"}}.Topology()
	if err != nil {
		t.Fatal(err)
	}
	if len(top.Queues) != 3 || top.Queues[1].Name != "orders.retry" || top.Queues[2].Name != "orders.dead" ||
		time.Duration(top.Queues[1].MessageTTL) != outboxamqp.RetryDelayDefault || top.Queues[1].Type != "quorum" ||
		top.Queues[0].Arguments["x-dead-letter-routing-key"] != "orders.retry" || top.Queues[1].Arguments["x-dead-letter-routing-key"] != "orders" {
		t.Fatalf("topology %+v", top)
	}
	if err := top.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestConsumeRefusesQueueWithoutDLX: a work queue that exists without the dead-letter
// exchange to the retry queue would drop every message Consume rejects: Consume refuses
// to start, naming the queue, and takes no message.
func TestConsumeRefusesQueueWithoutDLX(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	cfg := consumerConfig(t, outboxamqp.Queue{})
	declareQueue(t, conn, cfg.Queue.Name, nil)
	publishN(t, conn, cfg.Queue.Name, 1, 1)
	called := false
	err := outboxamqp.Consume(testenv.Context(t), conn, cfg, func(context.Context, *outbox.Delivery) error {
		called = true
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), `queue "`+cfg.Queue.Name+`"`) || !strings.Contains(err.Error(), "x-dead-letter-routing-key") {
		t.Fatalf("Consume = %v", err)
	}
	if called || depth(t, conn, cfg.Queue.Name) != 1 {
		t.Fatal("Consume took a message from a queue it refused")
	}

	// NoDeclare only checks that the queues exist.
	cfg.NoDeclare = true
	err = outboxamqp.Consume(testenv.Context(t), conn, cfg, func(context.Context, *outbox.Delivery) error { return nil })
	if err == nil || !strings.Contains(err.Error(), cfg.Queue.Name+".retry") || !strings.Contains(err.Error(), "NoDeclare") {
		t.Fatalf("Consume with NoDeclare and no retry queue = %v", err)
	}
}

// TestConsumeMalformedHeaders publishes messages that were not written through an
// outbox: headers of every AMQP type, no Outbox-Id, no message id. Each is handled once,
// with the documented id.
func TestConsumeMalformedHeaders(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	cfg := consumerConfig(t, outboxamqp.Queue{})
	declareConsumer(t, conn, cfg)
	q := cfg.Queue.Name
	when := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	msgs := []amqp.Publishing{
		{MessageId: "m-1", Body: []byte("a")},
		{Body: []byte("b")},
		{Body: []byte("c"), Type: "shipped", ContentType: "application/json", Headers: amqp.Table{
			"Outbox-Id": int64(42), "Outbox-Key": []byte("k1"), "i8": int8(-8), "u8": uint8(8), "i16": int16(-16), "u16": uint16(16),
			"i32": int32(-32), "u32": uint32(32), "f32": float32(1.5), "f64": 2.25, "yes": true, "when": when,
			"dec": amqp.Decimal{Scale: 2, Value: -12345}, "void": nil, "table": amqp.Table{"a": "b"}, "array": []any{"x", int64(1)},
			"x-death": "not an array", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		}},
		{Body: []byte("d"), Headers: amqp.Table{"x-death": []any{"junk", amqp.Table{"queue": int64(5), "count": "many", "routing-keys": "k"}}}},
	}
	ch := channel(t, conn)
	for _, m := range msgs {
		if err := ch.PublishWithContext(testenv.Context(t), "", q, false, false, m); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	got := map[string]*outbox.Delivery{}
	traces := map[string]string{}
	startConsumer(t, conn, cfg, func(ctx context.Context, d *outbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		got[string(d.Payload)] = d
		traces[string(d.Payload)] = outbox.TraceparentFromContext(ctx)
		return nil
	})
	testenv.Await(t, "every message handled", func() (any, bool) {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("%d of %d handled", len(got), len(msgs)), len(got) == len(msgs)
	})
	mu.Lock()
	defer mu.Unlock()
	if got["a"].ID != "m-1" {
		t.Errorf("without Outbox-Id the id is the message id: %q", got["a"].ID)
	}
	if want := outbox.DeliveryID(nil, "", q, []byte("b")); got["b"].ID != want || !strings.HasPrefix(want, "sha256:") {
		t.Errorf("without any id the id is the hash: %q, want %q", got["b"].ID, want)
	}
	c := got["c"]
	wantHeaders := map[string]string{
		"Outbox-Id": "42", "Outbox-Key": "k1", "i8": "-8", "u8": "8", "i16": "-16", "u16": "16", "i32": "-32", "u32": "32",
		"f32": "1.5", "f64": "2.25", "yes": "true", "when": "2024-05-06T07:08:09Z", "dec": "-123.45",
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x-death": "not an array",
	}
	if fmt.Sprint(c.Headers) != fmt.Sprint(wantHeaders) {
		t.Errorf("headers\n got %v\nwant %v", c.Headers, wantHeaders)
	}
	if c.ID != "42" || c.Key != "k1" || c.EventType != "shipped" || c.ContentType != "application/json" || c.Attempt != 1 {
		t.Errorf("delivery %+v", c)
	}
	if traces["c"] != wantHeaders["traceparent"] || traces["a"] != "" {
		t.Errorf("trace context %q", traces)
	}
	if got["d"].Attempt != 1 {
		t.Errorf("a malformed x-death counts as no attempt: %d", got["d"].Attempt)
	}
	if n := depth(t, conn, q); n != 0 {
		t.Errorf("%d messages left", n)
	}
}

// TestAttemptFromXDeath reads the attempt from x-death headers as RabbitMQ writes them,
// and from malformed ones.
func TestAttemptFromXDeath(t *testing.T) {
	t.Parallel()
	entry := func(queue, reason string, count any) amqp.Table {
		return amqp.Table{"queue": queue, "reason": reason, "count": count, "exchange": "ex", "routing-keys": []any{"rk", 7}}
	}
	for _, tc := range []struct {
		h    amqp.Table
		want int
	}{
		{nil, 1},
		{amqp.Table{"x-death": []any{entry("q", "rejected", int64(2))}}, 3},
		{amqp.Table{"x-death": []any{entry("q.retry", "expired", int64(2)), entry("q", "rejected", int64(2))}}, 3},
		{amqp.Table{"x-death": []any{entry("q", "rejected", int32(1)), entry("q", "delivery_limit", uint8(1))}}, 3},
		{amqp.Table{"x-death": []any{entry("other", "rejected", int64(5)), entry("q", "expired", int64(5))}}, 1},
		{amqp.Table{"x-death": []any{entry("q", "rejected", "2"), entry("q", "rejected", int64(-4)), "x", nil}}, 1},
		{amqp.Table{"x-death": amqp.Table{"queue": "q"}}, 1},
		{amqp.Table{"x-death": []any{entry("q", "rejected", int64(1)<<62)}}, 1<<31 - 1},
	} {
		if got := outboxamqp.Attempt(tc.h, "q"); got != tc.want {
			t.Errorf("Attempt(%v) = %d, want %d", tc.h, got, tc.want)
		}
	}
	ds := outboxamqp.Deaths(amqp.Table{"x-death": []any{entry("q", "rejected", int64(2))}})
	if len(ds) != 1 || ds[0].Exchange != "ex" || fmt.Sprint(ds[0].RoutingKeys) != "[rk]" || ds[0].Count != 2 {
		t.Errorf("Deaths = %+v", ds)
	}
}

// FuzzHeaderStrings feeds header tables of every shape to the functions that read them:
// they never panic.
func FuzzHeaderStrings(f *testing.F) {
	f.Add("Outbox-Id", "x", int64(1), []byte("b"), uint8(0))
	f.Add("x-death", "rejected", int64(-1), []byte{0xff}, uint8(3))
	f.Fuzz(func(t *testing.T, key, s string, n int64, b []byte, kind uint8) {
		vals := []any{s, n, b, int32(n), float64(n), amqp.Decimal{Scale: uint8(n), Value: int32(n)}, nil,
			[]any{s, amqp.Table{"queue": s, "count": n, "reason": s, "routing-keys": []any{b, s}}},
			amqp.Table{key: s}, time.Unix(n%1e10, 0)}
		h := amqp.Table{key: vals[int(kind)%len(vals)], "x-death": vals[int(kind/16)%len(vals)]}
		outboxamqp.HeaderStrings(h)
		outboxamqp.Attempt(h, s)
		outboxamqp.Deaths(h)
		outboxamqp.NewDelivery(amqp.Delivery{Headers: h, Body: b, MessageId: s}, key, int(n%100))
	})
}

// TestConsumeInboxExactlyOnce delivers n messages with the PostgreSQL inbox, and for
// about one in 500 it crashes after the handler's transaction committed and before the
// ack: it closes the connection, so that every message in flight is delivered again on
// the next connection. Every effect must happen exactly once.
// OUTBOX_TEST_INBOX_MESSAGES sets n (default 10,000).
func TestConsumeInboxExactlyOnce(t *testing.T) {
	n := 10_000
	if v, err := strconv.Atoi(os.Getenv("OUTBOX_TEST_INBOX_MESSAGES")); err == nil && v > 0 {
		n = v
	}
	conn := dialTest(t)
	cfg := consumerConfig(t, outboxamqp.Queue{})
	cfg.Concurrency, cfg.Prefetch = 8, 64
	declareConsumer(t, conn, cfg)
	publishN(t, conn, cfg.Queue.Name, n, 1000)

	db := testdb.Migrated(t)
	ctx := context.Background()
	effects := `"` + db.Schema + `".effects`
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE `+effects+` (id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	in, err := outbox.NewInbox[pgx.Tx](db.Driver, outbox.InboxConfig{Consumer: "effects"})
	if err != nil {
		t.Fatal(err)
	}
	inTx := func(ctx context.Context, fn func(pgx.Tx) error) error { return pgx.BeginFunc(ctx, db.Pool, fn) }
	work := outbox.InboxHandler(in, inTx, func(ctx context.Context, tx pgx.Tx, d *outbox.Delivery) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+effects+` VALUES ($1)`, d.ID)
		return err
	})
	count := func() (rows, distinct int) {
		if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT id) FROM `+effects).Scan(&rows, &distinct); err != nil {
			t.Fatal(err)
		}
		return rows, distinct
	}

	var crashed sync.Map // ids crashed on once
	crashes := 0
	for finished := false; !finished; {
		if crashes > 200 {
			t.Fatal("more than 200 crashes")
		}
		c, err := amqp.Dial(testURL())
		if err != nil {
			t.Fatal(err)
		}
		h := func(ctx context.Context, d *outbox.Delivery) error {
			if err := work(ctx, d); err != nil {
				return err
			}
			f := fnv.New32a()
			f.Write([]byte(d.ID))
			if f.Sum32()%500 == 0 {
				if _, again := crashed.LoadOrStore(d.ID, true); !again {
					_ = c.Close() // the process dies: committed, not acked
				}
			}
			return nil
		}
		rctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() { errc <- outboxamqp.Consume(rctx, c, cfg, h) }()
		testenv.Await(t, fmt.Sprintf("%d effects and an empty queue, or a crash", n), func() (any, bool) {
			select {
			case err := <-errc:
				if err == nil {
					t.Fatal("Consume returned nil with its context live")
				}
				crashes++
				return nil, true
			default:
			}
			rows, _ := count()
			left := depth(t, conn, cfg.Queue.Name)
			if rows >= n && left == 0 {
				// Stop; what is in flight is acked or goes back to the queue.
				cancel()
				if err := testenv.AwaitRecv(t, "Consume to return once its context ended", errc); err != nil {
					t.Fatal(err)
				}
				finished = depth(t, conn, cfg.Queue.Name) == 0
				return nil, true
			}
			return fmt.Sprintf("%d of %d effects, %d in the queue, %d crashes", rows, n, left, crashes), false
		})
		cancel()
		_ = c.Close()
	}
	rows, distinct := count()
	t.Logf("%d messages, %d crashes before the ack", n, crashes)
	if rows != n || distinct != n || crashes == 0 {
		t.Fatalf("%d effects (%d distinct) for %d messages with %d crashes; want exactly one each", rows, distinct, n, crashes)
	}
	if left := depth(t, conn, cfg.Queue.Name+".dead"); left != 0 {
		t.Fatalf("%d messages dead-lettered", left)
	}
}

// TestDialConsumeReconnects cuts the connection of DialConsume: it dials again and goes
// on, and the message in flight at the cut is delivered again.
func TestDialConsumeReconnects(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	cfg := consumerConfig(t, outboxamqp.Queue{})
	declareConsumer(t, conn, cfg)
	proxy := testproxy.New(t, testHostPort(t))

	var mu sync.Mutex
	seen := map[string]int{}
	cut := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- outboxamqp.DialConsume(ctx, viaAddr(t, proxy.Addr()), cfg, func(ctx context.Context, d *outbox.Delivery) error {
			mu.Lock()
			seen[string(d.Payload)]++
			first := string(d.Payload) == "0" && seen["0"] == 1
			mu.Unlock()
			if first {
				<-cut // the connection breaks while this one is in progress
			}
			return nil
		})
	}()
	publishN(t, conn, cfg.Queue.Name, 1, 1)
	awaitSeen := func(what, payload string, n int) {
		t.Helper()
		testenv.Await(t, what, func() (any, bool) {
			mu.Lock()
			defer mu.Unlock()
			return fmt.Sprint("deliveries ", seen), seen[payload] == n
		})
	}
	awaitSeen("the first delivery", "0", 1)
	proxy.Cut()
	close(cut)
	proxy.Restore(t)
	awaitSeen("the redelivery", "0", 2)
	publishN(t, conn, cfg.Queue.Name, 2, 1) // payloads 0 and 1 again: 1 is new
	awaitSeen("a message after the reconnect", "1", 1)
	cancel()
	if err := testenv.AwaitRecv(t, "DialConsume to return once its context ended", errc); err != nil {
		t.Fatal(err)
	}

	// The first connection failing is an error, not a retry loop.
	bad := viaAddr(t, "127.0.0.1:1")
	if err := outboxamqp.DialConsume(testenv.Context(t), bad, cfg, func(context.Context, *outbox.Delivery) error { return nil }); err == nil {
		t.Fatal("DialConsume to a closed port returned nil")
	} else if strings.Contains(err.Error(), "guest:guest") {
		t.Fatalf("credentials in the error: %v", err)
	}
}

func ExampleConsume() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conn, err := amqp.Dial(testURL()) // "amqp://guest:guest@127.0.0.1:5672/"
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	cfg := outboxamqp.ConsumerConfig{
		// Declared by Consume with a dead-letter exchange to orders.retry, which sends
		// rejected messages back after RetryDelay; given-up ones go to orders.dead.
		Queue:       outboxamqp.Queue{Name: "outboxamqp-example.consume"},
		MaxAttempts: 5,
		RetryDelay:  time.Second,
		Concurrency: 4,
	}
	defer deleteQueue("outboxamqp-example.consume")
	defer deleteQueue("outboxamqp-example.consume.retry")
	defer deleteQueue("outboxamqp-example.consume.dead")

	done := make(chan struct{})
	handler := func(ctx context.Context, d *outbox.Delivery) error {
		// Use outbox.InboxHandler for exactly-once effects in your database.
		fmt.Printf("%s %s for %s, attempt %d\n", d.EventType, d.Payload, d.Key, d.Attempt)
		close(done)
		return nil
	}
	errc := make(chan error, 1)
	go func() { errc <- outboxamqp.Consume(ctx, conn, cfg, handler) }()

	// The relay publishes; here by hand, once Consume has declared the queue.
	pub, err := outboxamqp.New(conn, outboxamqp.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	msg := &outbox.Message{ID: outbox.NewID(), Topic: cfg.Queue.Name, Key: "order-42", EventType: "order.placed", Payload: []byte(`{"total":42}`)}
	for pub.CheckRoute(ctx, msg) != nil {
		time.Sleep(10 * time.Millisecond)
	}
	if errs := pub.Publish(ctx, []*outbox.Message{msg}); errs != nil {
		log.Fatal(errs)
	}

	<-done
	cancel() // graceful: the handler in progress finishes and acks first
	if err := <-errc; err != nil {
		log.Fatal(err)
	}
	// Output: order.placed {"total":42} for order-42, attempt 1
}
