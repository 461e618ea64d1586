package outboxredis_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxredis"
)

// testBundle is what most tests need: a publisher on the shared server, a direct client
// to check what arrived, and a fresh stream name the publisher's route sends to.
type testBundle struct {
	pub    *outboxredis.Publisher
	c      *redis.Client
	stream string
}

// setup returns a publisher whose route is the fresh stream name, unless cfg has one
// ("{topic}" and the like: the test sends to topics it names after b.stream).
func setup(t *testing.T, cfg outboxredis.Config) *testBundle {
	t.Helper()
	c := newClient(t, sharedAddr())
	stream := uniqueStream(t, c)
	if cfg.Route == "" {
		cfg.Route = stream
	}
	pub, err := outboxredis.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{pub: pub, c: c, stream: stream}
}

// rawEntry is one entry's fields in the order Redis stores them.
type rawEntry struct {
	id     string
	fields []string // name, value, name, value, ...
}

func rawEntries(t *testing.T, c *redis.Client, stream string) []rawEntry {
	t.Helper()
	res, err := c.Do(testenv.Context(t), "XRANGE", stream, "-", "+").Slice()
	if err != nil {
		t.Fatalf("XRANGE %s: %v", stream, err)
	}
	out := make([]rawEntry, len(res))
	for i, r := range res {
		e := r.([]any)
		out[i].id = e[0].(string)
		for _, f := range e[1].([]any) {
			out[i].fields = append(out[i].fields, f.(string))
		}
	}
	return out
}

func TestPublishEntryLayout(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxredis.Config{})

	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	created := time.Date(2026, 3, 4, 5, 6, 7, 891011121, time.FixedZone("X", 3600))
	m1 := newMsg("orders", "order-42", binary)
	m1.AggregateType = "order"
	m1.EventType = "order.placed"
	m1.CreatedAt = created
	m1.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "Empty": ""}
	// A message with only the required fields, and own headers named like metadata
	// headers: the metadata values win and each field appears once.
	m2 := &outbox.Message{ID: outbox.NewID(), Topic: "orders", Payload: nil,
		Headers: map[string]string{outbox.HeaderID: "forged", outbox.HeaderTopic: "forged", "X-A": "a"}}

	testenv.RequirePublishedAll(t, b.pub.Publish(testenv.Context(t), []*outbox.Message{m1, m2}))

	got := rawEntries(t, b.c, b.stream)
	if len(got) != 2 {
		t.Fatalf("stream holds %d entries, want 2", len(got))
	}
	want := [][]string{{
		"payload", string(binary),
		"h:traceparent", m1.Headers["traceparent"],
		"h:Empty", "",
		"h:Outbox-Id", m1.ID.String(),
		"h:Outbox-Dedup-Key", m1.DedupKey,
		"h:Outbox-Key", "order-42",
		"h:Outbox-Aggregate-Type", "order",
		"h:Outbox-Event-Type", "order.placed",
		"h:Outbox-Topic", "orders",
		"h:Outbox-Created-At", "2026-03-04T04:06:07.891011121Z",
		"h:Content-Type", outbox.ContentTypeBinary,
	}, {
		"payload", "",
		"h:Outbox-Id", m2.ID.String(),
		"h:Outbox-Topic", "orders",
		"h:X-A", "a",
		"h:Outbox-Dedup-Key", m2.ID.String(),
	}}
	for i, e := range got {
		if e.fields[0] != "payload" {
			t.Errorf("entry %d: first field %q, want payload", i, e.fields[0])
		}
		if len(e.fields) != len(want[i]) {
			t.Errorf("entry %d: %d fields %q, want %d", i, len(e.fields)/2, e.fields, len(want[i])/2)
		}
		gotMap := map[string]string{}
		for k := 0; k+1 < len(e.fields); k += 2 {
			if _, dup := gotMap[e.fields[k]]; dup {
				t.Errorf("entry %d: field %q appears twice", i, e.fields[k])
			}
			gotMap[e.fields[k]] = e.fields[k+1]
		}
		for k := 0; k < len(want[i]); k += 2 {
			if v, ok := gotMap[want[i][k]]; !ok || v != want[i][k+1] {
				t.Errorf("entry %d: field %q = %q (present %v), want %q", i, want[i][k], v, ok, want[i][k+1])
			}
		}
	}

	// ParseEntry gives consumers the same view.
	es := entries(t, b.c, b.stream)
	if !bytes.Equal(es[0].Payload, binary) || es[0].ID != got[0].id || es[0].DedupKey() != m1.DedupKey ||
		es[0].Headers[outbox.HeaderContentType] != outbox.ContentTypeBinary {
		t.Errorf("ParseEntry = %+v", es[0])
	}
	if len(es[1].Payload) != 0 || es[1].Headers[outbox.HeaderID] != m2.ID.String() {
		t.Errorf("ParseEntry = %+v", es[1])
	}
}

