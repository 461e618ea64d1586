package outboxkafka_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxkafka"
)

func TestPublishRoundTrip(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 3, nil)
	pub := tc.dial(t, outboxkafka.Config{Route: topic})

	created := time.Date(2026, 3, 4, 5, 6, 7, 891011121, time.FixedZone("X", 3600))
	m1 := testenv.Message("orders", "order-42", []byte{0, 1, 2, 0xff})
	m1.AggregateType = "order"
	m1.EventType = "order.placed"
	m1.CreatedAt = created
	m1.Headers = map[string]string{
		"traceparent":   "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"x-lower":       "v",
		"Empty":         "",
		outbox.HeaderID: "forged", // a metadata header wins, and is not sent twice
	}
	m2 := testenv.Message("orders", "", nil) // no key, no payload
	m2.ContentType = ""
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), []*outbox.Message{m1, m2}))

	got := map[string]*kgo.Record{}
	for _, r := range tc.read(t, topic, 2) {
		got[headerMap(r)[outbox.HeaderID]] = r
	}
	if len(got) != 2 {
		t.Fatalf("read %d distinct records, want 2", len(got))
	}
	r := got[m1.ID.String()]
	if r == nil {
		t.Fatal("m1 is not in the topic")
	}
	if string(r.Key) != "order-42" || !bytes.Equal(r.Value, m1.Payload) {
		t.Errorf("key %q value % x, want order-42 and % x", r.Key, r.Value, m1.Payload)
	}
	want := map[string]string{
		outbox.HeaderID:            m1.ID.String(),
		outbox.HeaderDedupKey:      m1.DedupKey,
		outbox.HeaderKey:           "order-42",
		outbox.HeaderAggregateType: "order",
		outbox.HeaderEventType:     "order.placed",
		outbox.HeaderTopic:         "orders",
		outbox.HeaderCreatedAt:     "2026-03-04T04:06:07.891011121Z",
		outbox.HeaderContentType:   outbox.ContentTypeBinary,
		"traceparent":              m1.Headers["traceparent"],
		"x-lower":                  "v",
		"Empty":                    "",
	}
	if len(r.Headers) != len(want) {
		t.Errorf("%d headers %v, want %d", len(r.Headers), r.Headers, len(want))
	}
	for k, v := range want {
		if got := headerMap(r)[k]; got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}

	r = got[m2.ID.String()]
	if r == nil {
		t.Fatal("m2 is not in the topic")
	}
	if r.Key != nil {
		t.Errorf("key %q, want null for a message without a key", r.Key)
	}
	if r.Value == nil || len(r.Value) != 0 {
		t.Errorf("value %v, want empty and not null (a null value is a tombstone)", r.Value)
	}
	for _, k := range []string{outbox.HeaderKey, outbox.HeaderContentType, outbox.HeaderCreatedAt} {
		if _, ok := headerMap(r)[k]; ok {
			t.Errorf("header %s set for an empty field", k)
		}
	}
}

// TestPublishKeyPartition checks that the record key is the ordering key, so that the
// messages of a key share a partition, in order.
func TestPublishKeyPartition(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 8, nil)
	pub := tc.dial(t, outboxkafka.Config{Route: topic})
	const keys, rounds = 20, 10
	for seq := range rounds {
		var batch []*outbox.Message
		for k := range keys {
			batch = append(batch, testenv.Message("x", "key-"+strconv.Itoa(k), []byte(strconv.Itoa(seq))))
		}
		testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batch))
	}
	partition := map[string]int32{}
	last := map[string]int{}
	for _, r := range tc.read(t, topic, keys*rounds) {
		k := string(r.Key)
		if p, ok := partition[k]; ok && p != r.Partition {
			t.Errorf("key %s in partitions %d and %d", k, p, r.Partition)
		}
		partition[k] = r.Partition
		seq, _ := strconv.Atoi(string(r.Value))
		if prev, ok := last[k]; ok && seq <= prev {
			t.Errorf("key %s: %d after %d", k, seq, prev)
		}
		last[k] = seq
	}
	if len(last) != keys {
		t.Errorf("read %d keys, want %d", len(last), keys)
	}
}

