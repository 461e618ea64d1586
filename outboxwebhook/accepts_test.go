package outboxwebhook

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest/conformance"
)

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
	secrets := [][]byte{[]byte("fuzz-secret")}
	var pubs []*Publisher
	for _, route := range []string{outbox.RouteTopic, "events/{topic}"} {
		p, err := New(&http.Client{}, Config{URL: "https://hooks.example/base", Route: route, Secrets: secrets})
		if err != nil {
			f.Fatal(err)
		}
		pubs = append(pubs, p)
	}
	conformance.FuzzMessages(f, func(t *testing.T, m *outbox.Message) {
		for _, p := range pubs {
			req, err := p.Request(context.Background(), m)
			if err != nil {
				owned := false // the message's one fuzzed header, if any, is one HTTP manages or carries credentials
				for name := range m.Headers {
					owned = hopHeaders[http.CanonicalHeaderKey(name)] || credentialHeaders[http.CanonicalHeaderKey(name)]
				}
				switch {
				case owned && strings.Contains(err.Error(), "cannot travel in an HTTP request"):
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
