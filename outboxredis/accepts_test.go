package outboxredis

import (
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// FuzzWriteAcceptsRedis: Redis has no rule of its own on what a message holds (keys and
// field values are binary-safe), so every message Write accepts gets a stream name from
// the route, and its entry reads back (ParseEntry, as a consumer reads it) as the payload
// byte for byte and the message's wire headers, each once.
func FuzzWriteAcceptsRedis(f *testing.F) {
	addMessageSeeds(f)
	routes := []*outbox.Route{outbox.MustParseRoute(outbox.RouteTopic), outbox.MustParseRoute("events:{topic}")}
	f.Fuzz(func(t *testing.T, topic, key, aggregateType, eventType, contentType, dedupKey, header, value string, payload []byte) {
		m, ok := preparedMessage(topic, key, aggregateType, eventType, contentType, dedupKey, header, value, payload)
		if !ok {
			return
		}
		for _, route := range routes {
			p := &Publisher{route: route, cfg: Config{MaxLen: 1000}}
			stream, err := route.Destination(m)
			if err != nil {
				t.Fatalf("route %q: Write accepts a message with no stream: %v", route, err)
			}
			args := p.command(stream, m)
			if args[0] != "XADD" || args[1] != stream {
				t.Fatalf("command %q", args[:2])
			}
			fields := Fields(m)
			if tail := args[len(args)-len(fields):]; fmt.Sprint(tail) != fmt.Sprint(fields) || args[len(args)-len(fields)-1] != "*" {
				t.Fatalf("XADD sends %q, not the entry's fields %q", args, fields)
			}
			values := map[string]any{}
			for i := 0; i+1 < len(fields); i += 2 {
				name := fields[i].(string)
				if _, dup := values[name]; dup {
					t.Fatalf("field %q twice", name)
				}
				switch v := fields[i+1].(type) { // go-redis reads every value back as a string
				case []byte:
					values[name] = string(v)
				case string:
					values[name] = v
				default:
					t.Fatalf("field %q: %T", name, v)
				}
			}
			e := ParseEntry(redis.XMessage{ID: "1-0", Values: values})
			if string(e.Payload) != string(m.Payload) {
				t.Fatalf("payload %q read back as %q", m.Payload, e.Payload)
			}
			if want := wireHeaders(m); !maps.Equal(e.Headers, want) {
				t.Fatalf("headers read back as %q, want %q", e.Headers, want)
			}
		}
	})
}
