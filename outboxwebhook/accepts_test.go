package outboxwebhook

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
)

// addMessageSeeds seeds a fuzz target over a message's fields with what the brokers'
// own rules are about: reserved names, separators, wildcards, white space and invisible
// characters, header names HTTP manages, values with edge white space, odd payloads.
func addMessageSeeds(f *testing.F) {
	type seed struct {
		topic, key, aggregateType, eventType, contentType, dedupKey, header, value string
		payload                                                                    []byte
	}
	for _, s := range []seed{
		{"orders", "o-1", "order", "placed", "", "", "traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", []byte(`{"n":1}`)},
		{"$JS.API.STREAM.DELETE.ORDERS", "", "", "", "", "", "x", "y", nil},
		{"_INBOX.x", "k y", "", "", "text/plain", "d", "Outbox-Id", "shadow", []byte{0xff}},
		{"a..b", "", "", "", "", "", "x", " padded\t", nil},
		{"orders.*", "", "", "", "", "", "x", "", nil},
		{">", "", "", "", "", "", "x", "\t", nil},
		{"__consumer_offsets", "", "", "", "", "", "Host", "h", nil},
		{"amq.gen", "", "", "", "", "", "Content-Length", "1", nil},
		{"orders/é", "", "", "", "", "", "Authorization", "Bearer x", nil},
		{"nbsp\u00a0topic", "", "", "", "", "", "x", "line\u2028sep", nil},
		{"..", "", "", "", "", "", "x", "y", nil},
		{".", "", "", "", "application/json; charset=utf-8", "", "Outbox-Priority", "300", []byte(`"s"`)},
		{strings.Repeat("t", 255), strings.Repeat("k", 255), strings.Repeat("a", 255), strings.Repeat("e", 255), strings.Repeat("c", 255), strings.Repeat("d", 255), strings.Repeat("h", 255), strings.Repeat("v", 1000), nil},
		{"q.fifo", "", "", "", "", "", "x-amz-y", "\U0010FFFF\uFFFE", []byte("a\x00b")},
	} {
		f.Add(s.topic, s.key, s.aggregateType, s.eventType, s.contentType, s.dedupKey, s.header, s.value, s.payload)
	}
}

// preparedMessage is the message of the fuzzed fields, prepared as Write prepares it,
// or false when Write refuses it.
func preparedMessage(topic, key, aggregateType, eventType, contentType, dedupKey, header, value string, payload []byte) (*outbox.Message, bool) {
	m := outbox.Message{
		Topic: topic, Key: key, AggregateType: aggregateType, EventType: eventType, ContentType: contentType,
		DedupKey: dedupKey, Payload: payload, CreatedAt: time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC),
	}
	if header != "" || value != "" {
		m.Headers = map[string]string{header: value}
	}
	msgs := []outbox.Message{m}
	if err := (outbox.Limits{}).Prepare(msgs); err != nil {
		return nil, false
	}
	return &msgs[0], true
}

// wireHeaders are m's headers as WireHeaders gives them, the last value of a name
// winning.
func wireHeaders(m *outbox.Message) map[string]string {
	h := map[string]string{}
	m.WireHeaders(func(k, v string) { h[k] = v })
	return h
}

// FuzzWriteAcceptsWebhook: a message Write accepts is one the publisher accepts too, or
// the refusal is one of HTTP's own rules, which are documented (the package doc,
// checkHeader, resolve):
//
//   - a header HTTP manages (Host, Content-Length, Connection, Transfer-Encoding, ...) or
//     one that carries credentials (Authorization, Proxy-Authorization, Cookie);
//   - a placeholder value "." or "..", which would step out of the configured path.
//
// Header names that are not tokens and control characters in values are Write's rules for
// every broker, so a refusal for them is a bug of Write. The request goes to the
// configured host, with the route's value as one escaped path segment, carries the wire
// headers (Idempotency-Key and Outbox-Signature are the publisher's own) and verifies
// with the receiver's Verify.
func FuzzWriteAcceptsWebhook(f *testing.F) {
	addMessageSeeds(f)
	secrets := [][]byte{[]byte("fuzz-secret")}
	var pubs []*Publisher
	for _, route := range []string{outbox.RouteTopic, "events/{topic}"} {
		p, err := New(&http.Client{}, Config{URL: "https://hooks.example/base", Route: route, Secrets: secrets})
		if err != nil {
			f.Fatal(err)
		}
		pubs = append(pubs, p)
	}
	f.Fuzz(func(t *testing.T, topic, key, aggregateType, eventType, contentType, dedupKey, header, value string, payload []byte) {
		m, ok := preparedMessage(topic, key, aggregateType, eventType, contentType, dedupKey, header, value, payload)
		if !ok {
			return
		}
		for _, p := range pubs {
			req, err := p.Request(context.Background(), m)
			if err != nil {
				name := http.CanonicalHeaderKey(header)
				switch {
				case (hopHeaders[name] || credentialHeaders[name]) && strings.Contains(err.Error(), "cannot travel in an HTTP request"):
					continue // HTTP's own rule: a header the connection or the configuration owns
				case (m.Topic == "." || m.Topic == "..") && strings.Contains(err.Error(), "step out of the URL's path"):
					continue // HTTP's own rule: a dot segment
				default:
					t.Fatalf("route %q: Write accepts a message that the webhook publisher refuses for a reason of every broker: %v", p.route, err)
				}
			}
			prefix := "/base/"
			if p.route.String() != outbox.RouteTopic {
				prefix = "/base/events/"
			}
			if req.URL.Scheme != "https" || req.URL.Host != "hooks.example" || req.URL.RawQuery != "" ||
				req.URL.Path != prefix+m.Topic || req.URL.EscapedPath() != prefix+escapeValue(m.Topic) {
				t.Fatalf("topic %q posted to %s", m.Topic, req.URL)
			}
			// In the order the publisher sets them, by canonical name: a metadata header
			// wins over an own header that differs from it in case only.
			want := map[string]string{}
			m.WireHeaders(func(k, v string) { want[http.CanonicalHeaderKey(k)] = v })
			delete(want, HeaderIdempotencyKey)
			delete(want, HeaderSignature)
			for k, v := range want {
				if got := req.Header.Values(k); len(got) != 1 || got[0] != v {
					t.Fatalf("header %q: %q sent as %q", k, v, got)
				}
			}
			body, err := Verify(req, secrets, 0)
			if err != nil || string(body) != string(m.Payload) {
				t.Fatalf("the request does not verify: %v (body %q)", err, body)
			}
		}
	})
}
