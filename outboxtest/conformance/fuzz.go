package conformance

import (
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
)

// The helpers below serve each publisher's fuzz target "Write accepts what the publisher
// accepts" (FuzzWriteAccepts<Broker>, in the publisher's own package, where it can call
// the publisher's unexported checks): the target over the message as Write prepares it,
// its seeds, and the message's wire headers.

// AddMessageSeeds seeds a fuzz target over a message's fields with what the brokers'
// own rules are about: reserved names, separators, wildcards, white space and invisible
// characters, header names HTTP manages, values with inner white space (Write refuses it
// at either end, which NATS and HTTP trim), odd payloads.
func AddMessageSeeds(f *testing.F) {
	type seed struct {
		topic, key, aggregateType, eventType, contentType, dedupKey, header, value string
		payload                                                                    []byte
	}
	for _, s := range []seed{
		{"orders", "o-1", "order", "placed", "", "", "traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", []byte(`{"n":1}`)},
		{"$JS.API.STREAM.DELETE.ORDERS", "", "", "", "", "", "x", "y", nil},
		{"_INBOX.x", "k y", "", "", "text/plain", "d", "Outbox-Id", "shadow", []byte{0xff}},
		{"a..b", "", "", "", "", "", "x", "pad ded\tin  side", nil},
		{"orders.*", "", "", "", "", "", "x", "", nil},
		{">", "", "", "", "", "", "x", "a\tb", nil},
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

// FuzzMessages runs check, as a fuzz target of f seeded with AddMessageSeeds, on every
// message of fuzzed fields that Write accepts, prepared as Write prepares it.
func FuzzMessages(f *testing.F, check func(t *testing.T, m *outbox.Message)) {
	AddMessageSeeds(f)
	f.Fuzz(func(t *testing.T, topic, key, aggregateType, eventType, contentType, dedupKey, header, value string, payload []byte) {
		if m, ok := PreparedMessage(topic, key, aggregateType, eventType, contentType, dedupKey, header, value, payload); ok {
			check(t, m)
		}
	})
}

// PreparedMessage is the message of the fuzzed fields, prepared as Write prepares it,
// or false when Write refuses it.
func PreparedMessage(topic, key, aggregateType, eventType, contentType, dedupKey, header, value string, payload []byte) (*outbox.Message, bool) {
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

// WireHeaders are m's headers as WireHeaders gives them, the last value of a name
// winning.
func WireHeaders(m *outbox.Message) map[string]string {
	h := map[string]string{}
	m.WireHeaders(func(k, v string) { h[k] = v })
	return h
}