func TestFieldsMatchPublish(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxredis.Config{})
	m := newMsg("orders", "k", []byte("p"))
	m.Headers = map[string]string{"X-A": "a"}
	testenv.RequirePublishedAll(t, b.pub.Publish(testenv.Context(t), []*outbox.Message{m}))
	var want []string
	for _, f := range outboxredis.Fields(m) {
		switch f := f.(type) {
		case string:
			want = append(want, f)
		case []byte:
			want = append(want, string(f))
		}
	}
	if got := rawEntries(t, b.c, b.stream)[0].fields; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("entry fields %q, Fields %q", got, want)
	}
}

func TestRoute(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxredis.Config{Route: "{aggregate_type}.{key}"})
	ok := newMsg("t", b.stream, []byte("x"))
	ok.AggregateType = "agg"
	noAgg := newMsg("t", b.stream, []byte("x"))
	errs := b.pub.Publish(testenv.Context(t), []*outbox.Message{noAgg, ok})
	if len(errs) != 2 || errs[1] != nil {
		t.Fatalf("errs = %v, want only the first to fail", errs)
	}
	if !errors.Is(errs[0], outbox.ErrUnroutable) || outbox.IsOutage(errs[0]) {
		t.Errorf("empty route field: %v, want a rejection matching ErrUnroutable", errs[0])
	}
	if n := b.c.XLen(testenv.Context(t), "agg."+b.stream).Val(); n != 1 {
		t.Errorf("stream agg.%s holds %d entries, want 1", b.stream, n)
	}
}

func TestWrongTypeRejectsOnlyItsMessage(t *testing.T) {
	t.Parallel()
	for _, cfg := range []outboxredis.Config{{}, {DedupWindow: time.Minute}} {
		t.Run(fmt.Sprintf("DedupWindow=%v", cfg.DedupWindow), func(t *testing.T) {
			t.Parallel()
			cfg.Route = "{topic}"
			b := setup(t, cfg)
			list := b.stream + ".list"
			b.c.LPush(testenv.Context(t), list, "x")
			good := newMsg(b.stream, "a", []byte("x"))
			bad := newMsg(list, "b", []byte("x"))
			errs := b.pub.Publish(testenv.Context(t), []*outbox.Message{good, bad})
			if len(errs) != 2 || errs[0] != nil || errs[1] == nil || outbox.IsOutage(errs[1]) {
				t.Fatalf("errs = %v, want the second to be a rejection", errs)
			}
			if !strings.Contains(errs[1].Error(), "WRONGTYPE") || !strings.Contains(errs[1].Error(), list) {
				t.Errorf("rejection %q does not say WRONGTYPE and name the stream", errs[1])
			}
		})
	}
}

func TestMaxLen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		exact bool
		check func(n int64) bool
	}{
		{exact: true, check: func(n int64) bool { return n == 10 }},
		// Approximate trimming drops whole nodes: at least 10 entries stay, fewer than sent.
		{exact: false, check: func(n int64) bool { return n >= 10 && n < 1000 }},
	} {
		t.Run(fmt.Sprintf("exact=%v", tc.exact), func(t *testing.T) {
			t.Parallel()
			b := setup(t, outboxredis.Config{MaxLen: 10, MaxLenExact: tc.exact})
			for range 10 {
				testenv.RequirePublishedAll(t, b.pub.Publish(testenv.Context(t), batchOf("t", 100))) // per call
			}
			if n := b.c.XLen(testenv.Context(t), b.stream).Val(); !tc.check(n) {
				t.Errorf("after 1000 messages the stream holds %d entries", n)
			}
		})
	}
}

