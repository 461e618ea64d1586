package outboxsqs_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testproxy"
	"github.com/outboxkit/outbox/internal/testinfra/testsqs"
	"github.com/outboxkit/outbox/outboxsqs"
)

// testBundle is what most tests need: a client of the shared fauxqs and a publisher
// through it.
type testBundle struct {
	client *sqs.Client
	pub    *outboxsqs.Publisher
}

func setup(t *testing.T, cfg outboxsqs.Config) *testBundle {
	t.Helper()
	client := testsqs.Client(testsqs.Shared(t).Endpoint())
	pub, err := outboxsqs.New(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	return &testBundle{client: client, pub: pub}
}

// ctxT returns a context that ends after d, for a deadline that is itself the input
// under test (a Publish while the queue is cut off gives up at it). A context that only
// bounds a hang is testenv.Context(t).
func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func newMsg(topic, key string, payload []byte) *outbox.Message {
	id := outbox.NewID()
	return &outbox.Message{ID: id, Topic: topic, Key: key, Payload: payload, ContentType: outbox.ContentTypeBinary, DedupKey: id.String()}
}

// readN receives until it has n messages from url, and fails if no more come for
// testenv.Stall() before then, or if there are more once n have arrived.
func readN(t *testing.T, c *sqs.Client, url string, n int) []types.Message {
	t.Helper()
	var out []types.Message
	testenv.Await(t, fmt.Sprintf("%d messages in queue %s", n, url), func() (any, bool) {
		for len(out) < n {
			ctx, cancel := testenv.CallContext() // per receive
			msgs := receive(t, ctx, c, url)
			cancel()
			if len(msgs) == 0 {
				break
			}
			out = append(out, msgs...)
		}
		return fmt.Sprintf("%d of %d messages", len(out), n), len(out) >= n
	})
	// One more receive, which waits up to a second (WaitTimeSeconds) for an extra.
	if extra := receive(t, testenv.Context(t), c, url); len(extra) > 0 {
		t.Fatalf("queue %s holds %d messages or more, want %d", url, len(out)+len(extra), n)
	}
	return out
}

func TestPublishFIFO(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxsqs.Config{Route: "{topic}"})
	name, url := testsqs.Queue(t, b.client, true, nil)

	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	keyed := newMsg(name, "order-42", binary)
	keyed.DedupKey = "dedup " + keyed.ID.String() // a space: hashed for MessageDeduplicationId
	keyless := newMsg(name, "", []byte(`{"n":1}`))
	empty := newMsg(name, "k2", []byte{})
	testenv.RequirePublishedAll(t, b.pub.Publish(testenv.Context(t), []*outbox.Message{keyed, keyless, empty}))
	// A retry after an unknown outcome carries the same MessageDeduplicationId: dropped.
	again := *keyed
	testenv.RequirePublishedAll(t, b.pub.Publish(testenv.Context(t), []*outbox.Message{&again}))

	got := map[string]types.Message{}
	for _, m := range readN(t, b.client, url, 3) {
		got[aws.ToString(m.MessageAttributes[outbox.HeaderID].StringValue)] = m
	}
	for _, tc := range []struct {
		m            *outbox.Message
		group, dedup string
		encoding     string
	}{
		{keyed, "order-42", "", outboxsqs.EncodingBase64},
		{keyless, keyless.ID.String(), keyless.DedupKey, ""},
		{empty, "k2", empty.DedupKey, outboxsqs.EncodingEmpty},
	} {
		r, ok := got[tc.m.ID.String()]
		if !ok {
			t.Errorf("message %s is not in the queue", tc.m.ID)
			continue
		}
		if g := r.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]; g != tc.group {
			t.Errorf("message %s: group %q, want %q", tc.m.ID, g, tc.group)
		}
		d := r.Attributes[string(types.MessageSystemAttributeNameMessageDeduplicationId)]
		if tc.dedup != "" && d != tc.dedup {
			t.Errorf("message %s: dedup id %q, want %q", tc.m.ID, d, tc.dedup)
		}
		if tc.dedup == "" && (len(d) != 64 || d == tc.m.DedupKey) {
			t.Errorf("message %s: dedup id %q, want the SHA-256 of %q", tc.m.ID, d, tc.m.DedupKey)
		}
		if enc := aws.ToString(r.MessageAttributes[outboxsqs.AttrBodyEncoding].StringValue); enc != tc.encoding {
			t.Errorf("message %s: %s %q, want %q", tc.m.ID, outboxsqs.AttrBodyEncoding, enc, tc.encoding)
		}
		payload, headers, err := outboxsqs.Decode(r)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(payload, tc.m.Payload) {
			t.Errorf("message %s: payload %q, want %q", tc.m.ID, payload, tc.m.Payload)
		}
		if headers[outbox.HeaderDedupKey] != tc.m.DedupKey || headers[outbox.HeaderKey] != tc.m.Key {
			t.Errorf("message %s: headers %v lack the original dedup key and key", tc.m.ID, headers)
		}
	}
}

