package outboxwebhook_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testproxy"
	"github.com/outboxkit/outbox/outboxtest/conformance"
	"github.com/outboxkit/outbox/outboxwebhook"
)

// refuseHeader makes the receiver refuse a message with 422, as a receiver refuses one
// on its merits.
const refuseHeader = "X-Test-Refuse"

// receiver is a webhook receiver on 127.0.0.1: it verifies signatures with
// VerifyHandler and keeps every delivery it answered with 2xx, duplicates included, by
// path in arrival order.
type receiver struct {
	srv *httptest.Server

	mu  sync.Mutex
	got map[string][]conformance.Received
}

func newReceiver(t *testing.T, secrets [][]byte) *receiver {
	t.Helper()
	rc := &receiver{got: map[string][]conformance.Received{}}
	rc.srv = httptest.NewServer(outboxwebhook.VerifyHandler(secrets, 0, http.HandlerFunc(rc.store)))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) store(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	if v := r.Header.Get(refuseHeader); v != "" {
		http.Error(w, "refused: "+refuseHeader+": "+v, http.StatusUnprocessableEntity)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	// HTTP header names are case-insensitive and arrive canonical ("Traceparent"): keep
	// the lower-case form too, so that lookups by the name the publisher was given work.
	headers := make(map[string]string, 2*len(r.Header))
	for k, vs := range r.Header {
		headers[k] = vs[0]
		headers[strings.ToLower(k)] = vs[0]
	}
	rec := conformance.Received{
		DedupID:     r.Header.Get(outboxwebhook.HeaderIdempotencyKey),
		Key:         r.Header.Get(outbox.HeaderKey),
		ContentType: r.Header.Get(outbox.HeaderContentType),
		Headers:     headers,
		Payload:     body,
	}
	rc.mu.Lock()
	rc.got[r.URL.Path] = append(rc.got[r.URL.Path], rec)
	rc.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// read returns the deliveries to path once there are n, or all there are once none has
// come for testenv.Stall(), for the caller to say what is missing.
func (rc *receiver) read(path string, n int) []conformance.Received {
	var got []conformance.Received
	_ = testenv.Progress(context.Background(), "deliveries to "+path, testenv.Stall(), func() (any, bool) {
		rc.mu.Lock()
		got = slices.Clone(rc.got[path])
		rc.mu.Unlock()
		return len(got), len(got) >= n
	})
	return got
}

var testSecrets = [][]byte{[]byte("test-secret-0123456789abcdef0123")}

func TestConformance(t *testing.T) {
	rc := newReceiver(t, testSecrets)
	proxy := testproxy.New(t, rc.srv.Listener.Addr().String())
	base := "http://" + proxy.Addr() + "/hooks"
	var dests atomic.Int64
	conformance.Run(t, conformance.Broker{
		Destination: func(t *testing.T) string { return fmt.Sprintf("conformance/%d", dests.Add(1)) },
		Publisher: func(t *testing.T, route string) outbox.Publisher {
			pub, err := outboxwebhook.Dial(testenv.Context(t), base, outboxwebhook.Config{Route: route, Secrets: testSecrets})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pub.Close)
			return pub
		},
		Read: func(t *testing.T, dest string, n int) []conformance.Received {
			return rc.read("/hooks/"+dest, n)
		},
		Reject: func(t *testing.T, dest string) *outbox.Message {
			m := newMsg("conformance", "refused", `{"refuse":true}`)
			m.Headers = map[string]string{refuseHeader: "yes"}
			return m
		},
		Cut:     func(t *testing.T) { proxy.Cut() },
		Restore: func(t *testing.T) { proxy.Restore(t) },
	})
}

func newMsg(topic, key, payload string) *outbox.Message {
	return &outbox.Message{
		ID:          outbox.NewID(),
		Topic:       topic,
		Key:         key,
		Payload:     []byte(payload),
		ContentType: outbox.ContentTypeJSON,
	}
}

// publishOne publishes m and returns its error.
func publishOne(t *testing.T, pub *outboxwebhook.Publisher, m *outbox.Message) error {
	t.Helper()
	errs := pub.Publish(testenv.Context(t), []*outbox.Message{m})
	if errs == nil {
		return nil
	}
	if len(errs) != 1 {
		t.Fatalf("Publish returned %d errors for one message", len(errs))
	}
	if errs[0] == nil {
		t.Fatal("Publish returned a slice with no error")
	}
	return errs[0]
}

func requireOutage(t *testing.T, what string, err error) {
	t.Helper()
	if !outbox.IsUnavailable(err) {
		t.Fatalf("%s: %v, want an outage", what, err)
	}
}

func requireRejection(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil || outbox.IsUnavailable(err) {
		t.Fatalf("%s: %v, want a rejection", what, err)
	}
}

// TestRequest checks everything a request carries, with a receiver that checks the
// signature.
func TestRequest(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, testSecrets)
	pub, err := outboxwebhook.Dial(testenv.Context(t), rc.srv.URL+"/in/", outboxwebhook.Config{
		Route:   "{aggregate_type}/{event_type}",
		Secrets: testSecrets,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	created := time.Date(2026, 3, 4, 5, 6, 7, 891011121, time.FixedZone("X", 3600))
	m := newMsg("orders", "order-42", `{"id":42}`)
	m.AggregateType, m.EventType = "order", "order placed/ü"
	m.DedupKey = "order-42-placed"
	m.CreatedAt = created
	m.Headers = map[string]string{
		"traceparent":                      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"Content-Type":                     "text/plain", // Message.ContentType wins
		outboxwebhook.HeaderIdempotencyKey: "forged",     // the dedup key wins
		outboxwebhook.HeaderSignature:      "forged",     // the real signature wins
		"Empty":                            "",
	}
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), []*outbox.Message{m}))

	got := rc.read("/in/order/order placed/ü", 1)
	if len(got) != 1 {
		t.Fatalf("deliveries: %v", rc.got)
	}
	r := got[0]
	if string(r.Payload) != `{"id":42}` {
		t.Errorf("payload %q", r.Payload)
	}
	for k, v := range map[string]string{
		"Idempotency-Key":       "order-42-placed",
		"Outbox-Id":             m.ID.String(),
		"Outbox-Dedup-Key":      "order-42-placed",
		"Outbox-Key":            "order-42",
		"Outbox-Aggregate-Type": "order",
		"Outbox-Event-Type":     "order placed/ü",
		"Outbox-Topic":          "orders",
		"Outbox-Created-At":     "2026-03-04T04:06:07.891011121Z",
		"Content-Type":          outbox.ContentTypeJSON,
		"Traceparent":           m.Headers["traceparent"],
		"Empty":                 "",
		"User-Agent":            "outboxwebhook (github.com/outboxkit/outbox)",
	} {
		if got, ok := r.Headers[k]; !ok || got != v {
			t.Errorf("header %s = %q (present %v), want %q", k, got, ok, v)
		}
	}
}