func TestDedupWindow(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxredis.Config{DedupWindow: time.Minute})
	ctx := testenv.Context(t)
	m := newMsg("t", "k", []byte("x"))
	other := newMsg("t", "k2", []byte("y"))
	testenv.RequirePublishedAll(t, b.pub.Publish(ctx, []*outbox.Message{m}))
	// The relay retries m after an unknown outcome, next to a new message.
	testenv.RequirePublishedAll(t, b.pub.Publish(ctx, []*outbox.Message{m, other}))
	es := entries(t, b.c, b.stream)
	if len(es) != 2 || es[0].DedupKey() != m.DedupKey || es[1].DedupKey() != other.DedupKey {
		t.Fatalf("stream holds %d entries %+v, want m once and other", len(es), es)
	}

	marker := "{" + b.stream + "}" + outboxredis.DedupMarkerInfix + m.DedupKey
	if id := b.c.Get(ctx, marker).Val(); id != es[0].ID {
		t.Errorf("marker %s = %q, want the entry ID %q", marker, id, es[0].ID)
	}
	if ttl := b.c.PTTL(ctx, marker).Val(); ttl <= 0 || ttl > time.Minute {
		t.Errorf("marker TTL %v, want within (0, 1m]", ttl)
	}

	// The bound: once the marker is gone (the window passed), a retry adds a second copy.
	b.c.Del(ctx, marker)
	testenv.RequirePublishedAll(t, b.pub.Publish(ctx, []*outbox.Message{m}))
	if n := b.c.XLen(ctx, b.stream).Val(); n != 3 {
		t.Errorf("stream holds %d entries after the marker expired, want 3", n)
	}
}

func TestMarkerOnBrokenMarkerKey(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxredis.Config{DedupWindow: time.Minute})
	m := newMsg("t", "k", []byte("x"))
	b.c.LPush(testenv.Context(t), "{"+b.stream+"}"+outboxredis.DedupMarkerInfix+m.DedupKey, "x")
	errs := b.pub.Publish(testenv.Context(t), []*outbox.Message{m})
	if len(errs) != 1 || errs[0] == nil || outbox.IsOutage(errs[0]) {
		t.Fatalf("errs = %v, want a rejection (the marker key holds a list)", errs)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: sharedAddr(), ReadTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": sharedAddr()}})
	t.Cleanup(func() { _ = ring.Close() })
	for _, tc := range []struct {
		field   string
		client  redis.UniversalClient
		cfg     outboxredis.Config
		newOnly bool // about the client New is given
	}{
		{"Route", c, outboxredis.Config{Route: "events.{nope}"}, false},
		{"Route", c, outboxredis.Config{Route: "events.{topic"}, false},
		{"MaxLen", c, outboxredis.Config{MaxLen: -1}, false},
		{"MaxLenExact", c, outboxredis.Config{MaxLenExact: true}, false},
		{"DedupWindow", c, outboxredis.Config{DedupWindow: -time.Second}, false},
		{"DedupWindow", c, outboxredis.Config{DedupWindow: time.Microsecond}, false},
		{"WaitReplicas", c, outboxredis.Config{WaitReplicas: -1}, false},
		{"WaitTimeout", c, outboxredis.Config{WaitTimeout: -time.Second}, false},
		{"WaitTimeout", c, outboxredis.Config{WaitReplicas: 1, WaitTimeout: time.Microsecond}, false},
		{"WaitTimeout", c, outboxredis.Config{WaitReplicas: 1, WaitTimeout: 2 * time.Second}, true}, // the client's ReadTimeout
		{"WaitReplicas", ring, outboxredis.Config{WaitReplicas: 1}, true},
	} {
		_, err := outboxredis.New(tc.client, tc.cfg)
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field || !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want a *outbox.ConfigError for %s", tc.cfg, err, tc.field)
		}
		if tc.newOnly {
			continue
		}
		_, err = outboxredis.Dial(testenv.Context(t), "redis://"+sharedAddr(), tc.cfg)
		if !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("Dial(%+v) = %v, want a *outbox.ConfigError for %s", tc.cfg, err, tc.field)
		}
	}
	if _, err := outboxredis.New(nil, outboxredis.Config{}); err == nil {
		t.Error("New(nil) succeeded")
	}
	// Without WaitReplicas a Ring and any timeout are fine.
	if _, err := outboxredis.New(ring, outboxredis.Config{WaitTimeout: time.Hour}); err != nil {
		t.Error(err)
	}
}

func TestDialErrorsHideCredentials(t *testing.T) {
	t.Parallel()
	for _, url := range []string{
		"redis://user:s3cret@127.0.0.1:1/0", // nothing listens on port 1
		"redis://:s3cret@127.0.0.1:1",
		"redis://s3cret@127.0.0.1:1",
		"redis://outbox-nosuchuser:s3cret@" + sharedAddr(), // the server refuses the password
		"redis://:s3cret@127.0.0.1:6379/x",                 // bad database
		"redis://:s3cret@127.0.0.1:6379/0?nope=1",
		"redis://:s3cret@[::1%zz]:6379", // url.Parse fails and would quote it
		"ftp://:s3cret@127.0.0.1:6379",
	} {
		_, err := outboxredis.Dial(testenv.Context(t), url, outboxredis.Config{})
		if err == nil {
			t.Errorf("Dial(%s) succeeded", url)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Dial error shows the secret: %v", err)
		}
	}
}