func TestPublishRouteTemplate(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	a := tc.createTopic(t, 1, nil)
	b := tc.createTopic(t, 1, nil)
	pub := tc.dial(t, outboxkafka.Config{Route: "{aggregate_type}"})
	ma := testenv.Message("ignored", "1", []byte("a"))
	ma.AggregateType = a
	mb := testenv.Message("ignored", "2", []byte("b"))
	mb.AggregateType = b
	noType := testenv.Message("ignored", "3", []byte("c"))
	errs := pub.Publish(testenv.Context(t), []*outbox.Message{ma, noType, mb})
	if len(errs) != 3 || errs[0] != nil || errs[2] != nil {
		t.Fatalf("errs = %v, want only the message without an aggregate type to fail", errs)
	}
	if !errors.Is(errs[1], outbox.ErrUnroutable) || outbox.IsOutage(errs[1]) {
		t.Errorf("no aggregate type: %v, want a rejection matching outbox.ErrUnroutable", errs[1])
	}
	for topic, want := range map[string]string{a: "a", b: "b"} {
		rs := tc.read(t, topic, 1)
		if len(rs) != 1 || string(rs[0].Value) != want {
			t.Errorf("topic %s holds %d records, want only %q", topic, len(rs), want)
		}
	}
}

func TestPublishRejectsInvalidTopic(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	good := tc.createTopic(t, 1, nil)
	pub := tc.dial(t, outboxkafka.Config{Route: "{topic}"})
	topics := []string{good, "has space", "slash/no", "ü", strings.Repeat("x", 250), "..", good}
	batch := make([]*outbox.Message, len(topics))
	for i, topic := range topics {
		batch[i] = testenv.Message(topic, strconv.Itoa(i), []byte("x"))
	}
	errs := pub.Publish(testenv.Context(t), batch)
	if len(errs) != len(batch) {
		t.Fatalf("errs = %v, want %d entries", errs, len(batch))
	}
	for i, topic := range topics {
		err := errs[i]
		switch {
		case topic == good && err != nil:
			t.Errorf("topic %q: %v", topic, err)
		case topic == good:
		case err == nil:
			t.Errorf("topic %.20q was accepted", topic)
		case outbox.IsOutage(err) || !errors.Is(err, kerr.InvalidTopicException):
			t.Errorf("topic %.20q: %v, want a rejection matching kerr.InvalidTopicException", topic, err)
		}
	}
	if n := len(tc.read(t, good, 2)); n != 2 {
		t.Errorf("%d records in %s, want 2", n, good)
	}
}

// TestPublishTooLargeForClient sends a record over MaxMessageBytes: franz-go refuses it
// without sending it, a rejection; the rest of the batch goes through.
func TestPublishTooLargeForClient(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 1, nil)
	pub := tc.dial(t, outboxkafka.Config{Route: topic, MaxMessageBytes: 64 << 10})
	batch := []*outbox.Message{
		testenv.Message("x", "1", []byte("small")),
		testenv.Message("x", "2", make([]byte, 64<<10)), // over with the headers and framing
		testenv.Message("x", "3", []byte("small")),
	}
	errs := pub.Publish(testenv.Context(t), batch)
	if len(errs) != 3 || errs[0] != nil || errs[2] != nil {
		t.Fatalf("errs = %v, want only the large message to fail", errs)
	}
	if outbox.IsOutage(errs[1]) || !errors.Is(errs[1], kerr.MessageTooLarge) || !strings.Contains(errs[1].Error(), "MaxMessageBytes") {
		t.Errorf("large message: %v, want a rejection matching kerr.MessageTooLarge naming MaxMessageBytes", errs[1])
	}
	if n := len(tc.read(t, topic, 2)); n != 2 {
		t.Errorf("%d records in the topic, want 2", n)
	}
}

