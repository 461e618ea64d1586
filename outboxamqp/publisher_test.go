package outboxamqp_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxamqp"
)

func TestPublishRoundTrip(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	q := declareQueue(t, conn, unique("roundtrip"), amqp.Table{"x-max-priority": 9})
	pub := newPublisher(t, conn, outboxamqp.Config{})

	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	created := time.Date(2026, 3, 4, 5, 6, 7, 0, time.FixedZone("X", 3600))
	m := testenv.Message(q, "order-42", binary)
	m.AggregateType = "order"
	m.EventType = "order.placed"
	m.CreatedAt = created
	m.Headers = map[string]string{"X-Trace": "abc-123", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", outboxamqp.HeaderPriority: "7"}
	plain := testenv.Message(q, "", nil)
	plain.DedupKey = ""
	plain.ContentType = ""

	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), []*outbox.Message{m, plain}))

	got := readQueue(t, conn, q, 2)
	if len(got) != 2 {
		t.Fatalf("queue holds %d messages, want 2", len(got))
	}
	// A priority queue delivers the higher priority first: m.
	d, p := got[0], got[1]
	if !bytes.Equal(d.Body, binary) {
		t.Errorf("body changed: % x", d.Body)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"message_id", d.MessageId, m.DedupKey},
		{"content_type", d.ContentType, outbox.ContentTypeBinary},
		{"delivery_mode", d.DeliveryMode, amqp.Persistent},
		{"priority", d.Priority, uint8(7)},
		{"type", d.Type, "order.placed"},
		{"timestamp", d.Timestamp.Unix(), created.Unix()},
		{"exchange", d.Exchange, ""},
		{"routing key", d.RoutingKey, q},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	m.WireHeaders(func(k, v string) {
		if d.Headers[k] != v {
			t.Errorf("header %s = %v, want %q", k, d.Headers[k], v)
		}
	})

	if p.MessageId != plain.ID.String() || p.Priority != 0 || len(p.Body) != 0 || p.ContentType != "" || !p.Timestamp.IsZero() {
		t.Errorf("plain message: id %q priority %d body %q content type %q timestamp %v", p.MessageId, p.Priority, p.Body, p.ContentType, p.Timestamp)
	}
}

func TestPublishPriorityFunc(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	q := declareQueue(t, conn, unique("priority"), amqp.Table{"x-max-priority": 9})
	pub := newPublisher(t, conn, outboxamqp.Config{Priority: func(m *outbox.Message) uint8 {
		if m.EventType == "payment.failed" {
			return 9
		}
		return 1
	}})
	low := testenv.Message(q, "a", []byte("low"))
	high := testenv.Message(q, "b", []byte("high"))
	high.EventType = "payment.failed"
	high.Headers = map[string]string{outboxamqp.HeaderPriority: "not used when Config.Priority is set"}
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), []*outbox.Message{low, high}))
	got := readQueue(t, conn, q, 2)
	if len(got) != 2 || string(got[0].Body) != "high" || got[0].Priority != 9 || got[1].Priority != 1 {
		t.Fatalf("deliveries = %v, want the high priority one first", got)
	}
}

// TestPublishRoute routes through a topic exchange by a template, as the seeds' layout
// does: critical and background queues bound by pattern.
func TestPublishRoute(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	ex := unique("events")
	declareExchange(t, conn, ex, amqp.ExchangeTopic, nil)
	billing := declareQueue(t, conn, unique("billing"), nil)
	notify := declareQueue(t, conn, unique("notify"), nil)
	bind(t, conn, billing, "billing.*", ex)
	bind(t, conn, notify, "notify.*", ex)
	pub := newPublisher(t, conn, outboxamqp.Config{Exchange: ex, Route: "{aggregate_type}.{event_type}"})

	var batch []*outbox.Message
	for i, agg := range []string{"billing", "notify", "billing"} {
		m := testenv.Message("t", strconv.Itoa(i), []byte(agg))
		m.AggregateType, m.EventType = agg, "changed"
		batch = append(batch, m)
	}
	noEvent := testenv.Message("t", "x", []byte("x"))
	noEvent.AggregateType = "billing"
	batch = append(batch, noEvent)

	errs := pub.Publish(testenv.Context(t), batch)
	if len(errs) != 4 || errs[0] != nil || errs[1] != nil || errs[2] != nil {
		t.Fatalf("errs = %v, want only the last to fail", errs)
	}
	var re *outbox.RouteError
	if !errors.As(errs[3], &re) || outbox.IsOutage(errs[3]) || !errors.Is(errs[3], outbox.ErrUnroutable) {
		t.Errorf("message without event type: %v, want a *outbox.RouteError rejection", errs[3])
	}
	if n := len(readQueue(t, conn, billing, 2)); n != 2 {
		t.Errorf("billing queue holds %d messages, want 2", n)
	}
	if n := len(readQueue(t, conn, notify, 1)); n != 1 {
		t.Errorf("notify queue holds %d messages, want 1", n)
	}
}

