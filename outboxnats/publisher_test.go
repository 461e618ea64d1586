package outboxnats_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testnats"
	"github.com/outboxkit/outbox/outboxnats"
)

// testBundle is what most tests need: a publisher on the shared server and a fresh
// stream capturing its subject prefix.
type testBundle struct {
	pub    *outboxnats.Publisher
	js     jetstream.JetStream
	stream string
	prefix string
}

func setup(t *testing.T, cfg outboxnats.Config) *testBundle {
	t.Helper()
	js := testnats.JetStream(t, "")
	stream, prefix := testnats.Stream(t, js)
	cfg.Route = prefix + "{topic}"
	pub, err := outboxnats.New(js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{pub: pub, js: js, stream: stream, prefix: prefix}
}

// readAll reads n messages of stream with an ordered consumer, in stream order, and
// fails if the stream holds more once n have arrived, or if fewer arrive and their number
// stops growing for testenv.Stall().
func readAll(t *testing.T, js jetstream.JetStream, stream string, n int) []jetstream.Msg {
	t.Helper()
	testenv.Await(t, fmt.Sprintf("%d messages in stream %s", n, stream), func() (any, bool) {
		ctx, cancel := testenv.CallContext() // per poll
		defer cancel()
		info, err := js.Stream(ctx, stream)
		if err != nil {
			return err, false
		}
		got := info.CachedInfo().State.Msgs
		return got, got >= uint64(n)
	})
	cons, err := js.OrderedConsumer(testenv.Context(t), stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatalf("ordered consumer on %s: %v", stream, err)
	}
	var out []jetstream.Msg
	testenv.Await(t, fmt.Sprintf("reading %d messages of stream %s", n, stream), func() (any, bool) {
		// A fetch that ends empty is retried: only a read that stops advancing fails.
		batch, err := cons.Fetch(n-len(out), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatalf("fetch: %v", err)
		}
		for m := range batch.Messages() {
			out = append(out, m)
		}
		if batch.Error() != nil && !errors.Is(batch.Error(), nats.ErrTimeout) {
			t.Fatalf("fetch: %v", batch.Error())
		}
		return len(out), len(out) >= n
	})
	info, err := js.Stream(testenv.Context(t), stream)
	if err != nil {
		t.Fatal(err)
	}
	if got := info.CachedInfo().State.Msgs; got != uint64(n) {
		t.Fatalf("stream %s holds %d messages, want %d", stream, got, n)
	}
	return out
}

func TestPublishRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxnats.Config{})

	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	created := time.Date(2026, 3, 4, 5, 6, 7, 891011121, time.FixedZone("X", 3600))
	m1 := testenv.Message("orders", "order-42", binary)
	m1.DedupKey = "dedup-" + m1.ID.String()
	m1.AggregateType = "order"
	m1.EventType = "order.placed"
	m1.CreatedAt = created
	m1.Headers = map[string]string{"X-Trace": "abc-123", "x-lower": "v", "Empty": ""}

	// The largest payload that fits the server's max_payload next to its headers, less
	// a margin: near 1 MiB on a default server.
	big := bytes.Repeat([]byte("0123456789abcdef"), (int(b.js.Conn().MaxPayload())-8<<10)/16)
	m2 := testenv.Message("orders.big", "", big)
	m2.ContentType = "application/x-big"

	testenv.RequirePublishedAll(t, b.pub.Publish(testenv.Context(t), []*outbox.Message{m1, m2}))

	got := readAll(t, b.js, b.stream, 2)
	if s := got[0].Subject(); s != b.prefix+"orders" {
		t.Errorf("subject = %q, want %q", s, b.prefix+"orders")
	}
	if !bytes.Equal(got[0].Data(), binary) {
		t.Errorf("binary payload changed: % x", got[0].Data())
	}
	h := got[0].Headers()
	want := map[string]string{
		jetstream.MsgIDHeader:      m1.DedupKey,
		outbox.HeaderID:            m1.ID.String(),
		outbox.HeaderDedupKey:      m1.DedupKey,
		outbox.HeaderKey:           "order-42",
		outbox.HeaderAggregateType: "order",
		outbox.HeaderEventType:     "order.placed",
		outbox.HeaderTopic:         "orders",
		outbox.HeaderCreatedAt:     "2026-03-04T04:06:07.891011121Z",
		outbox.HeaderContentType:   outbox.ContentTypeBinary,
		"X-Trace":                  "abc-123",
		"x-lower":                  "v",
		"Empty":                    "",
	}
	for k, v := range want {
		if vs, ok := h[k]; !ok || len(vs) != 1 || vs[0] != v {
			t.Errorf("header %s = %q, want [%q]", k, vs, v)
		}
	}
	if parsed, err := time.Parse(time.RFC3339Nano, h.Get(outbox.HeaderCreatedAt)); err != nil || !parsed.Equal(created) {
		t.Errorf("created at %q does not parse back to %v: %v", h.Get(outbox.HeaderCreatedAt), created, err)
	}

	if s := got[1].Subject(); s != b.prefix+"orders.big" {
		t.Errorf("subject = %q, want %q", s, b.prefix+"orders.big")
	}
	if !bytes.Equal(got[1].Data(), big) {
		t.Errorf("big payload changed (len %d, want %d)", len(got[1].Data()), len(big))
	}
	h = got[1].Headers()
	if h.Get(jetstream.MsgIDHeader) != m2.DedupKey || h.Get(outbox.HeaderContentType) != "application/x-big" {
		t.Errorf("big message headers = %v", h)
	}
	for _, k := range []string{outbox.HeaderKey, outbox.HeaderAggregateType, outbox.HeaderEventType, outbox.HeaderCreatedAt} {
		if _, ok := h[k]; ok {
			t.Errorf("header %s set for an empty field: %q", k, h[k])
		}
	}
}