// TestPublishBatching sends a relay-sized batch over several queues: every message
// arrives once, in SendMessageBatch calls split by count and by bytes.
func TestPublishBatching(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxsqs.Config{Route: "{topic}", MaxInflight: 3})
	var names, urls []string
	for i := range 3 {
		n, u := testsqs.Queue(t, b.client, i == 0, nil)
		names, urls = append(names, n), append(urls, u)
	}
	const n = 300
	batch := make([]*outbox.Message, n)
	for i := range batch {
		payload := []byte(strconv.Itoa(i))
		if i%50 == 0 {
			payload = bytes.Repeat([]byte("x"), 100<<10) // three of them do not fit one call
		}
		batch[i] = newMsg(names[i%3], "key-"+strconv.Itoa(i), payload)
	}
	testenv.RequirePublishedAll(t, b.pub.Publish(testenv.Context(t), batch))
	for q, url := range urls {
		seen := map[string]bool{}
		for _, m := range readN(t, b.client, url, n/3) {
			id := aws.ToString(m.MessageAttributes[outbox.HeaderID].StringValue)
			if seen[id] {
				t.Errorf("queue %d: message %s twice", q, id)
			}
			seen[id] = true
		}
		for i := q; i < n; i += 3 {
			if !seen[batch[i].ID.String()] {
				t.Errorf("queue %d: message %d missing", q, i)
			}
		}
	}
}

func TestPublishQueueURLRoute(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxsqs.Config{})
	_, url := testsqs.Queue(t, b.client, false, nil)
	pub, err := outboxsqs.New(b.client, outboxsqs.Config{Route: url})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), []*outbox.Message{newMsg("ignored", "k", []byte("x"))}))
	readN(t, b.client, url, 1)
}

// TestPublishMissingQueue: a queue that does not exist is an outage naming it, and it is
// found once created.
func TestPublishMissingQueue(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxsqs.Config{Route: "{topic}"})
	name := testsqs.Unique()
	errs := b.pub.Publish(testenv.Context(t), []*outbox.Message{newMsg(name, "a", []byte("1")), newMsg(name, "b", []byte("2"))})
	for i, err := range errs {
		if dest, ok := outbox.AsDestinationOutage(err); !ok || !errors.Is(err, outboxsqs.ErrNoQueue) || !strings.Contains(err.Error(), name) || !strings.Contains(dest, name) {
			t.Errorf("message %d: %v, want an outage naming the missing queue", i, err)
		}
	}
	if len(errs) != 2 {
		t.Fatalf("errs = %v", errs)
	}
	out, err := b.client.CreateQueue(testenv.Context(t), &sqs.CreateQueueInput{QueueName: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = b.client.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: out.QueueUrl})
	})
	testenv.RequirePublishedAll(t, b.pub.Publish(testenv.Context(t), []*outbox.Message{newMsg(name, "a", []byte("1"))}))
}