func requireUnroutable(t *testing.T, err error, key string) {
	t.Helper()
	var re *outboxamqp.ReturnError
	switch {
	case err == nil:
		t.Errorf("unroutable message %q was confirmed", key)
	case outbox.IsOutage(err):
		t.Errorf("unroutable message %q: outage, want a rejection: %v", key, err)
	case !errors.Is(err, outbox.ErrUnroutable) || !errors.As(err, &re):
		t.Errorf("unroutable message %q: %v, want a *ReturnError matching outbox.ErrUnroutable", key, err)
	case re.RoutingKey != key || re.Code != amqp.NoRoute:
		t.Errorf("unroutable message: %+v, want routing key %q and code %d", re, key, amqp.NoRoute)
	}
}

func TestPublishUnroutableIsRejected(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	q := declareQueue(t, conn, unique("routable"), nil)
	pub := newPublisher(t, conn, outboxamqp.Config{})
	missing := unique("no-such-queue")
	batch := []*outbox.Message{testenv.Message(q, "1", []byte("a")), testenv.Message(missing, "2", []byte("b")), testenv.Message(q, "3", []byte("c"))}
	errs := pub.Publish(testenv.Context(t), batch)
	if len(errs) != 3 || errs[0] != nil || errs[2] != nil {
		t.Fatalf("errs = %v, want only the unroutable one to fail", errs)
	}
	requireUnroutable(t, errs[1], missing)
	if !strings.Contains(errs[1].Error(), "alternate exchange") {
		t.Errorf("the error does not say what to do: %v", errs[1])
	}
	if n := queueLen(t, conn, q); n != 2 {
		t.Errorf("queue holds %d messages, want 2", n)
	}
}

// TestUnroutableNeverConfirmed is the guarantee behind "confirmed": RabbitMQ acks an
// unroutable mandatory message too, after returning it, and the publisher must never
// take that ack for a publish. Many concurrent Publish calls mix routable and unroutable
// messages (several sharing a channel over time, returns racing with acks of other
// messages); every unroutable one must fail as a rejection and every routable one must
// be confirmed and in its queue.
func TestUnroutableNeverConfirmed(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	q := declareQueue(t, conn, unique("mixed"), nil)
	pub := newPublisher(t, conn, outboxamqp.Config{MaxChannels: 4})
	const workers, rounds, per = 8, 20, 50
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		confirmed = map[string]bool{}
	)
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				batch := make([]*outbox.Message, per)
				for i := range batch {
					topic := q
					if (w+r+i)%3 == 0 {
						topic = fmt.Sprintf("nowhere-%d-%d-%d", w, r, i)
					}
					batch[i] = testenv.Message(topic, fmt.Sprintf("w%d-%d", w, i), []byte("x"))
				}
				ctx, cancel := testenv.CallContext() // per call: a hang bound, not a budget on the rounds
				errs := pub.Publish(ctx, batch)
				cancel()
				for i, m := range batch {
					var err error
					if errs != nil {
						err = errs[i]
					}
					if m.Topic != q {
						requireUnroutable(t, err, m.Topic)
						continue
					}
					if err != nil {
						t.Errorf("routable message: %v", err)
						continue
					}
					mu.Lock()
					confirmed[m.ID.String()] = true
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	got := readQueue(t, conn, q, len(confirmed))
	if len(got) != len(confirmed) {
		t.Errorf("queue holds %d messages, %d were confirmed", len(got), len(confirmed))
	}
	for _, d := range got {
		if !confirmed[d.Headers[outbox.HeaderID].(string)] {
			t.Errorf("message %v in the queue was not confirmed", d.Headers[outbox.HeaderID])
		}
	}
}