func TestDialOwnsItsClient(t *testing.T) {
	t.Parallel()
	c := newClient(t, sharedAddr())
	name := "outboxredis-owned-" + strings.TrimPrefix(uniqueStream(t, c), "outboxredis-test-")
	pub, err := outboxredis.Dial(testenv.Context(t), "redis://"+sharedAddr()+"?client_name="+name, outboxredis.Config{})
	if err != nil {
		t.Fatal(err)
	}
	conns := func() int {
		ctx, cancel := testenv.CallContext()
		defer cancel()
		list := c.ClientList(ctx).Val()
		return strings.Count(list, "name="+name+" ")
	}
	if n := conns(); n == 0 {
		t.Fatalf("no connection named %s after Dial", name)
	}
	pub.Close()
	testenv.Await(t, "the owned connections to close", func() (any, bool) {
		n := conns()
		return n, n == 0
	})
	pub.Close()
}

func TestCloseLeavesTheCallersClient(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxredis.Config{})
	b.pub.Close()
	b.pub.Close()
	requireAll(t, b.pub.Publish(testenv.Context(t), batchOf("t", 3)), 3, true)
	if err := b.pub.Ping(testenv.Context(t)); !outbox.IsOutage(err) {
		t.Errorf("Ping after Close = %v, want an outage", err)
	}
	if err := b.c.Ping(testenv.Context(t)).Err(); err != nil {
		t.Errorf("the caller's client no longer works after Close: %v", err)
	}
}

func TestCloseDuringPublish(t *testing.T) {
	t.Parallel()
	c := newClient(t, sharedAddr())
	stream := uniqueStream(t, c)
	ctx := testenv.Context(t)
	pub, err := outboxredis.Dial(ctx, "redis://"+sharedAddr(), outboxredis.Config{Route: stream})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	confirmed := map[string]bool{}
	for range 4 {
		wg.Go(func() {
			for range 50 {
				batch := batchOf("t", 20)
				errs := pub.Publish(ctx, batch)
				mu.Lock()
				for i, m := range batch {
					switch {
					case errs == nil || errs[i] == nil:
						confirmed[m.ID.String()] = true
					case !outbox.IsOutage(errs[i]):
						t.Errorf("after Close: %v, want an outage", errs[i])
					}
				}
				mu.Unlock()
			}
		})
	}
	time.Sleep(10 * time.Millisecond) // shapes the fault: close while the publishers are busy
	pub.Close()
	wg.Wait()
	have := map[string]bool{}
	for _, e := range entries(t, c, stream) {
		have[e.Headers[outbox.HeaderID]] = true
	}
	for id := range confirmed {
		if !have[id] {
			t.Errorf("message %s was confirmed but is not in the stream", id)
		}
	}
}

func TestCancelledContext(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxredis.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errs := b.pub.Publish(ctx, batchOf("t", 3))
	requireAll(t, errs, 3, true)
	if !errors.Is(errs[0], context.Canceled) {
		t.Errorf("%v does not wrap context.Canceled", errs[0])
	}
	if n := b.c.XLen(testenv.Context(t), b.stream).Val(); n != 0 {
		t.Errorf("the stream holds %d entries: a cancelled Publish sent", n)
	}
}

func TestCheckStream(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxredis.Config{Route: "{topic}"})
	ctx := testenv.Context(t)
	b.c.Set(ctx, b.stream+".string", "x", 0)
	b.c.XAdd(ctx, &redis.XAddArgs{Stream: b.stream + ".stream", Values: []string{"f", "v"}})
	for topic, ok := range map[string]bool{b.stream + ".none": true, b.stream + ".stream": true, b.stream + ".string": false} {
		err := b.pub.CheckStream(ctx, &outbox.Message{Topic: topic})
		if (err == nil) != ok {
			t.Errorf("CheckStream(%s) = %v, want ok %v", topic, err, ok)
		}
		if err != nil && !strings.Contains(err.Error(), topic) {
			t.Errorf("CheckStream error %q does not name the key", err)
		}
	}
	if err := b.pub.CheckStream(ctx, &outbox.Message{}); !errors.Is(err, outbox.ErrUnroutable) {
		t.Errorf("CheckStream of a message without a topic = %v, want ErrUnroutable", err)
	}
}

func TestPing(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxredis.Config{})
	if err := b.pub.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
}