// TestPublishEntryRejected: SQS refuses one entry of a call (over the queue's
// MaximumMessageSize): that message is rejected, the others of the call are stored.
func TestPublishEntryRejected(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxsqs.Config{Route: "{topic}"})
	name, url := testsqs.Queue(t, b.client, false, map[string]string{"MaximumMessageSize": "1024"})
	batch := []*outbox.Message{newMsg(name, "a", []byte("1")), newMsg(name, "b", make([]byte, 2000)), newMsg(name, "c", []byte("3"))}
	errs := b.pub.Publish(testenv.Context(t), batch)
	if len(errs) != 3 || errs[0] != nil || errs[2] != nil {
		t.Fatalf("errs = %v, want only message 1 to fail", errs)
	}
	var ee *outboxsqs.EntryError
	if outbox.IsOutage(errs[1]) || !errors.As(errs[1], &ee) || !ee.SenderFault || ee.Code != "InvalidParameterValue" {
		t.Errorf("message 1: %v, want a rejection with the entry's InvalidParameterValue", errs[1])
	}
	readN(t, b.client, url, 2)
}

// TestPublishCallRejected: SQS refuses a call as a whole (BatchRequestTooLong: fauxqs
// takes 1 MiB per call, and the publisher was told 2 MiB). The messages are sent one by
// one: those that fit are stored, the one that is too large alone is rejected.
func TestPublishCallRejected(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxsqs.Config{Route: "{topic}", MaxMessageBytes: 2 << 20})
	name, url := testsqs.Queue(t, b.client, true, nil)
	batch := []*outbox.Message{
		newMsg(name, "a", bytes.Repeat([]byte("a"), 600<<10)),
		newMsg(name, "b", bytes.Repeat([]byte("b"), 600<<10)),
		newMsg(name, "c", []byte("c")),
		newMsg(name, "d", bytes.Repeat([]byte("d"), 1100<<10)),
	}
	errs := b.pub.Publish(testenv.Context(t), batch)
	if len(errs) != 4 || errs[0] != nil || errs[1] != nil || errs[2] != nil {
		t.Fatalf("errs = %v, want only message 3 to fail", errs)
	}
	var refused *types.BatchRequestTooLong
	if outbox.IsOutage(errs[3]) || !errors.As(errs[3], &refused) {
		t.Errorf("message 3: %v, want a rejection with BatchRequestTooLong", errs[3])
	}
	readN(t, b.client, url, 3)
}

func TestPublishRejectsBeforeSending(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxsqs.Config{Route: "{event_type}"})
	name, url := testsqs.Queue(t, b.client, false, nil)
	ok := newMsg("t", "a", []byte("1"))
	ok.EventType = name
	noField := newMsg("t", "b", []byte("2")) // no event type
	badName := newMsg("t", "c", []byte("3"))
	badName.EventType = "order.placed"
	tooLarge := newMsg("t", "d", bytes.Repeat([]byte("x"), outboxsqs.MaxMessageBytesDefault))
	tooLarge.EventType = name
	errs := b.pub.Publish(testenv.Context(t), []*outbox.Message{ok, noField, badName, tooLarge})
	if len(errs) != 4 || errs[0] != nil {
		t.Fatalf("errs = %v, want message 0 confirmed", errs)
	}
	for i, want := range map[int]error{1: outbox.ErrUnroutable, 2: outboxsqs.ErrInvalidQueue, 3: outboxsqs.ErrTooLarge} {
		if outbox.IsOutage(errs[i]) || !errors.Is(errs[i], want) {
			t.Errorf("message %d: %v, want a rejection matching %v", i, errs[i], want)
		}
	}
	readN(t, b.client, url, 1)
}

func TestPublishConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxsqs.Config{Route: "{topic}", MaxInflight: 2})
	name, url := testsqs.Queue(t, b.client, true, nil)
	const workers, perWorker = 8, 25
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			var batch []*outbox.Message
			for i := range perWorker {
				batch = append(batch, newMsg(name, fmt.Sprintf("w%d-%d", w, i), []byte("x")))
			}
			testenv.PublishedAll(t, b.pub.Publish(testenv.Context(t), batch)) // not require: t.Fatal is for the test's goroutine
		})
	}
	wg.Wait()
	readN(t, b.client, url, workers*perWorker)
}