// TestAlternateExchange: with an alternate exchange no return comes, the message is
// parked in the alternate exchange's queue and the publish is confirmed.
func TestAlternateExchange(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	ae, ex := unique("ae"), unique("events")
	declareExchange(t, conn, ae, amqp.ExchangeFanout, nil)
	declareExchange(t, conn, ex, amqp.ExchangeTopic, amqp.Table{"alternate-exchange": ae})
	parking := declareQueue(t, conn, unique("unroutable"), nil)
	bind(t, conn, parking, "", ae)
	pub := newPublisher(t, conn, outboxamqp.Config{Exchange: ex})
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), []*outbox.Message{testenv.Message("nobody.binds.this", "k", []byte("x"))}))
	got := readQueue(t, conn, parking, 1)
	if len(got) != 1 || got[0].RoutingKey != "nobody.binds.this" {
		t.Fatalf("parking queue holds %v, want the message", got)
	}
}

// TestNackIsOutage: a queue at its max-length with x-overflow reject-publish makes
// RabbitMQ nack: backpressure, an outage.
func TestNackIsOutage(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	q := declareQueue(t, conn, unique("full"), amqp.Table{"x-max-length": 1, "x-overflow": "reject-publish"})
	pub := newPublisher(t, conn, outboxamqp.Config{})
	errs := pub.Publish(testenv.Context(t), []*outbox.Message{testenv.Message(q, "1", []byte("fits")), testenv.Message(q, "2", []byte("over"))})
	if len(errs) != 2 || errs[0] != nil {
		t.Fatalf("errs = %v, want the second to fail", errs)
	}
	var ne *outboxamqp.NackError
	if !outbox.IsOutage(errs[1]) || !errors.As(errs[1], &ne) || ne.RoutingKey != q {
		t.Errorf("over max-length: %v, want an outage with a *NackError", errs[1])
	}
	// The channel survives a nack.
	_, _ = channel(t, conn).QueuePurge(q, false)
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), []*outbox.Message{testenv.Message(q, "3", []byte("room again"))}))
}

// TestMissingExchangeIsOutage: a missing exchange closes the channel (404): every
// message in flight is an outage naming the exchange, and once the exchange exists the
// publisher works again on a fresh channel.
func TestMissingExchangeIsOutage(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	ex := unique("later")
	pub := newPublisher(t, conn, outboxamqp.Config{Exchange: ex, MaxChannels: 1})
	batch := []*outbox.Message{testenv.Message("a", "1", []byte("a")), testenv.Message("b", "2", []byte("b")), testenv.Message("c", "3", []byte("c"))}
	errs := pub.Publish(testenv.Context(t), batch)
	testenv.RequireAllOutages(t, errs, 3)
	var ae *amqp.Error
	if !errors.As(errs[0], &ae) || ae.Code != amqp.NotFound || !strings.Contains(errs[0].Error(), ex) {
		t.Errorf("missing exchange: %v, want the 404 naming the exchange", errs[0])
	}
	if err := pub.Ping(testenv.Context(t)); !outbox.IsOutage(err) || !strings.Contains(err.Error(), ex) {
		t.Errorf("Ping with a missing exchange = %v, want an outage naming it", err)
	}

	declareExchange(t, conn, ex, amqp.ExchangeDirect, nil)
	q := declareQueue(t, conn, unique("later"), nil)
	bind(t, conn, q, "a", ex)
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batch[:1]))
	if err := pub.Ping(testenv.Context(t)); err != nil {
		t.Errorf("Ping: %v", err)
	}
}