func TestPublishRoute(t *testing.T) {
	t.Parallel()
	js := testnats.JetStream(t, "")
	stream, prefix := testnats.Stream(t, js)
	pub, err := outboxnats.New(js, outboxnats.Config{Route: prefix + "{aggregate_type}.{key}"})
	if err != nil {
		t.Fatal(err)
	}
	m := testenv.Message("orders", "42", []byte("x"))
	m.AggregateType = "order"
	noType := testenv.Message("orders", "43", []byte("x"))
	errs := pub.Publish(testenv.Context(t), []*outbox.Message{m, noType})
	if errs == nil || errs[0] != nil || !errors.Is(errs[1], outbox.ErrUnroutable) || outbox.IsOutage(errs[1]) {
		t.Fatalf("Publish = %v, want the first confirmed and the second rejected as unroutable", errs)
	}
	if got := readAll(t, js, stream, 1)[0].Subject(); got != prefix+"order.42" {
		t.Errorf("subject = %q, want %q", got, prefix+"order.42")
	}
}

func TestPublishDedupByMsgID(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxnats.Config{})
	m := testenv.Message("orders", "k", []byte(`{"n":1}`))
	ctx := testenv.Context(t)
	testenv.RequirePublishedAll(t, b.pub.Publish(ctx, []*outbox.Message{m}))
	// A relay retrying after an ambiguous outcome sends the same message again.
	again := *m
	testenv.RequirePublishedAll(t, b.pub.Publish(ctx, []*outbox.Message{&again}))
	// A different event with the same dedup key is dropped as well: the broker
	// deduplicates on the dedup key, not on the id.
	other := testenv.Message("orders", "k", []byte(`{"n":2}`))
	other.DedupKey = m.DedupKey
	testenv.RequirePublishedAll(t, b.pub.Publish(ctx, []*outbox.Message{other}))

	got := readAll(t, b.js, b.stream, 1)
	if string(got[0].Data()) != `{"n":1}` {
		t.Errorf("stored %s, want the first copy", got[0].Data())
	}
}

func TestPublishBatchOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxnats.Config{})
	const n = 1000
	topics := []string{"a", "b.c", "d"}
	batch := make([]*outbox.Message, n)
	for i := range batch {
		batch[i] = testenv.Message(topics[i%len(topics)], "key-"+strconv.Itoa(i), []byte(strconv.Itoa(i)))
	}
	testenv.RequirePublishedAll(t, b.pub.Publish(testenv.Context(t), batch))

	got := readAll(t, b.js, b.stream, n)
	last := map[string]int{}
	for _, m := range got {
		i, err := strconv.Atoi(string(m.Data()))
		if err != nil {
			t.Fatalf("payload %q", m.Data())
		}
		if want := b.prefix + topics[i%len(topics)]; m.Subject() != want {
			t.Fatalf("message %d on subject %q, want %q", i, m.Subject(), want)
		}
		if prev, ok := last[m.Subject()]; ok && prev >= i {
			t.Fatalf("subject %s: message %d stored after %d", m.Subject(), i, prev)
		}
		last[m.Subject()] = i
	}
}