func TestPing(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxsqs.Config{})
	name, url := testsqs.Queue(t, b.client, false, nil)
	for route, wantErr := range map[string]error{
		name:             nil,                  // GetQueueUrl of the route's queue
		url:              nil,                  // GetQueueUrl of the URL's queue
		"{topic}":        nil,                  // ListQueues: nothing sent yet
		testsqs.Unique(): outboxsqs.ErrNoQueue, // the route's queue is missing
	} {
		pub, err := outboxsqs.New(b.client, outboxsqs.Config{Route: route})
		if err != nil {
			t.Fatal(err)
		}
		err = pub.Ping(testenv.Context(t))
		if wantErr == nil && err != nil {
			t.Errorf("route %q: Ping = %v", route, err)
		}
		if wantErr != nil && (!outbox.IsOutage(err) || !errors.Is(err, wantErr)) {
			t.Errorf("route %q: Ping = %v, want an outage matching %v", route, err, wantErr)
		}
	}

	// With placeholders, Ping checks the queue last sent to.
	other, otherURL := testsqs.Queue(t, b.client, false, nil)
	pub, err := outboxsqs.New(b.client, outboxsqs.Config{Route: "{topic}"})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), []*outbox.Message{newMsg(other, "k", []byte("x"))}))
	if err := pub.Ping(testenv.Context(t)); err != nil {
		t.Errorf("Ping after a send = %v", err)
	}
	if _, err := b.client.DeleteQueue(testenv.Context(t), &sqs.DeleteQueueInput{QueueUrl: aws.String(otherURL)}); err != nil {
		t.Fatal(err)
	}
	if err := pub.Ping(testenv.Context(t)); !outbox.IsOutage(err) || !errors.Is(err, outboxsqs.ErrNoQueue) {
		t.Errorf("Ping after the queue last sent to was deleted = %v, want an outage matching ErrNoQueue", err)
	}
}

func TestCheckQueue(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxsqs.Config{Route: "{topic}{key}"})
	name, _ := testsqs.Queue(t, b.client, false, nil)
	ctx := testenv.Context(t)
	if err := b.pub.CheckQueue(ctx, &outbox.Message{Topic: name[:5], Key: name[5:]}); err != nil {
		t.Errorf("existing queue: %v", err)
	}
	if err := b.pub.CheckQueue(ctx, &outbox.Message{Topic: "missing", Key: "queue"}); !outbox.IsUnavailable(err) || !errors.Is(err, outboxsqs.ErrNoQueue) {
		t.Errorf("missing queue: %v, want an outage matching ErrNoQueue", err)
	}
	if err := b.pub.CheckQueue(ctx, &outbox.Message{Topic: "orders"}); outbox.IsOutage(err) || !errors.Is(err, outbox.ErrUnroutable) {
		t.Errorf("no key: %v, want the rejection ErrUnroutable", err)
	}
	if err := b.pub.CheckQueue(ctx, &outbox.Message{Topic: "a.", Key: "b"}); outbox.IsOutage(err) || !errors.Is(err, outboxsqs.ErrInvalidQueue) {
		t.Errorf("invalid name: %v, want the rejection ErrInvalidQueue", err)
	}
}

// TestMessageCannotChooseQueueURL: with a route of names, a topic that is a queue URL
// (another account's queue) is a rejection; with a route of URLs, a topic can fill only
// the queue name.
func TestMessageCannotChooseQueueURL(t *testing.T) {
	t.Parallel()
	other := "https://sqs.eu-west-1.amazonaws.com/999999999999/theirs"
	byName := setup(t, outboxsqs.Config{})
	byURL := setup(t, outboxsqs.Config{Route: "https://sqs.eu-west-1.amazonaws.com/123456789012/{topic}"})
	for _, tc := range []struct {
		pub   *outboxsqs.Publisher
		topic string
	}{
		{byName.pub, other},
		{byURL.pub, "999999999999/theirs"},
	} {
		_, _, err := tc.pub.Entry(&outbox.Message{ID: outbox.NewID(), Topic: tc.topic, Payload: []byte("x")})
		if !errors.Is(err, outboxsqs.ErrInvalidQueue) {
			t.Errorf("topic %q: %v, want the rejection ErrInvalidQueue", tc.topic, err)
		}
	}
}