// TestPublishWriteLimits publishes the largest message Write accepts with its default
// limits (outbox.Limits{}) through a publisher with its default MaxMessageBytes to a
// topic with the broker's default max.message.bytes: what Write accepts by default must
// be published, not refused at publish time and dead-lettered. The message has a payload
// at MaxPayloadBytes, random so that compression cannot shrink it, MaxHeaders own
// headers filling MaxHeaderBytes, and every name Write bounds at 255 bytes (each of
// them travels as a header, the key also as the record key).
func TestPublishWriteLimits(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 1, nil)
	pub := tc.dial(t, outboxkafka.Config{Route: topic})

	name := func(c string) string { return strings.Repeat(c, 255) }
	m := outbox.Message{
		Topic:         name("t"),
		Key:           name("k"),
		AggregateType: name("a"),
		EventType:     name("e"),
		ContentType:   "application/" + strings.Repeat("x", 255-len("application/")),
		DedupKey:      name("d"),
		CreatedAt:     time.Date(2026, 3, 4, 5, 6, 7, 891011121, time.UTC),
		Payload:       randomBytes(outbox.MaxPayloadBytesDefault),
		Headers:       map[string]string{},
	}
	// Names and values of 128 bytes: each of their lengths takes 2 bytes in the record,
	// about the most framing the headers can have within MaxHeaderBytes.
	const half = outbox.MaxHeaderBytesDefault / outbox.MaxHeadersDefault / 2
	for i := range outbox.MaxHeadersDefault {
		prefix := fmt.Sprintf("x-%02d-", i)
		m.Headers[prefix+strings.Repeat("n", half-len(prefix))] = strings.Repeat("v", half)
	}
	prepared := []outbox.Message{m}
	if err := (outbox.Limits{}).Prepare(prepared); err != nil {
		t.Fatalf("Write refuses the message: %v", err)
	}
	// At the limits: a byte more of payload or of headers, and Write refuses it.
	more := m
	more.Payload = append(bytes.Clone(m.Payload), 0)
	if err := (outbox.Limits{}).Prepare([]outbox.Message{more}); err == nil || !strings.Contains(err.Error(), "MaxPayloadBytes") {
		t.Fatalf("a byte more of payload: %v, want a refusal naming Limits.MaxPayloadBytes", err)
	}
	more = m
	more.Headers = maps.Clone(m.Headers)
	for k, v := range more.Headers {
		more.Headers[k] = v + "v"
		break
	}
	if err := (outbox.Limits{}).Prepare([]outbox.Message{more}); err == nil || !strings.Contains(err.Error(), "MaxHeaderBytes") {
		t.Fatalf("a byte more of headers: %v, want a refusal naming Limits.MaxHeaderBytes", err)
	}

	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), []*outbox.Message{&prepared[0]}))
	rs := tc.read(t, topic, 1)
	if len(rs) != 1 {
		t.Fatalf("%d records in the topic, want 1", len(rs))
	}
	r := rs[0]
	if string(r.Key) != m.Key || !bytes.Equal(r.Value, m.Payload) || len(r.Headers) != outbox.MaxHeadersDefault+8 {
		t.Errorf("record with a key of %d bytes, a value of %d bytes and %d headers, want %d, %d and %d",
			len(r.Key), len(r.Value), len(r.Headers), len(m.Key), len(m.Payload), outbox.MaxHeadersDefault+8)
	}
}

// TestPublishTooLargeForTopic sends a record the client accepts and the broker refuses
// (over the topic's max.message.bytes) in one batch with records that fit. The broker
// refuses the whole record batch; the publisher sends the records again one by one, so
// that only the large one is rejected.
func TestPublishTooLargeForTopic(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 1, map[string]string{"max.message.bytes": strconv.Itoa(64 << 10)})
	// The linger puts the whole Publish in one record batch.
	pub := tc.dial(t, outboxkafka.Config{Route: topic, Compression: "none"}, kgo.ProducerLinger(50*time.Millisecond))
	var batch []*outbox.Message
	for i := range 10 {
		batch = append(batch, testenv.Message("x", strconv.Itoa(i), make([]byte, 1000)))
	}
	batch[4].Payload = make([]byte, 80<<10)
	errs := pub.Publish(testenv.Context(t), batch)
	if len(errs) != len(batch) {
		t.Fatalf("errs = %v, want %d entries", errs, len(batch))
	}
	for i, err := range errs {
		switch {
		case i == 4 && (err == nil || outbox.IsOutage(err) || !errors.Is(err, kerr.MessageTooLarge)):
			t.Errorf("large message: %v, want a rejection matching kerr.MessageTooLarge", err)
		case i != 4 && err != nil:
			t.Errorf("message %d, batched with the large one: %v", i, err)
		}
	}
	if n := len(tc.read(t, topic, 9)); n != 9 {
		t.Errorf("%d records in the topic, want 9", n)
	}
}