// TestRejectedBeforeSending: messages AMQP or the broker could never take are refused
// without being sent, so they cannot take the channel down with the others.
func TestRejectedBeforeSending(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	q := declareQueue(t, conn, unique("limits"), nil)
	pub := newPublisher(t, conn, outboxamqp.Config{MaxMessageSize: 1000})

	longKey := testenv.Message(strings.Repeat("k", 256), "1", []byte("x"))
	big := testenv.Message(q, "2", make([]byte, 1001))
	badPriority := testenv.Message(q, "3", []byte("x"))
	badPriority.Headers = map[string]string{outboxamqp.HeaderPriority: "high"}
	longDedup := testenv.Message(q, "4", []byte("x"))
	longDedup.DedupKey = strings.Repeat("d", 256)
	// Headers that do not fit one frame (128 KiB by default): RabbitMQ would close the
	// connection.
	hugeHeaders := testenv.Message(q, "5", []byte("x"))
	hugeHeaders.Headers = map[string]string{}
	for i := range 40 {
		hugeHeaders.Headers[fmt.Sprintf("H%d", i)] = strings.Repeat("v", 4000)
	}
	noTopic := testenv.Message("", "6", []byte("x"))
	ok := testenv.Message(q, "7", make([]byte, 1000))

	batch := []*outbox.Message{longKey, big, badPriority, longDedup, hugeHeaders, noTopic, ok}
	errs := pub.Publish(testenv.Context(t), batch)
	if len(errs) != len(batch) || errs[6] != nil {
		t.Fatalf("errs = %v, want all but the last to fail", errs)
	}
	for i, want := range []error{outboxamqp.ErrBadProperty, outboxamqp.ErrTooLarge, outboxamqp.ErrBadProperty,
		outboxamqp.ErrBadProperty, outboxamqp.ErrTooLarge, outbox.ErrUnroutable} {
		if outbox.IsOutage(errs[i]) || !errors.Is(errs[i], want) {
			t.Errorf("message %d: %v, want a rejection matching %v", i, errs[i], want)
		}
	}
	if n := queueLen(t, conn, q); n != 1 {
		t.Errorf("queue holds %d messages, want 1", n)
	}
}

// TestHeaderFrameLimit checks the publisher's size of the header frame against the
// server's: a message whose header frame is frame_max bytes by the publisher's count is
// published, one byte more is refused. Had the publisher counted short, the first would
// make RabbitMQ close the connection (it tolerates up to 8 bytes over frame_max, so a
// count short by more than that fails this test).
func TestHeaderFrameLimit(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	q := declareQueue(t, conn, unique("frame"), nil)
	pub := newPublisher(t, conn, outboxamqp.Config{})
	frameMax := conn.Config.FrameSize
	if frameMax <= 0 {
		t.Fatalf("no frame size negotiated")
	}
	build := func(extra int) *outbox.Message {
		m := testenv.Message(q, "k", []byte("x"))
		m.Headers = map[string]string{"Filler": ""}
		_, p, err := pub.Publishing(m)
		if err != nil {
			t.Fatal(err)
		}
		// Grow the filler until the frame is frameMax+extra bytes.
		size := 0
		for {
			m.Headers["Filler"] = strings.Repeat("f", size)
			_, p, err = pub.Publishing(m)
			if err != nil {
				return m
			}
			if n := outboxamqp.HeaderFrameSize(&p); n >= frameMax+extra {
				if n != frameMax+extra {
					t.Fatalf("frame size %d, want %d", n, frameMax+extra)
				}
				return m
			}
			size += max(1, frameMax+extra-outboxamqp.HeaderFrameSize(&p))
		}
	}
	fits := build(0)
	over := build(1)
	errs := pub.Publish(testenv.Context(t), []*outbox.Message{fits, over})
	if len(errs) != 2 || errs[0] != nil {
		t.Fatalf("errs = %v, want only the second to fail", errs)
	}
	if !errors.Is(errs[1], outboxamqp.ErrTooLarge) {
		t.Errorf("one byte over the frame: %v, want ErrTooLarge", errs[1])
	}
	if conn.IsClosed() {
		t.Fatal("the connection closed")
	}
	if n := queueLen(t, conn, q); n != 1 {
		t.Errorf("queue holds %d messages, want 1", n)
	}
}

func TestPublishCancelledContext(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	q := declareQueue(t, conn, unique("cancel"), nil)
	pub := newPublisher(t, conn, outboxamqp.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errs := pub.Publish(ctx, []*outbox.Message{testenv.Message(q, "1", []byte("a")), testenv.Message(q, "2", []byte("b"))})
	testenv.RequireAllOutages(t, errs, 2)
	if !errors.Is(errs[0], context.Canceled) {
		t.Errorf("%v, want context.Canceled", errs[0])
	}
	if n := queueLen(t, conn, q); n != 0 {
		t.Errorf("queue holds %d messages, want none", n)
	}
}

// TestPublishWaitsForFreeChannel: calls beyond MaxChannels wait, and give up with their
// ctx as an outage.
func TestPublishWaitsForFreeChannel(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	q := declareQueue(t, conn, unique("slots"), nil)
	pub := newPublisher(t, conn, outboxamqp.Config{MaxChannels: 2})
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			batch := make([]*outbox.Message, 100)
			for i := range batch {
				batch[i] = testenv.Message(q, fmt.Sprintf("%d-%d", w, i), []byte("x"))
			}
			testenv.PublishedAll(t, pub.Publish(testenv.Context(t), batch)) // not require: t.Fatal is for the test's goroutine
		})
	}
	wg.Wait()
	if n := queueLen(t, conn, q); n != 600 {
		t.Errorf("queue holds %d messages, want 600", n)
	}
}

