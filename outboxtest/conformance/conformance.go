// Package conformance is the test suite every outbox.Publisher must pass, run against
// its broker's real server. Each broker package of this module runs it in its tests; a
// publisher written elsewhere proves itself the same way:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conformance.Broker{
//			Destination: func(t *testing.T) string { ... create a fresh queue ... },
//			Publisher:   func(t *testing.T, route string) outbox.Publisher { ... },
//			Read:        func(t *testing.T, dest string, n int) []conformance.Received { ... },
//		})
//	}
//
// The suite checks what the relay relies on: a nil error means the broker holds the
// message; per-key order across sequential batches and concurrent Publish calls; the
// payload (binary, empty and large), content type and headers arrive intact; the
// broker's deduplication id is the dedup key; a cancelled context fails the batch as an
// outage; a batch with one refused message confirms the others and reports a rejection
// (not an outage) for that one; and, when the broker can be cut off, an outage in the
// middle of a stream loses nothing, burns nothing and heals once the broker is back.
package conformance

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

// Broker is what a publisher's test gives the suite.
type Broker struct {
	// Destination prepares a fresh, empty destination for one subtest (a stream, a
	// queue, a topic) and returns its name. The suite sends messages there with a Route
	// that has no placeholders, so the name is the route template. Required.
	Destination func(t *testing.T) string

	// Publisher returns a new publisher sending by the route template (see
	// outbox.ParseRoute). Register its Close with t.Cleanup. When Cut is set, the
	// publisher must reach the broker through whatever Cut breaks. Required.
	Publisher func(t *testing.T, route string) outbox.Publisher

	// Read returns the messages stored at dest, in the broker's order per key, waiting
	// until at least n are there, and then returning all there are. When fewer come, it
	// waits as long as their number grows, and returns those once it stops growing for
	// a while (the suite then reports what is missing): it bounds a hang, never how long
	// the broker may take on a slow machine. Required.
	Read func(t *testing.T, dest string, n int) []Received

	// Reject returns a message, for dest, that the broker refuses on its merits (too
	// large, unroutable, ...), or nil when it has none. Nil skips the partial-batch test.
	Reject func(t *testing.T, dest string) *outbox.Message

	// Cut breaks the connection between the publishers and the broker (a proxy that
	// drops every connection and refuses new ones, or a stopped server) until Restore
	// heals it. Nil skips the outage test.
	Cut, Restore func(t *testing.T)

	// MaxPayload is the largest payload the broker takes, when under 1 MiB; the large
	// payload round trip uses min(1 MiB, MaxPayload). Zero means 1 MiB.
	MaxPayload int
}

// Received is a message as a consumer reads it back from the broker.
type Received struct {
	// DedupID is where the broker deduplicates (Nats-Msg-Id, AMQP message-id, SQS
	// MessageDeduplicationId, ...), or the Outbox-Dedup-Key header where it has no such
	// field.
	DedupID string
	// Key is the ordering key as the broker carries it (the Kafka record key, else the
	// Outbox-Key header).
	Key         string
	ContentType string
	Headers     map[string]string // every header, the Outbox-* ones included
	Payload     []byte
}

// ID returns the Outbox-Id header.
func (r Received) ID() string { return r.Headers[outbox.HeaderID] }

// Run runs the suite as subtests of t.
func Run(t *testing.T, b Broker) {
	if b.Destination == nil || b.Publisher == nil || b.Read == nil {
		t.Fatal("conformance: Broker needs Destination, Publisher and Read")
	}
	t.Run("ConfirmMeansStored", func(t *testing.T) { confirmMeansStored(t, b) })
	t.Run("EmptyBatch", func(t *testing.T) { emptyBatch(t, b) })
	t.Run("PerKeyOrder", func(t *testing.T) { perKeyOrder(t, b) })
	t.Run("RoundTrip", func(t *testing.T) { roundTrip(t, b) })
	t.Run("DedupID", func(t *testing.T) { dedupID(t, b) })
	t.Run("CancelledContext", func(t *testing.T) { cancelledContext(t, b) })
	t.Run("PartialBatch", func(t *testing.T) {
		if b.Reject == nil {
			t.Skip("the broker has no message it refuses on its merits")
		}
		partialBatch(t, b)
	})
	t.Run("OutageMidStream", func(t *testing.T) {
		if b.Cut == nil || b.Restore == nil {
			t.Skip("no way to cut the broker off")
		}
		outageMidStream(t, b)
	})
}

