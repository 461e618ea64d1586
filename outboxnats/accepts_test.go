package outboxnats

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
	addMessageSeeds(f)
	routes := []*outbox.Route{outbox.MustParseRoute(outbox.RouteTopic), outbox.MustParseRoute("events.{topic}")}
	f.Fuzz(func(t *testing.T, topic, key, aggregateType, eventType, contentType, dedupKey, header, value string, payload []byte) {
		m, ok := preparedMessage(topic, key, aggregateType, eventType, contentType, dedupKey, header, value, payload)
		if !ok {
			return
		}
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
			for k, v := range wireHeaders(m) {
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