func TestRoute(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, testSecrets)
	dial := func(route string) *outboxwebhook.Publisher {
		pub, err := outboxwebhook.Dial(testenv.Context(t), rc.srv.URL+"/base", outboxwebhook.Config{Route: route, Secrets: testSecrets})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pub.Close)
		return pub
	}

	// A full URL replaces the base.
	full := dial(rc.srv.URL + "/full/{topic}")
	testenv.RequirePublishedAll(t, full.Publish(testenv.Context(t), []*outbox.Message{newMsg("orders", "k", "{}")}))
	if n := len(rc.read("/full/orders", 1)); n != 1 {
		t.Errorf("full URL route: %d deliveries", n)
	}

	byKey := dial("keys/{key}")
	noKey := newMsg("orders", "", "{}")
	dots := newMsg("orders", "..", "{}")
	ok := newMsg("orders", "a?b#c", "{}")
	errs := byKey.Publish(testenv.Context(t), []*outbox.Message{noKey, dots, ok})
	if len(errs) != 3 {
		t.Fatalf("errs = %v", errs)
	}
	requireRejection(t, "empty key", errs[0])
	if !errors.Is(errs[0], outbox.ErrUnroutable) {
		t.Errorf("empty key: %v, want ErrUnroutable", errs[0])
	}
	requireRejection(t, "dot segment", errs[1])
	if errs[2] != nil {
		t.Errorf("key with URL syntax: %v", errs[2])
	}
	if n := len(rc.read("/base/keys/a?b#c", 1)); n != 1 {
		t.Errorf("key with URL syntax: %d deliveries at its escaped path", n)
	}
}

