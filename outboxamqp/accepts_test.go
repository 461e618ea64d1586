package outboxamqp

import (
	"errors"
	"maps"
	"strconv"
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

// FuzzWriteAcceptsAMQP: a message Write accepts is one the publisher accepts too, or the
// refusal is one of AMQP's own rules, which are documented (Config, HeaderPriority,
// ErrBadProperty, ErrTooLarge):
//
//   - an Outbox-Priority header that is not a number from 0 to 255;
//   - a routing key over 255 bytes (an AMQP short string), which only a route that adds
//     to a 255-byte field can make.
//
// Every other short string (header names, message_id, content type, type) fits, since
// Write bounds those fields to 255 bytes, and the properties and headers fit RabbitMQ's
// default frame size (128 KiB) within Write's default header limits. What the publisher
// sends reads back, through HeaderStrings as a consumer reads it, as the message's wire
// headers.
func FuzzWriteAcceptsAMQP(f *testing.F) {
	addMessageSeeds(f)
	routes := []*outbox.Route{outbox.MustParseRoute(outbox.RouteTopic), outbox.MustParseRoute("events.{topic}")}
	f.Fuzz(func(t *testing.T, topic, key, aggregateType, eventType, contentType, dedupKey, header, value string, payload []byte) {
		m, ok := preparedMessage(topic, key, aggregateType, eventType, contentType, dedupKey, header, value, payload)
		if !ok {
			return
		}
		for _, route := range routes {
			p := &Publisher{cfg: Config{}.withDefaults(), route: route}
			p.frameMax.Store(131072) // RabbitMQ's default frame_max
			key, pub, err := p.Publishing(m)
			if err != nil {
				priority, hasPriority := m.Headers[HeaderPriority]
				dest, _ := route.Destination(m)
				switch {
				case !errors.Is(err, ErrBadProperty):
					t.Fatalf("route %q: Write accepts a message that AMQP refuses: %v", route, err)
				case hasPriority && !isPriority(priority):
					continue // AMQP's own rule: the priority header
				case len(dest) > shortstrMax && route.String() != outbox.RouteTopic:
					continue // AMQP's own rule: the routing key a prefixed route makes
				default:
					t.Fatalf("route %q: Write accepts a message that AMQP refuses for a reason of every broker: %v", route, err)
				}
			}
			if dest, _ := route.Destination(m); key != dest {
				t.Fatalf("routing key %q, want %q", key, dest)
			}
			if string(pub.Body) != string(m.Payload) || pub.MessageId != m.DedupID() || pub.ContentType != m.ContentType || pub.Type != m.EventType {
				t.Fatalf("sent %+v for %+v", pub, m)
			}
			if got, want := HeaderStrings(pub.Headers), wireHeaders(m); !maps.Equal(got, want) {
				t.Fatalf("headers read back as %q, want %q", got, want)
			}
		}
	})
}

// isPriority reports whether v is an Outbox-Priority the publisher takes.
func isPriority(v string) bool {
	_, err := strconv.ParseUint(strings.TrimSpace(v), 10, 8)
	return err == nil
}