// dialProxied dials fauxqs through a proxy the test can cut.
func dialProxied(t *testing.T, cfg outboxsqs.Config) (*testproxy.Proxy, *outboxsqs.Publisher, *sqs.Client) {
	t.Helper()
	srv := testsqs.Shared(t)
	proxy := testproxy.New(t, srv.Addr())
	pub, err := outboxsqs.Dial(testenv.Context(t), "sqs://?endpoint=http://"+proxy.Addr(), cfg, testsqs.ConfigOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	return proxy, pub, testsqs.Client(srv.Endpoint())
}

func requireAllOutages(t *testing.T, errs []error, n int, match error) {
	t.Helper()
	if len(errs) != n {
		t.Fatalf("errs = %v, want %d outages", errs, n)
	}
	for i, err := range errs {
		if !outbox.IsUnavailable(err) || (match != nil && !errors.Is(err, match)) {
			t.Errorf("message %d: %v, want an outage matching %v", i, err, match)
		}
	}
}

func TestOutageCutAndHeal(t *testing.T) {
	t.Parallel()
	client := testsqs.Client(testsqs.Shared(t).Endpoint())
	name, url := testsqs.Queue(t, client, true, nil)
	proxy, pub, _ := dialProxied(t, outboxsqs.Config{Route: name})
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), []*outbox.Message{newMsg("t", "a", []byte("1"))}))

	proxy.Cut()
	// Inputs: cut off, Publish and Ping give up by these deadlines at the latest.
	requireAllOutages(t, pub.Publish(ctxT(t, 2*time.Second), []*outbox.Message{newMsg("t", "a", []byte("2")), newMsg("t", "b", []byte("3"))}), 2, nil)
	if err := pub.Ping(ctxT(t, time.Second)); !outbox.IsOutage(err) {
		t.Errorf("Ping with the connection cut = %v, want an outage", err)
	}
	proxy.Restore(t)
	if err := pub.Ping(testenv.Context(t)); err != nil {
		t.Fatalf("Ping after the cut healed = %v", err)
	}
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), []*outbox.Message{newMsg("t", "a", []byte("4"))}))
	readN(t, client, url, 2) // nothing of the cut batch reached the queue: no connection was left
}

// TestOutageSlowBroker: a call that outlives ctx has an unknown outcome: an outage.
func TestOutageSlowBroker(t *testing.T) {
	t.Parallel()
	client := testsqs.Client(testsqs.Shared(t).Endpoint())
	name, _ := testsqs.Queue(t, client, false, nil)
	proxy, pub, _ := dialProxied(t, outboxsqs.Config{Route: name})
	remove := proxy.Latency(t, 2*time.Second, 0)
	defer remove()
	// The deadline is the input: no answer can come before it, however fast the machine.
	errs := pub.Publish(ctxT(t, 300*time.Millisecond), []*outbox.Message{newMsg("t", "a", []byte("1")), newMsg("t", "b", []byte("2"))})
	requireAllOutages(t, errs, 2, context.DeadlineExceeded)
}

// TestCloseDuringPublish: Close cancels the calls in flight (outages, ErrClosed), and
// everything after it fails at once, for a publisher made by New (the client stays
// usable) and by Dial (its connections are closed too). Closing twice is safe.
func TestCloseDuringPublish(t *testing.T) {
	t.Parallel()
	srv := testsqs.Shared(t)
	client := testsqs.Client(srv.Endpoint())
	name, _ := testsqs.Queue(t, client, false, nil)
	for _, dial := range []bool{false, true} {
		proxy := testproxy.New(t, srv.Addr())
		var pub *outboxsqs.Publisher
		var err error
		if dial {
			pub, err = outboxsqs.Dial(testenv.Context(t), "sqs://?endpoint=http://"+proxy.Addr(), outboxsqs.Config{Route: name}, testsqs.ConfigOptions()...)
		} else {
			pub, err = outboxsqs.New(testsqs.Client("http://"+proxy.Addr()), outboxsqs.Config{Route: name})
		}
		if err != nil {
			t.Fatal(err)
		}
		remove := proxy.Latency(t, 5*time.Second, 0)
		done := make(chan []error)
		go func() {
			done <- pub.Publish(testenv.Context(t), []*outbox.Message{newMsg("t", "a", []byte("1"))})
		}()
		time.Sleep(200 * time.Millisecond) // let the call start; either way the result is an outage
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(pub.Close)
		}
		wg.Wait()
		// Had Close not cancelled the call, it would succeed once the latency passed.
		requireAllOutages(t, testenv.AwaitRecv(t, "Publish to return after Close", done), 1, outboxsqs.ErrClosed)
		requireAllOutages(t, pub.Publish(context.Background(), []*outbox.Message{newMsg("t", "a", []byte("1"))}), 1, outboxsqs.ErrClosed)
		if err := pub.Ping(context.Background()); !outbox.IsOutage(err) || !errors.Is(err, outboxsqs.ErrClosed) {
			t.Errorf("Ping after Close = %v", err)
		}
		pub.Close()
		remove()
	}
}