func TestPublishEmptyBatch(t *testing.T) {
	t.Parallel()
	pub := newPublisher(t, dialTest(t), outboxamqp.Config{})
	if errs := pub.Publish(testenv.Context(t), nil); errs != nil {
		t.Errorf("Publish(nil) = %v", errs)
	}
}

func TestPing(t *testing.T) {
	t.Parallel()
	pub := newPublisher(t, dialTest(t), outboxamqp.Config{})
	if err := pub.Ping(testenv.Context(t)); err != nil {
		t.Fatal(err)
	}
	if err := pub.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	for _, tc := range []struct {
		cfg   outboxamqp.Config
		field string
	}{
		{outboxamqp.Config{Route: "{nope}"}, "Route"},
		{outboxamqp.Config{Route: "{topic"}, "Route"},
		{outboxamqp.Config{Route: strings.Repeat("r", 250) + ".{topic}"}, "Route"},
		{outboxamqp.Config{Exchange: strings.Repeat("e", 256)}, "Exchange"},
		{outboxamqp.Config{MaxChannels: -1}, "MaxChannels"},
		{outboxamqp.Config{MaxChannels: 5000}, "MaxChannels"},
		{outboxamqp.Config{MaxMessageSize: -1}, "MaxMessageSize"},
	} {
		_, err := outboxamqp.New(conn, tc.cfg)
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("New(%+v) = %v, want a *ConfigError for %s", tc.cfg, err, tc.field)
		}
	}
	if _, err := outboxamqp.New(nil, outboxamqp.Config{}); err == nil {
		t.Error("New(nil) succeeded")
	}
}

func TestNewRefusesRecoveringConnection(t *testing.T) {
	t.Parallel()
	conn, err := amqp.DialConfig(testURL(), amqp.Config{Recovery: &amqp.Recovery{}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := outboxamqp.New(conn, outboxamqp.Config{}); err == nil || !strings.Contains(err.Error(), "recovery") {
		t.Errorf("New on a recovering connection = %v, want an error", err)
	}
}

// TestClose: Close leaves a caller's connection open, is idempotent, and Publish and
// Ping fail as outages afterwards.
func TestClose(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	q := declareQueue(t, conn, unique("close"), nil)
	pub, err := outboxamqp.New(conn, outboxamqp.Config{})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), []*outbox.Message{testenv.Message(q, "1", []byte("a"))}))
	pub.Close()
	pub.Close()
	if conn.IsClosed() {
		t.Error("Close closed the caller's connection")
	}
	testenv.RequireAllOutages(t, pub.Publish(testenv.Context(t), []*outbox.Message{testenv.Message(q, "2", []byte("b"))}), 1)
	if err := pub.Ping(testenv.Context(t)); !outbox.IsOutage(err) {
		t.Errorf("Ping after Close = %v, want an outage", err)
	}
}

// TestCloseDuringPublish: Close while Publish calls are sending and waiting for
// confirms: every message is confirmed or an outage, and nothing hangs or races.
func TestCloseDuringPublish(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	q := declareQueue(t, conn, unique("closing"), nil)
	ctx := testenv.Context(t)
	pub, err := outboxamqp.Dial(ctx, testURL(), outboxamqp.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for r := 0; ; r++ {
				batch := make([]*outbox.Message, 50)
				for i := range batch {
					batch[i] = testenv.Message(q, fmt.Sprintf("%d-%d", w, i), make([]byte, 1024))
				}
				errs := pub.Publish(ctx, batch)
				for i, err := range errs {
					if err != nil && !outbox.IsOutage(err) {
						t.Errorf("message %d: %v, want success or an outage", i, err)
					}
				}
				if errs != nil {
					return
				}
			}
		})
	}
	time.Sleep(100 * time.Millisecond) // shapes the fault: let the publishers get going first
	go pub.Close()
	pub.Close()
	wg.Wait()
}