// TestHeaderRejections sends headers that HTTP cannot carry: those messages are
// rejected without being sent, and the rest of the batch goes through.
func TestHeaderRejections(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, testSecrets)
	pub, err := outboxwebhook.Dial(testenv.Context(t), rc.srv.URL, outboxwebhook.Config{Route: "h", Secrets: testSecrets})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	bad := []map[string]string{
		{"Bad Name": "x"},
		{"X-Ctl": "a\x01b"},
		{"Transfer-Encoding": "chunked"},
		{"Host": "elsewhere.example"},
		{"Authorization": "Basic bWU6bWluZQ=="},
		{"cookie": "session=1"},
	}
	batch := []*outbox.Message{newMsg("t", "good", "{}")}
	for i, h := range bad {
		m := newMsg("t", fmt.Sprint("bad", i), "{}")
		m.Headers = h
		batch = append(batch, m)
	}
	errs := pub.Publish(testenv.Context(t), batch)
	if len(errs) != len(batch) || errs[0] != nil {
		t.Fatalf("errs = %v", errs)
	}
	for i, err := range errs[1:] {
		requireRejection(t, fmt.Sprint(bad[i]), err)
		if !strings.Contains(err.Error(), "cannot travel in an HTTP request") {
			t.Errorf("%v: %v", bad[i], err)
		}
	}
	if got := rc.read("/h", 1); len(got) != 1 || got[0].Key != "good" {
		t.Errorf("deliveries: %v", got)
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		field string
		cfg   outboxwebhook.Config
	}{
		{"URL", outboxwebhook.Config{Secrets: testSecrets}},
		{"URL", outboxwebhook.Config{URL: "ftp://h/x", Secrets: testSecrets}},
		{"URL", outboxwebhook.Config{URL: "/relative", Secrets: testSecrets}},
		{"URL", outboxwebhook.Config{URL: "http://u:p@h:port/", Secrets: testSecrets}},
		{"Route", outboxwebhook.Config{URL: "http://h", Route: "{nope}", Secrets: testSecrets}},
		{"Route", outboxwebhook.Config{URL: "http://h", Route: "{topic", Secrets: testSecrets}},
		{"Route", outboxwebhook.Config{URL: "http://h", Route: "{topic}/../admin", Secrets: testSecrets}},
		{"Route", outboxwebhook.Config{URL: "http://h", Route: "https:///{topic}", Secrets: testSecrets}},
		{"Route", outboxwebhook.Config{URL: "http://h", Route: "https://{key}.example/in", Secrets: testSecrets}},
		{"Route", outboxwebhook.Config{URL: "http://h", Route: "https://hooks.example{topic}", Secrets: testSecrets}},
		{"Route", outboxwebhook.Config{URL: "http://h", Route: "http://{aggregate_type}/x", Secrets: testSecrets}},
		{"Secrets", outboxwebhook.Config{URL: "http://h"}},
		{"Secrets[1]", outboxwebhook.Config{URL: "http://h", Secrets: [][]byte{[]byte("s"), {}}}},
		{"Unsigned", outboxwebhook.Config{URL: "http://h", Secrets: testSecrets, Unsigned: true}},
		{"MaxConcurrency", outboxwebhook.Config{URL: "http://h", Secrets: testSecrets, MaxConcurrency: -1}},
		{"TLS", outboxwebhook.Config{URL: "http://h", Secrets: testSecrets, TLS: &tls.Config{}}},
	} {
		_, err := outboxwebhook.New(http.DefaultClient, tc.cfg)
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("%+v: %v, want a ConfigError for %s", tc.cfg, err, tc.field)
		}
		if err != nil && strings.Contains(err.Error(), "u:p") {
			t.Errorf("error shows credentials: %v", err)
		}
	}
	for _, cfg := range []outboxwebhook.Config{
		{URL: "http://h", Secrets: testSecrets},
		{URL: "https://u:p@h:8443/x/?token=t", Route: "{aggregate_type}.{event_type}", Secrets: testSecrets},
		{URL: "http://h", Route: "https://hooks.example/in/{key}", Unsigned: true, Timeout: -1},
	} {
		if _, err := outboxwebhook.New(http.DefaultClient, cfg); err != nil {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
	if _, err := outboxwebhook.New(nil, outboxwebhook.Config{URL: "http://h", Secrets: testSecrets}); err == nil {
		t.Error("New(nil) succeeded")
	}
	_, err := outboxwebhook.Dial(context.Background(), "http://a", outboxwebhook.Config{URL: "http://b", Secrets: testSecrets})
	if ce := (*outbox.ConfigError)(nil); !errors.As(err, &ce) || ce.Field != "URL" {
		t.Errorf("Dial with a different Config.URL: %v", err)
	}
}

// TestNewKeepsClient checks that New leaves the caller's client as it was.
func TestNewKeepsClient(t *testing.T) {
	t.Parallel()
	client := &http.Client{}
	pub, err := outboxwebhook.New(client, outboxwebhook.Config{URL: "http://h", Secrets: testSecrets})
	if err != nil {
		t.Fatal(err)
	}
	pub.Close()
	if client.CheckRedirect != nil {
		t.Error("New changed the caller's client")
	}
}

// TestUnsigned sends without a signature: a receiver that does not verify takes it, one
// that does refuses the publisher (an outage).
func TestUnsigned(t *testing.T) {
	t.Parallel()
	var sig atomic.Value
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sig.Store(r.Header.Values(outboxwebhook.HeaderSignature))
	}))
	t.Cleanup(plain.Close)
	pub, err := outboxwebhook.New(plain.Client(), outboxwebhook.Config{URL: plain.URL, Unsigned: true})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), []*outbox.Message{newMsg("t", "k", "{}")}))
	if got := sig.Load().([]string); len(got) != 0 {
		t.Errorf("unsigned request carried %v", got)
	}

	rc := newReceiver(t, testSecrets)
	pub, err = outboxwebhook.New(rc.srv.Client(), outboxwebhook.Config{URL: rc.srv.URL, Unsigned: true})
	if err != nil {
		t.Fatal(err)
	}
	requireOutage(t, "unsigned to a verifying receiver", publishOne(t, pub, newMsg("t", "k", "{}")))
}