func TestCancelledContext(t *testing.T) {
	t.Parallel()
	b := setup(t, outboxsqs.Config{Route: "q"})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	requireAllOutages(t, b.pub.Publish(ctx, []*outbox.Message{newMsg("t", "a", []byte("1")), newMsg("t", "b", []byte("2"))}), 2, context.Canceled)
	if errs := b.pub.Publish(ctx, nil); errs != nil {
		t.Errorf("Publish(nil) = %v", errs)
	}
}

func TestDial(t *testing.T) {
	t.Parallel()
	srv := testsqs.Shared(t)
	url := "sqs://?region=" + testsqs.Region + "&endpoint=" + srv.Endpoint()
	// A missing queue does not fail Dial: Publish pauses on it.
	pub, err := outboxsqs.Dial(testenv.Context(t), url, outboxsqs.Config{Route: testsqs.Unique()}, testsqs.ConfigOptions()...)
	if err != nil {
		t.Fatalf("Dial with a missing queue = %v", err)
	}
	requireAllOutages(t, pub.Publish(testenv.Context(t), []*outbox.Message{newMsg("t", "a", []byte("1"))}), 1, outboxsqs.ErrNoQueue)
	pub.Close()
	// Nothing answers: Dial gives up by its deadline (the input) at the latest.
	proxy := testproxy.New(t, srv.Addr())
	proxy.Cut()
	_, err = outboxsqs.Dial(ctxT(t, 2*time.Second), "sqs://?endpoint=http://"+proxy.Addr(), outboxsqs.Config{}, testsqs.ConfigOptions()...)
	if !outbox.IsOutage(err) {
		t.Errorf("Dial with nothing listening = %v, want an outage", err)
	}
	// Bad configuration fails before any I/O.
	var ce *outbox.ConfigError
	if _, err := outboxsqs.Dial(testenv.Context(t), url, outboxsqs.Config{Route: "a.b"}); !errors.As(err, &ce) || ce.Field != "Route" {
		t.Errorf("Dial with a bad route = %v", err)
	}
	if _, err := outboxsqs.Dial(testenv.Context(t), "amqp://x", outboxsqs.Config{}); !errors.As(err, &ce) {
		t.Errorf("Dial with a bad URL = %v", err)
	}
	if _, err := outboxsqs.New(nil, outboxsqs.Config{}); err == nil {
		t.Error("New(nil) succeeded")
	}
}

// TestDialTLS reaches fauxqs through an HTTPS proxy whose certificate only Config.TLS
// trusts.
func TestDialTLS(t *testing.T) {
	t.Parallel()
	srv := testsqs.Shared(t)
	backend, err := url.Parse(srv.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewUnstartedServer(httputil.NewSingleHostReverseProxy(backend))
	front.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	front.StartTLS()
	t.Cleanup(front.Close)
	client := testsqs.Client(srv.Endpoint())
	name, queueURL := testsqs.Queue(t, client, false, nil)
	sqsURL := "sqs://?endpoint=" + front.URL

	_, err = outboxsqs.Dial(testenv.Context(t), sqsURL, outboxsqs.Config{Route: name}, testsqs.ConfigOptions()...)
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("Dial without the CA = %v, want a certificate error", err)
	}

	pool := x509.NewCertPool()
	pool.AddCert(front.Certificate())
	pub, err := outboxsqs.Dial(testenv.Context(t), sqsURL, outboxsqs.Config{Route: name, TLS: &tls.Config{RootCAs: pool}}, testsqs.ConfigOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), []*outbox.Message{newMsg("t", "k", []byte("over TLS"))}))
	readN(t, client, queueURL, 1)
}
