package outboxnats

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest/conformance"
)

// FuzzWriteAcceptsNATS: a message Write accepts is one the publisher accepts too, or the
// refusal is one of NATS's own rules, which are documented (package doc, checkSubject):
//
//   - a subject's first token starting with "$" ($JS, $SYS, $KV, $O, ...) or being
//     _INBOX or _R_: the server's APIs and replies;
//   - an empty token (a topic that starts or ends with a dot, or has two in a row);
//   - a wildcard token ("*" or ">").
//
// White space and control characters, which subjects cannot hold, are Write's rule for
// every broker (topics and types have none), so a refusal for them is a bug of Write.
// Headers go as they are (nats.Header keeps the case of names); the message fits the
// server's default max_payload (1 MiB) whenever Write's default limits hold.
func FuzzWriteAcceptsNATS(f *testing.F) {
	routes := []*outbox.Route{outbox.MustParseRoute(outbox.RouteTopic), outbox.MustParseRoute("events.{topic}")}
	conformance.FuzzMessages(f, func(t *testing.T, m *outbox.Message) {
		for _, route := range routes {
			p := &Publisher{route: route, nc: &nats.Conn{}} // a Conn without a server: no max_payload known
			msg, err := p.Msg(m)
			if err != nil {
				subject, _ := route.Destination(m)
				reason := checkSubject(subject)
				switch {
				case !errors.Is(err, nats.ErrBadSubject) || !outbox.IsPermanent(err):
					t.Fatalf("route %q, topic %q: refused with %v, not an invalid subject", route, m.Topic, err)
				case strings.Contains(reason, "reserved"), strings.Contains(reason, "empty token"), strings.Contains(reason, "wildcard"):
					continue // NATS's own rules
				default:
					t.Fatalf("route %q: Write accepts topic %q, which NATS refuses for a reason of every broker: %v", route, m.Topic, err)
				}
			}
			if string(msg.Data) != string(m.Payload) {
				t.Fatalf("payload %q sent as %q", m.Payload, msg.Data)
			}
			for k, v := range conformance.WireHeaders(m) {
				if got := msg.Header.Get(k); got != v {
					t.Fatalf("header %q: %q sent as %q", k, v, got)
				}
			}
			if size := len(m.Payload) + headerSize(msg.Header, jetstream.MsgIDHeader, m.DedupID()); len(m.Payload) <= outbox.MaxPayloadBytesDefault && size > 1<<20 {
				t.Fatalf("a message within Write's default limits is %d bytes, over NATS's default max_payload", size)
			}
		}
	})
}
