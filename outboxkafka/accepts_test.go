package outboxkafka

import (
	"errors"
	"maps"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest/conformance"
)

// FuzzWriteAcceptsKafka: a message Write accepts is one the publisher accepts too, or the
// refusal is one of Kafka's own topic naming rules, which are documented (checkTopic,
// the package doc): 1 to 249 ASCII letters, digits, '.', '_' and '-', not "." or "..",
// not starting with "__" (internal topics). The record carries the key as it is (none
// for an empty key), the payload (an empty value, never a null tombstone) and each wire
// header once, the metadata value winning over an own header of the same name.
//
// Sizes are not checked here: TestPublishWriteLimits publishes the largest message
// Write's default limits accept with this package's default MaxMessageBytes.
func FuzzWriteAcceptsKafka(f *testing.F) {
	routes := []*outbox.Route{outbox.MustParseRoute(outbox.RouteTopic), outbox.MustParseRoute("events.{topic}")}
	conformance.FuzzMessages(f, func(t *testing.T, m *outbox.Message) {
		for _, route := range routes {
			p := &Publisher{route: route}
			r, err := p.Record(m)
			if err != nil {
				dest, _ := route.Destination(m)
				if !errors.Is(err, kerr.InvalidTopicException) || !outbox.IsPermanent(err) || checkTopic(dest) == "" {
					t.Fatalf("route %q: Write accepts a message that Kafka refuses: %v", route, err)
				}
				continue // Kafka's own naming rules
			}
			if dest, _ := route.Destination(m); r.Topic != dest {
				t.Fatalf("topic %q, want %q", r.Topic, dest)
			}
			if string(r.Key) != m.Key || (m.Key == "") != (r.Key == nil) || r.Value == nil || string(r.Value) != string(m.Payload) {
				t.Fatalf("record key %q value %q for key %q payload %q", r.Key, r.Value, m.Key, m.Payload)
			}
			got := map[string]string{}
			for _, h := range r.Headers {
				if _, dup := got[h.Key]; dup {
					t.Fatalf("header %q twice in %v", h.Key, r.Headers)
				}
				got[h.Key] = string(h.Value)
			}
			if want := conformance.WireHeaders(m); !maps.Equal(got, want) {
				t.Fatalf("headers %q, want %q", got, want)
			}
		}
	})
}