// TestPublishMaxPendingConcurrent runs batches larger than MaxPending from several
// goroutines at once: every message must be acked exactly once, and Publish must not
// deadlock waiting for slots.
func TestPublishMaxPendingConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxnats.Config{MaxPending: 7})
	const workers, per = 8, 50
	ctx := testenv.Context(t)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			batch := make([]*outbox.Message, per)
			for i := range batch {
				batch[i] = testenv.Message("w"+strconv.Itoa(w), fmt.Sprint(w, "-", i), []byte(strconv.Itoa(i)))
			}
			for i, err := range b.pub.Publish(ctx, batch) {
				if err != nil {
					t.Errorf("worker %d message %d: %v", w, i, err)
				}
			}
		})
	}
	wg.Wait()
	readAll(t, b.js, b.stream, workers*per)
}

func TestPublishRejectsOversized(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxnats.Config{})
	limit := int(b.js.Conn().MaxPayload())
	batch := []*outbox.Message{
		testenv.Message("ok1", "1", []byte("a")),
		testenv.Message("big", "2", make([]byte, limit+1)),
		// Fits max_payload alone, not with the headers, which count against it too.
		testenv.Message("big", "3", make([]byte, limit-10)),
		testenv.Message("ok2", "4", []byte("b")),
	}
	errs := b.pub.Publish(testenv.Context(t), batch)
	if len(errs) != len(batch) {
		t.Fatalf("errs = %v, want %d entries", errs, len(batch))
	}
	for _, i := range []int{0, 3} {
		if errs[i] != nil {
			t.Errorf("message %d: %v", i, errs[i])
		}
	}
	for _, i := range []int{1, 2} {
		switch err := errs[i]; {
		case err == nil:
			t.Errorf("oversized message %d was accepted", i)
		case outbox.IsOutage(err):
			t.Errorf("oversized message %d is an outage, want a rejection: %v", i, err)
		case !errors.Is(err, nats.ErrMaxPayload) || !strings.Contains(err.Error(), "max_payload"):
			t.Errorf("oversized message %d: %v, want nats.ErrMaxPayload", i, err)
		}
	}
	readAll(t, b.js, b.stream, 2)
}

func TestPublishRejectsInvalidSubject(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxnats.Config{})
	topics := []string{"good", "a..b", "trailing.", "*", "a.>", "has space", "a.*.b", "also.good"}
	batch := make([]*outbox.Message, len(topics))
	for i, topic := range topics {
		batch[i] = testenv.Message(topic, strconv.Itoa(i), []byte(topic))
	}
	errs := b.pub.Publish(testenv.Context(t), batch)
	if len(errs) != len(batch) {
		t.Fatalf("errs = %v, want %d entries", errs, len(batch))
	}
	for i, topic := range topics {
		err := errs[i]
		if valid := strings.HasSuffix(topic, "good"); valid {
			if err != nil {
				t.Errorf("topic %q: %v", topic, err)
			}
			continue
		}
		switch {
		case err == nil:
			t.Errorf("topic %q was accepted", topic)
		case outbox.IsOutage(err):
			t.Errorf("topic %q: outage, want a rejection: %v", topic, err)
		case !errors.Is(err, nats.ErrBadSubject) || !strings.Contains(err.Error(), b.prefix+topic):
			t.Errorf("topic %q: %v, want nats.ErrBadSubject naming the subject", topic, err)
		}
	}
	readAll(t, b.js, b.stream, 2)
}

