package outboxredis

import (
	"fmt"
	"maps"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest/conformance"
)

// FuzzWriteAcceptsRedis: Redis has no rule of its own on what a message holds (keys and
// field values are binary-safe), so every message Write accepts gets a stream name from
// the route, and its entry reads back (ParseEntry, as a consumer reads it) as the payload
// byte for byte and the message's wire headers, each once.
func FuzzWriteAcceptsRedis(f *testing.F) {
	routes := []*outbox.Route{outbox.MustParseRoute(outbox.RouteTopic), outbox.MustParseRoute("events:{topic}")}
	conformance.FuzzMessages(f, func(t *testing.T, m *outbox.Message) {
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
			if want := conformance.WireHeaders(m); !maps.Equal(e.Headers, want) {
				t.Fatalf("headers read back as %q, want %q", e.Headers, want)
			}
		}
	})
}