// TestPublishConcurrent runs batches from several goroutines at once, more records
// than MaxBufferedRecords: every message is acknowledged exactly once, without deadlock.
func TestPublishConcurrent(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 4, nil)
	pub := tc.dial(t, outboxkafka.Config{Route: topic, MaxBufferedRecords: 7})
	const workers, per = 8, 50
	ctx := testenv.Context(t)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			batch := make([]*outbox.Message, per)
			for i := range batch {
				batch[i] = testenv.Message("x", fmt.Sprint(w, "-", i), []byte(strconv.Itoa(i)))
			}
			for i, err := range pub.Publish(ctx, batch) {
				if err != nil {
					t.Errorf("worker %d message %d: %v", w, i, err)
				}
			}
		})
	}
	wg.Wait()
	if n := len(tc.read(t, topic, workers*per)); n != workers*per {
		t.Errorf("%d records in the topic, want %d", n, workers*per)
	}
}

func TestPublishEmptyBatch(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	pub := tc.dial(t, outboxkafka.Config{})
	if errs := pub.Publish(testenv.Context(t), nil); errs != nil {
		t.Errorf("Publish(nil) = %v", errs)
	}
}

func TestPublishCancelledContext(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 1, nil)
	pub := tc.dial(t, outboxkafka.Config{Route: topic})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errs := pub.Publish(ctx, []*outbox.Message{testenv.Message("a", "1", []byte("a")), testenv.Message("a", "2", []byte("b"))})
	if len(errs) != 2 {
		t.Fatalf("errs = %v, want 2 entries", errs)
	}
	for i, err := range errs {
		if !outbox.IsOutage(err) || !errors.Is(err, context.Canceled) {
			t.Errorf("message %d: %v, want an outage matching context.Canceled", i, err)
		}
	}
	if n := len(tc.read(t, topic, 0)); n != 0 {
		t.Errorf("%d records in the topic, want none", n)
	}
}