// msg is a message as the relay hands it to Publish: id, key, topic and the fields the
// store fills.
func msg(key string, seq int, payload []byte) *outbox.Message {
	id := outbox.NewID()
	return &outbox.Message{
		ID:            id,
		Topic:         "conformance",
		Key:           key,
		AggregateType: "widget",
		EventType:     "widget.changed",
		Payload:       payload,
		ContentType:   outbox.ContentTypeJSON,
		DedupKey:      "dedup-" + id.String(),
		Seq:           int64(seq),
		CreatedAt:     time.Now().UTC(),
		Headers:       map[string]string{"Seq": strconv.Itoa(seq)},
	}
}

func jsonPayload(key string, seq int) []byte {
	return fmt.Appendf(nil, `{"key":%q,"seq":%d}`, key, seq)
}

func setup(t *testing.T, b Broker) (string, outbox.Publisher) {
	t.Helper()
	dest := b.Destination(t)
	if _, err := outbox.ParseRoute(dest); err != nil {
		t.Fatalf("destination %q is not a route template: %v", dest, err)
	}
	return dest, b.Publisher(t, dest)
}

func publishAll(t *testing.T, p outbox.Publisher, batch []*outbox.Message) {
	t.Helper()
	if err := publish(p, batch); err != nil {
		t.Fatal(err)
	}
}

// publish sends batch and says what failed, if anything; it is safe to call from any
// goroutine.
func publish(p outbox.Publisher, batch []*outbox.Message) error {
	ctx, cancel := testenv.CallContext() // bounds a hang
	defer cancel()
	errs := p.Publish(ctx, batch)
	if errs == nil {
		return nil
	}
	if len(errs) != len(batch) {
		return fmt.Errorf("Publish returned %d errors for a batch of %d", len(errs), len(batch))
	}
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("message %d of %d failed: %w", i, len(batch), err)
		}
	}
	return nil
}

func byID(rs []Received) map[string]Received {
	m := make(map[string]Received, len(rs))
	for _, r := range rs {
		if _, ok := m[r.ID()]; !ok {
			m[r.ID()] = r
		}
	}
	return m
}

func confirmMeansStored(t *testing.T, b Broker) {
	dest, p := setup(t, b)
	var batch []*outbox.Message
	for i := range 50 {
		key := "k" + strconv.Itoa(i)
		batch = append(batch, msg(key, 0, jsonPayload(key, 0)))
	}
	publishAll(t, p, batch)
	got := byID(b.Read(t, dest, len(batch)))
	for _, m := range batch {
		if _, ok := got[m.ID.String()]; !ok {
			t.Errorf("message %s was confirmed but is not at the broker", m.ID)
		}
	}
	if len(got) != len(batch) {
		t.Errorf("the broker holds %d distinct messages, %d were sent", len(got), len(batch))
	}
}

func emptyBatch(t *testing.T, b Broker) {
	_, p := setup(t, b)
	if errs := p.Publish(context.Background(), nil); errs != nil {
		t.Fatalf("Publish(nil) = %v, want nil", errs)
	}
}

// perKeyOrder sends as the relay does: several goroutines at once, each with its own
// keys, each batch holding at most one message per key, the next batch of a key only
// after the last one was confirmed.
func perKeyOrder(t *testing.T, b Broker) {
	dest, p := setup(t, b)
	const workers, keysPer, rounds = 4, 8, 25
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for seq := range rounds {
				var batch []*outbox.Message
				for k := range keysPer {
					key := fmt.Sprintf("w%d-k%d", w, k)
					batch = append(batch, msg(key, seq, jsonPayload(key, seq)))
				}
				if err := publish(p, batch); err != nil {
					t.Error(err) // Fatal is for the test's own goroutine
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	total := workers * keysPer * rounds
	got := b.Read(t, dest, total)
	if n := len(byID(got)); n != total {
		t.Fatalf("the broker holds %d distinct messages, %d were sent", n, total)
	}
	checkOrder(t, got)
}

// checkOrder checks that, per key, the first copies of the messages come in Seq header
// order. Later copies (redeliveries after an unknown outcome) are allowed.
func checkOrder(t *testing.T, got []Received) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]int{}
	for _, r := range got {
		if seen[r.ID()] {
			continue
		}
		seen[r.ID()] = true
		seq, err := strconv.Atoi(r.Headers["Seq"])
		if err != nil {
			t.Fatalf("message %s has no Seq header (headers %v)", r.ID(), r.Headers)
		}
		if prev, ok := last[r.Key]; ok && seq <= prev {
			t.Errorf("key %q: seq %d arrived after seq %d", r.Key, seq, prev)
		}
		last[r.Key] = seq
	}
}