// TestCallerConnectionLost: with New, a closed connection makes Publish fail as an
// outage that says the caller must replace the publisher.
func TestCallerConnectionLost(t *testing.T) {
	t.Parallel()
	conn, err := amqp.Dial(testURL())
	if err != nil {
		t.Fatal(err)
	}
	pub := newPublisher(t, conn, outboxamqp.Config{})
	_ = conn.Close()
	// The publisher learns of the close asynchronously: until then a Publish may fail
	// otherwise, as an outage too.
	testenv.Await(t, "Publish to say the caller must replace the publisher", func() (any, bool) {
		ctx, cancel := testenv.CallContext() // per poll
		defer cancel()
		errs := pub.Publish(ctx, []*outbox.Message{testenv.Message("q", "1", []byte("a"))})
		testenv.RequireAllOutages(t, errs, 1)
		return errs[0], strings.Contains(errs[0].Error(), "caller owns the connection")
	})
}

func TestDialRedactsCredentials(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	for _, u := range []string{
		"amqp://alice:s3cret@127.0.0.1:1/",            // nothing listens
		"amqp://alice:s3cret@127.0.0.1:5672/no-vhost", // refused by the broker
		"amqp://alice:s3cret@127.0.0.1:port/",         // invalid
		"amqp://bob:wrong@127.0.0.1:5672/",            // bad password
	} {
		_, err := outboxamqp.Dial(ctx, u, outboxamqp.Config{})
		if err == nil {
			t.Errorf("Dial(%q) succeeded", outboxamqp.RedactURL(u))
			continue
		}
		for _, secret := range []string{"s3cret", "alice", "wrong"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("Dial error leaks %q: %v", secret, err)
			}
		}
	}
	_, err := outboxamqp.Dial(ctx, testURL(), outboxamqp.Config{TLS: &tls.Config{}})
	var ce *outbox.ConfigError
	if !errors.As(err, &ce) || ce.Field != "TLS" {
		t.Errorf("Dial with TLS and amqp:// = %v, want a *ConfigError for TLS", err)
	}
}

func TestCheckRoute(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	q := declareQueue(t, conn, unique("check"), nil)
	pub := newPublisher(t, conn, outboxamqp.Config{})
	ctx := testenv.Context(t)
	if err := pub.CheckRoute(ctx, &outbox.Message{Topic: q}); err != nil {
		t.Errorf("existing queue: %v", err)
	}
	missing := unique("missing")
	if err := pub.CheckRoute(ctx, &outbox.Message{Topic: missing}); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing queue: %v, want an error naming it", err)
	}
	if err := pub.CheckRoute(ctx, &outbox.Message{}); !errors.Is(err, outbox.ErrUnroutable) {
		t.Errorf("no topic: %v, want a route error", err)
	}

	ex := unique("check")
	withEx := newPublisher(t, conn, outboxamqp.Config{Exchange: ex})
	if err := withEx.CheckRoute(ctx, &outbox.Message{Topic: "x"}); err == nil || !strings.Contains(err.Error(), ex) {
		t.Errorf("missing exchange: %v, want an error naming it", err)
	}
	declareExchange(t, conn, ex, amqp.ExchangeTopic, nil)
	if err := withEx.CheckRoute(ctx, &outbox.Message{Topic: "x"}); err != nil {
		t.Errorf("existing exchange: %v", err)
	}
}

// BenchmarkPublish publishes as the relay does by default: 8 concurrent Publish calls of
// 250 messages of 130 bytes, persistent, to one durable queue. It reports msgs/s.
func BenchmarkPublish(b *testing.B) {
	conn, err := amqp.Dial(testURL())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	q := unique("bench")
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	defer deleteQueue(q)
	pub, err := outboxamqp.New(conn, outboxamqp.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	const workers, batchSize = 8, 250
	payload := make([]byte, 130)
	b.ResetTimer()
	var wg sync.WaitGroup
	next := make(chan int, workers)
	go func() {
		for left := b.N; left > 0; left -= batchSize {
			next <- min(left, batchSize)
		}
		close(next)
	}()
	for w := range workers {
		wg.Go(func() {
			for n := range next {
				batch := make([]*outbox.Message, n)
				for i := range batch {
					batch[i] = testenv.Message(q, fmt.Sprintf("w%d-%d", w, i), payload)
				}
				if errs := pub.Publish(context.Background(), batch); errs != nil {
					b.Errorf("publish: %v", errs)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