func TestPing(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	pub := tc.dial(t, outboxkafka.Config{})
	if err := pub.Ping(testenv.Context(t)); err != nil {
		t.Fatal(err)
	}
	if err := pub.Ping(context.Background()); err != nil { // sets its own deadline
		t.Fatal(err)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	for _, tc2 := range []struct {
		cfg   outboxkafka.Config
		field string
	}{
		{outboxkafka.Config{Route: "events/{topic}"}, "Route"},
		{outboxkafka.Config{Route: "events.{nope}"}, "Route"},
		{outboxkafka.Config{Route: "{topic"}, "Route"},
		{outboxkafka.Config{Route: "has space.{topic}"}, "Route"},
		{outboxkafka.Config{Route: strings.Repeat("x", 250) + "{topic}"}, "Route"},
		{outboxkafka.Config{Compression: "brotli"}, "Compression"},
		{outboxkafka.Config{MaxMessageBytes: 100}, "MaxMessageBytes"},
		{outboxkafka.Config{MaxMessageBytes: 100<<20 + 1}, "MaxMessageBytes"},
		{outboxkafka.Config{MaxBufferedRecords: -1}, "MaxBufferedRecords"},
	} {
		_, err := outboxkafka.Dial(testenv.Context(t), tc.seeds, tc2.cfg)
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc2.field {
			t.Errorf("Dial(%+v) = %v, want a ConfigError for %s", tc2.cfg, err, tc2.field)
		}
	}
	if _, err := outboxkafka.Dial(testenv.Context(t), nil, outboxkafka.Config{}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("Dial without seeds = %v, want ErrInvalidConfig", err)
	}
	if _, err := outboxkafka.New(nil, outboxkafka.Config{}); err == nil {
		t.Error("New(nil) succeeded")
	}
}

// TestNewChecksClient checks that New refuses clients that cannot give the package's
// guarantees, and Dial options that would make its client one.
func TestNewChecksClient(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	for name, opt := range map[string]kgo.Opt{
		"leader ack":    kgo.RequiredAcks(kgo.LeaderAck()),
		"no ack":        kgo.RequiredAcks(kgo.NoAck()),
		"idempotence":   kgo.DisableIdempotentWrite(),
		"transactional": kgo.TransactionalID("txn"),
		"manual flush":  kgo.ManualFlushing(),
		"topic always":  kgo.DefaultProduceTopicAlways(),
	} {
		opts := []kgo.Opt{opt}
		switch name {
		case "leader ack", "no ack":
			opts = append(opts, kgo.DisableIdempotentWrite()) // franz-go requires it for acks other than all
		case "topic always":
			opts = append(opts, kgo.DefaultProduceTopic("x"))
		}
		if _, err := outboxkafka.New(tc.client(t, opts...), outboxkafka.Config{}); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("New with %s: %v, want ErrInvalidConfig", name, err)
		}
		if _, err := outboxkafka.Dial(testenv.Context(t), tc.seeds, outboxkafka.Config{}, opts...); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("Dial with %s: %v, want ErrInvalidConfig", name, err)
		}
	}
	// Client options belong to the client New is given.
	for _, cfg := range []outboxkafka.Config{{Compression: "zstd"}, {MaxMessageBytes: 1 << 20}, {MaxBufferedRecords: 5}, {ClientID: "x"}} {
		var ce *outbox.ConfigError
		if _, err := outboxkafka.New(tc.client(t), cfg); !errors.As(err, &ce) {
			t.Errorf("New(%+v) = %v, want a ConfigError", cfg, err)
		}
	}
	if _, err := outboxkafka.New(tc.client(t), outboxkafka.Config{Route: "events.{topic}"}); err != nil {
		t.Errorf("New with a default client: %v", err)
	}
}

// TestNewDoesNotOwnClient checks that Close leaves a caller's client open.
func TestNewDoesNotOwnClient(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 1, nil)
	cl := tc.client(t)
	pub, err := outboxkafka.New(cl, outboxkafka.Config{Route: topic})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), []*outbox.Message{testenv.Message("x", "1", []byte("a"))}))
	pub.Close()
	errs := pub.Publish(testenv.Context(t), []*outbox.Message{testenv.Message("x", "2", []byte("b"))})
	if len(errs) != 1 || !outbox.IsOutage(errs[0]) || !errors.Is(errs[0], kgo.ErrClientClosed) {
		t.Errorf("Publish after Close: %v, want an outage matching kgo.ErrClientClosed", errs)
	}
	if err := cl.ProduceSync(testenv.Context(t), &kgo.Record{Topic: topic, Value: []byte("mine")}).FirstErr(); err != nil {
		t.Errorf("the caller's client after Close: %v", err)
	}
}

// TestDialUnreachable: a Dial that cannot connect fails, by its ctx at the latest (the
// 1 s deadline is the input), naming the address. "By its ctx" is checked without a
// clock: the error is the refused connection (franz-go does not retry it) or the
// deadline, never another timeout of the client's own; a Dial that ignores its ctx and
// hangs fails after testenv.Stall().
func TestDialUnreachable(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t, time.Second)
	done := make(chan error, 1)
	go func() {
		_, err := outboxkafka.Dial(ctx, []string{"127.0.0.1:1"}, outboxkafka.Config{})
		done <- err
	}()
	err := testenv.AwaitRecv(t, "Dial to a closed port with a 1 s deadline to return", done)
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("Dial to a closed port: %v, want an error naming the address", err)
	}
	if err != nil && !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Dial to a closed port: %v, want the refused connection or the ctx's deadline as the cause", err)
	}
}