func roundTrip(t *testing.T, b Broker) {
	dest, p := setup(t, b)
	large := 1 << 20
	if b.MaxPayload > 0 && b.MaxPayload < large {
		large = b.MaxPayload
	}
	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), large/16+1)[:large]
	cases := []struct {
		name        string
		payload     []byte
		contentType string
	}{
		{"json", jsonPayload("k", 1), outbox.ContentTypeJSON},
		{"binary", binary, outbox.ContentTypeBinary},
		{"empty", []byte{}, "text/plain"},
		{"large", big, outbox.ContentTypeBinary},
	}
	var sent []*outbox.Message
	for i, c := range cases {
		m := msg("rt-"+c.name, i, c.payload)
		m.ContentType = c.contentType
		m.Headers["traceparent"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		m.Headers["X-Tenant"] = "tenant 7 / ü"
		sent = append(sent, m)
		// One at a time: a large message must not be refused for sharing a batch.
		publishAll(t, p, []*outbox.Message{m})
	}
	got := byID(b.Read(t, dest, len(sent)))
	for i, m := range sent {
		r, ok := got[m.ID.String()]
		if !ok {
			t.Errorf("%s: not at the broker", cases[i].name)
			continue
		}
		if !bytes.Equal(r.Payload, m.Payload) {
			t.Errorf("%s: payload of %d bytes came back as %d bytes, not equal", cases[i].name, len(m.Payload), len(r.Payload))
		}
		if r.ContentType != m.ContentType {
			t.Errorf("%s: content type %q came back as %q", cases[i].name, m.ContentType, r.ContentType)
		}
		if r.Key != m.Key {
			t.Errorf("%s: key %q came back as %q", cases[i].name, m.Key, r.Key)
		}
		m.WireHeaders(func(k, v string) {
			if k == outbox.HeaderContentType {
				return // carried natively by some brokers; checked above
			}
			if r.Headers[k] != v {
				t.Errorf("%s: header %s = %q came back as %q", cases[i].name, k, v, r.Headers[k])
			}
		})
	}
}

func dedupID(t *testing.T, b Broker) {
	dest, p := setup(t, b)
	m := msg("dedup", 0, jsonPayload("dedup", 0))
	plain := msg("plain", 0, jsonPayload("plain", 0))
	plain.DedupKey = "" // the id stands in
	publishAll(t, p, []*outbox.Message{m, plain})
	got := byID(b.Read(t, dest, 2))
	for _, m := range []*outbox.Message{m, plain} {
		r, ok := got[m.ID.String()]
		if !ok {
			t.Fatalf("message %s is not at the broker", m.ID)
		}
		if r.DedupID != m.DedupID() {
			t.Errorf("dedup id %q, want %q", r.DedupID, m.DedupID())
		}
	}
}

func cancelledContext(t *testing.T, b Broker) {
	_, p := setup(t, b)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	batch := []*outbox.Message{msg("a", 0, jsonPayload("a", 0)), msg("b", 0, jsonPayload("b", 0))}
	done := make(chan []error, 1)
	go func() { done <- p.Publish(ctx, batch) }()
	errs := testenv.AwaitRecv(t, "Publish with a cancelled context to return", done)
	// A publisher may have sent a message before it looked at ctx; what it reports as
	// failed must be an outage, so the relay burns no attempt.
	for i, err := range errs {
		if err != nil && !outbox.IsUnavailable(err) {
			t.Errorf("message %d: %v is not an outage", i, err)
		}
	}
	if errs == nil {
		t.Log("the publisher confirmed the batch before it looked at the cancelled context")
	}
}

func partialBatch(t *testing.T, b Broker) {
	dest, p := setup(t, b)
	bad := b.Reject(t, dest)
	var batch []*outbox.Message
	for i := range 5 {
		key := "pb" + strconv.Itoa(i)
		batch = append(batch, msg(key, 0, jsonPayload(key, 0)))
		if i == 2 {
			batch = append(batch, bad)
		}
	}
	errs := p.Publish(testenv.Context(t), batch)
	if len(errs) != len(batch) {
		t.Fatalf("Publish returned %d errors for a batch of %d with a refused message", len(errs), len(batch))
	}
	var good []*outbox.Message
	for i, m := range batch {
		switch {
		case m == bad && errs[i] == nil:
			t.Errorf("the refused message was confirmed")
		case m == bad && outbox.IsUnavailable(errs[i]):
			t.Errorf("the refused message failed as an outage, want a rejection: %v", errs[i])
		case m != bad && errs[i] != nil:
			t.Errorf("message %d failed with the refused one: %v", i, errs[i])
		case m != bad:
			good = append(good, m)
		}
	}
	got := byID(b.Read(t, dest, len(good)))
	for _, m := range good {
		if _, ok := got[m.ID.String()]; !ok {
			t.Errorf("confirmed message %s is not at the broker", m.ID)
		}
	}
}

