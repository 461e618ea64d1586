package outboxkafka

import (
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

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

// FuzzWriteAcceptsKafka: a message Write accepts is one the publisher accepts too, or the
// refusal is one of Kafka's own topic naming rules, which are documented (checkTopic,
// the package doc): 1 to 249 ASCII letters, digits, '.', '_' and '-', not "." or "..",
// not starting with "__" (internal topics). The record carries the key as it is (none
// for an empty key), the payload (an empty value, never a null tombstone) and each wire
// header once, the metadata value winning over an own header of the same name.
//
// Not checked here, found by reading: Write's default payload limit (1,015,808 bytes,
// outbox.MaxPayloadBytesDefault) is over this package's default MaxMessageBytes
// (1,000,012), so a payload between the two passes Write and is refused by the client as
// too large; Write's documentation says its default fits Kafka's.
func FuzzWriteAcceptsKafka(f *testing.F) {
	addMessageSeeds(f)
	routes := []*outbox.Route{outbox.MustParseRoute(outbox.RouteTopic), outbox.MustParseRoute("events.{topic}")}
	f.Fuzz(func(t *testing.T, topic, key, aggregateType, eventType, contentType, dedupKey, header, value string, payload []byte) {
		m, ok := preparedMessage(topic, key, aggregateType, eventType, contentType, dedupKey, header, value, payload)
		if !ok {
			return
		}
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
			if want := wireHeaders(m); !maps.Equal(got, want) {
				t.Fatalf("headers %q, want %q", got, want)
			}
		}
	})
}