// TestPublishAPIErrors checks the classification of JetStream's answers on a real
// server: a message over the stream's max_msg_size is rejected; a stream that is full
// and discards new messages is backpressure, an outage.
func TestPublishAPIErrors(t *testing.T) {
	t.Parallel()
	js := testnats.JetStream(t, "")
	ctx := testenv.Context(t)
	name := strings.ToUpper(testnats.Unique())
	prefix := strings.ToLower(name) + "."
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       name,
		Subjects:   []string{prefix + ">"},
		Storage:    jetstream.MemoryStorage,
		MaxMsgSize: 1024,
		MaxMsgs:    2,
		Discard:    jetstream.DiscardNew,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	pub, err := outboxnats.New(js, outboxnats.Config{Route: prefix + "{topic}"})
	if err != nil {
		t.Fatal(err)
	}

	errs := pub.Publish(ctx, []*outbox.Message{
		testenv.Message("x", "1", []byte("small")),
		testenv.Message("x", "2", make([]byte, 1025)),
	})
	if len(errs) != 2 || errs[0] != nil {
		t.Fatalf("errs = %v, want only the second to fail", errs)
	}
	if outbox.IsOutage(errs[1]) || !errors.Is(errs[1], jetstream.ErrStreamMessageExceedsMaximum) {
		t.Errorf("over max_msg_size: %v, want a rejection matching ErrStreamMessageExceedsMaximum", errs[1])
	}

	errs = pub.Publish(ctx, []*outbox.Message{testenv.Message("x", "3", []byte("fills"))})
	testenv.RequirePublishedAll(t, errs)
	errs = pub.Publish(ctx, []*outbox.Message{testenv.Message("x", "4", []byte("too many"))})
	if len(errs) != 1 || !outbox.IsOutage(errs[0]) {
		t.Errorf("full stream with discard new: %v, want an outage", errs)
	}
	var apiErr *jetstream.APIError
	if len(errs) == 1 && !errors.As(errs[0], &apiErr) {
		t.Errorf("full stream: %v does not carry the JetStream API error", errs[0])
	}
}

func TestPublishNoStreamIsDestinationOutage(t *testing.T) {
	t.Parallel()
	js := testnats.JetStream(t, "")
	prefix := testnats.Unique() + "." // no stream captures it
	pub, err := outboxnats.New(js, outboxnats.Config{Route: prefix + "{topic}"})
	if err != nil {
		t.Fatal(err)
	}
	batch := []*outbox.Message{testenv.Message("orders", "1", []byte("a")), testenv.Message("orders", "2", []byte("b"))}
	errs := pub.Publish(testenv.Context(t), batch)
	if len(errs) != len(batch) {
		t.Fatalf("errs = %v, want %d entries", errs, len(batch))
	}
	for i, err := range errs {
		if dest, ok := outbox.AsDestinationOutage(err); !ok || !errors.Is(err, outboxnats.ErrNoStream) || !strings.Contains(dest, prefix+"orders") {
			t.Errorf("message %d: %v, want an outage of its subject only, matching ErrNoStream", i, err)
		} else if !strings.Contains(err.Error(), `"`+prefix+`orders"`) {
			t.Errorf("message %d: %q does not name the subject", i, err)
		}
	}
}

func TestPublishCancelledContext(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxnats.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	batch := []*outbox.Message{testenv.Message("a", "1", []byte("a")), testenv.Message("a", "2", []byte("b"))}
	errs := b.pub.Publish(ctx, batch)
	if len(errs) != len(batch) {
		t.Fatalf("errs = %v, want %d entries", errs, len(batch))
	}
	for i, err := range errs {
		if !outbox.IsOutage(err) || !errors.Is(err, context.Canceled) {
			t.Errorf("message %d: %v, want an outage matching context.Canceled", i, err)
		}
	}
	info, err := b.js.Stream(testenv.Context(t), b.stream)
	if err != nil {
		t.Fatal(err)
	}
	if n := info.CachedInfo().State.Msgs; n != 0 {
		t.Errorf("%d messages stored, want none", n)
	}
}

func TestPublishEmptyBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxnats.Config{})
	if errs := b.pub.Publish(testenv.Context(t), nil); errs != nil {
		t.Errorf("Publish(nil) = %v", errs)
	}
}