// TestWrongSecret: a receiver that does not know the publisher's secret answers 401,
// which pauses the relay instead of dead-lettering every message. Rotation in the right
// order never fails.
func TestWrongSecret(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, [][]byte{newSecret})
	dial := func(secrets ...[]byte) *outboxwebhook.Publisher {
		pub, err := outboxwebhook.Dial(testenv.Context(t), rc.srv.URL, outboxwebhook.Config{Route: "r", Secrets: secrets})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pub.Close)
		return pub
	}
	err := publishOne(t, dial(oldSecret), newMsg("t", "k", "{}"))
	requireOutage(t, "wrong secret", err)
	var se *outboxwebhook.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusUnauthorized || !strings.Contains(se.Body, "no signature matches") {
		t.Errorf("wrong secret: %v, want a 401 StatusError saying no signature matches", err)
	}
	if strings.Contains(err.Error(), string(oldSecret)) || strings.Contains(err.Error(), string(newSecret)) {
		t.Errorf("the error shows a secret: %v", err)
	}
	// Rotation: the publisher signs with the old and the new secret.
	testenv.RequirePublishedAll(t, dial(oldSecret, newSecret).Publish(testenv.Context(t), []*outbox.Message{newMsg("t", "k", "{}")}))
	if n := len(rc.read("/r", 1)); n != 1 {
		t.Errorf("%d deliveries, want 1", n)
	}
}

// TestRequestBuilder checks the request Request builds for tests and benchmarks: the
// route's URL, the payload, a signature that verifies; and a rejection for a message the
// route cannot map.
func TestRequestBuilder(t *testing.T) {
	t.Parallel()
	cfg := outboxwebhook.Config{URL: "https://u:p@hooks.example/in?token=t", Route: "{event_type}", Secrets: testSecrets}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	pub, err := outboxwebhook.New(http.DefaultClient, cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := newMsg("orders", "k", `{"id":1}`)
	m.EventType = "order.placed"
	req, err := pub.Request(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	if req.Method != http.MethodPost || req.URL.String() != "https://u:p@hooks.example/in/order.placed?token=t" {
		t.Errorf("request %s %s", req.Method, req.URL)
	}
	if body, err := outboxwebhook.Verify(req, testSecrets, 0); err != nil || string(body) != `{"id":1}` {
		t.Errorf("Verify: %q, %v", body, err)
	}
	m.EventType = ""
	if _, err := pub.Request(context.Background(), m); !errors.Is(err, outbox.ErrUnroutable) {
		t.Errorf("no event type: %v, want ErrUnroutable", err)
	}
}
