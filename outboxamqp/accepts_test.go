package outboxamqp

import (
	"errors"
	"maps"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest/conformance"
)

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
	routes := []*outbox.Route{outbox.MustParseRoute(outbox.RouteTopic), outbox.MustParseRoute("events.{topic}")}
	conformance.FuzzMessages(f, func(t *testing.T, m *outbox.Message) {
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
			if got, want := HeaderStrings(pub.Headers), conformance.WireHeaders(m); !maps.Equal(got, want) {
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