func TestPing(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxnats.Config{})
	if err := b.pub.Ping(testenv.Context(t)); err != nil {
		t.Fatal(err)
	}
	// Without a deadline Ping sets its own.
	if err := b.pub.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestEnsureStreamAndCheckSubject(t *testing.T) {
	t.Parallel()
	js := testnats.JetStream(t, "")
	ctx := testenv.Context(t)
	pub, err := outboxnats.New(js, outboxnats.Config{})
	if err != nil {
		t.Fatal(err)
	}
	name := strings.ToUpper(testnats.Unique())
	base := strings.ToLower(name)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })

	if err := pub.CheckSubject(ctx, base+".orders"); !errors.Is(err, outboxnats.ErrNoStream) ||
		!strings.Contains(err.Error(), base+".orders") || !strings.Contains(err.Error(), base+".>") {
		t.Errorf("CheckSubject before the stream exists: %v, want ErrNoStream naming the subject and a filter", err)
	}
	if err := pub.EnsureStream(ctx, name, nil); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("EnsureStream of a missing stream without subjects: %v, want an error", err)
	}
	if err := pub.EnsureStream(ctx, name, []string{base + ".>"}); err != nil {
		t.Fatalf("EnsureStream create: %v", err)
	}
	if err := pub.EnsureStream(ctx, name, []string{base + ".>"}); err != nil {
		t.Errorf("EnsureStream again: %v", err)
	}
	if err := pub.EnsureStream(ctx, name, []string{base + ".orders.*"}); err != nil {
		t.Errorf("EnsureStream with a narrower filter: %v", err)
	}
	if err := pub.EnsureStream(ctx, name, nil); err != nil {
		t.Errorf("EnsureStream of an existing stream: %v", err)
	}
	err = pub.EnsureStream(ctx, name, []string{"elsewhere.>"})
	if err == nil || !strings.Contains(err.Error(), `"elsewhere.>"`) {
		t.Errorf("EnsureStream with a subject the stream does not capture: %v, want an error naming it", err)
	}
	if err := pub.CheckSubject(ctx, base+".orders"); err != nil {
		t.Errorf("CheckSubject: %v", err)
	}
	if err := pub.CheckSubject(ctx, base+"..x"); err == nil {
		t.Error("CheckSubject accepted an invalid subject")
	}
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	js := testnats.JetStream(t, "")
	for _, cfg := range []outboxnats.Config{
		{MaxPending: -1},
		{Route: "events.*.{topic}"},
		{Route: "events..{topic}"},
		{Route: "has space.{topic}"},
		{Route: "events.{nope}"},
		{Route: "events.{topic"},
	} {
		if _, err := outboxnats.New(js, cfg); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
	if _, err := outboxnats.New(nil, outboxnats.Config{}); err == nil {
		t.Error("New(nil) succeeded")
	}
}

func TestDialRedactsCredentials(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	_, err := outboxnats.Dial(ctx, "nats://alice:s3cret@127.0.0.1:1", outboxnats.Config{})
	if err == nil {
		t.Fatal("Dial to a closed port succeeded")
	}
	if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "alice") {
		t.Errorf("error leaks credentials: %v", err)
	}
	_, err = outboxnats.Dial(ctx, "nats://t0ken@127.0.0.1:1", outboxnats.Config{})
	if err == nil || strings.Contains(err.Error(), "t0ken") {
		t.Errorf("error leaks the token: %v", err)
	}
}

// TestPublishReservedSubjects: with the default route a topic is the subject, and a
// topic naming the JetStream API would delete or purge a stream. Such subjects are
// rejected (the message goes the retry and dead-letter way), never sent, and the stream
// lives on.
func TestPublishReservedSubjects(t *testing.T) {
	t.Parallel()
	js := testnats.JetStream(t, "")
	stream, _ := testnats.Stream(t, js)
	pub, err := outboxnats.New(js, outboxnats.Config{}) // route {topic}
	if err != nil {
		t.Fatal(err)
	}
	topics := []string{"$JS.API.STREAM.DELETE." + stream, "$JS.API.STREAM.PURGE." + stream,
		"$SYS.REQ.SERVER.PING", "$KV.bucket.key", "$O.store.x", "_INBOX.reply"}
	batch := make([]*outbox.Message, len(topics))
	for i, topic := range topics {
		batch[i] = testenv.Message(topic, strconv.Itoa(i), []byte(`{}`))
	}
	errs := pub.Publish(testenv.Context(t), batch)
	for i, topic := range topics {
		switch err := errs[i]; {
		case err == nil:
			t.Errorf("topic %q was published", topic)
		case outbox.IsOutage(err):
			t.Errorf("topic %q: outage, want a rejection: %v", topic, err)
		case !errors.Is(err, nats.ErrBadSubject) || !strings.Contains(err.Error(), "reserved"):
			t.Errorf("topic %q: %v, want nats.ErrBadSubject saying the subject is reserved", topic, err)
		}
	}
	ctx, cancel := testenv.CallContext()
	defer cancel()
	if _, err := js.Stream(ctx, stream); err != nil {
		t.Fatalf("stream %s after the publishes: %v", stream, err)
	}
}