// outageMidStream runs a relay-like sender (keys in flight one message at a time,
// failed messages resent, outages waited out) while the broker is cut off and healed.
func outageMidStream(t *testing.T, b Broker) {
	dest, p := setup(t, b)
	const keys = 10
	var (
		mu        sync.Mutex
		confirmed = map[string]bool{}
		sentIDs   = map[string]bool{}
		outages   int
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		next := make([]*outbox.Message, keys)
		seq := 0
		for ctx.Err() == nil {
			var batch []*outbox.Message
			for k := range keys {
				if next[k] == nil {
					key := "out" + strconv.Itoa(k)
					next[k] = msg(key, seq, jsonPayload(key, seq))
				}
				batch = append(batch, next[k])
			}
			seq++
			mu.Lock()
			for _, m := range batch {
				sentIDs[m.ID.String()] = true
			}
			mu.Unlock()
			// The relay's publish timeout: while the broker is cut off it may be what
			// ends a Publish, as an outage; on a slow machine it may end one in good
			// times too, which is an outage the sender waits out like any other.
			pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
			errs := p.Publish(pctx, batch)
			pcancel()
			outage := false
			mu.Lock()
			for k, m := range batch {
				var err error
				if errs != nil {
					err = errs[k]
				}
				switch {
				case err == nil:
					confirmed[m.ID.String()] = true
					next[k] = nil
				case outbox.IsUnavailable(err) || ctx.Err() != nil:
					outage = true
				default:
					mu.Unlock()
					errc <- fmt.Errorf("a message failed as a rejection during an outage: %w", err)
					return
				}
			}
			if outage {
				outages++
			}
			mu.Unlock()
			if outage {
				time.Sleep(100 * time.Millisecond) // paces the retries, as the relay's backoff does
			}
		}
		errc <- nil
	}()
	// state reports the sender's progress, and fails the test if it stopped on an error.
	state := func() (confirmedN, outagesN int) {
		select {
		case err := <-errc:
			t.Fatal(err)
		default:
		}
		mu.Lock()
		defer mu.Unlock()
		return len(confirmed), outages
	}
	awaitConfirmed := func(what string, n int) {
		t.Helper()
		testenv.Await(t, fmt.Sprintf("%d messages confirmed %s", n, what), func() (any, bool) {
			c, o := state()
			return fmt.Sprintf("%d confirmed, %d batches hit an outage", c, o), c >= n
		})
	}
	awaitConfirmed("before the outage", 300)
	_, before := state()
	b.Cut(t)
	// The cut lasts until the sender has met it, and a while more: the sleep shapes the
	// fault, nothing below depends on its length.
	testenv.Await(t, "a batch to fail as an outage while the broker is cut off", func() (any, bool) {
		c, o := state()
		return fmt.Sprintf("%d confirmed, %d batches hit an outage", c, o), o > before
	})
	time.Sleep(time.Second)
	during, _ := state()
	b.Restore(t)
	awaitConfirmed("after the outage", during+300)
	cancel()
	if err := testenv.AwaitRecv(t, "the sender to stop", errc); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	if outages == 0 {
		t.Error("no outage was reported while the broker was cut off")
	}
	got := b.Read(t, dest, len(confirmed))
	have := byID(got)
	for id := range confirmed {
		if _, ok := have[id]; !ok {
			t.Errorf("lost: message %s was confirmed but is not at the broker", id)
		}
	}
	for id := range have {
		if !sentIDs[id] {
			t.Errorf("phantom: message %s is at the broker but was never sent", id)
		}
	}
	checkOrder(t, got)
	ids := make([]string, 0, len(got))
	for _, r := range got {
		ids = append(ids, r.ID())
	}
	slices.Sort(ids)
	dups := len(ids) - len(slices.Compact(ids))
	t.Logf("%d confirmed, %d at the broker, %d duplicates, %d batches hit the outage", len(confirmed), len(got), dups, outages)
}
