package outboxsqs

import (
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

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

// FuzzWriteAcceptsSQS: a message Write accepts is one the publisher accepts too, or the
// refusal is one of SQS's own rules, which are documented (Config, ErrInvalidQueue,
// ErrTooLarge): a queue name of 1 to 80 ASCII letters, digits, '-' and '_' (and .fifo),
// and a size over Config.MaxMessageBytes (256 KiB by default, SQS's long-standing limit,
// which is under Write's). What it sends is within SQS's other rules, which it must meet
// by encoding rather than refuse: at most 10 attributes, a body and attribute values of
// the characters SQS allows only; and it reads back (Decode, as a consumer reads it) as
// the payload and the message's wire headers.
func FuzzWriteAcceptsSQS(f *testing.F) {
	addMessageSeeds(f)
	client := sqs.New(sqs.Options{Region: "eu-west-1"})
	var pubs []*Publisher
	for _, route := range []string{outbox.RouteTopic, "q-{topic}.fifo"} {
		p, err := New(client, Config{Route: route})
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(p.Close)
		pubs = append(pubs, p)
	}
	f.Fuzz(func(t *testing.T, topic, key, aggregateType, eventType, contentType, dedupKey, header, value string, payload []byte) {
		m, ok := preparedMessage(topic, key, aggregateType, eventType, contentType, dedupKey, header, value, payload)
		if !ok {
			return
		}
		for _, p := range pubs {
			e, dest, err := p.Entry(m)
			if err != nil {
				if !errors.Is(err, ErrInvalidQueue) && !errors.Is(err, ErrTooLarge) {
					t.Fatalf("route %q: Write accepts a message that SQS refuses: %v", p.route, err)
				}
				continue // SQS's own rules
			}
			if want, _ := p.route.Destination(m); dest != want {
				t.Fatalf("queue %q, want %q", dest, want)
			}
			if len(e.MessageAttributes) > maxAttributes {
				t.Fatalf("%d attributes, over SQS's limit of %d", len(e.MessageAttributes), maxAttributes)
			}
			if !validText(aws.ToString(e.MessageBody)) {
				t.Fatalf("body %q holds characters SQS refuses", aws.ToString(e.MessageBody))
			}
			for name, a := range e.MessageAttributes {
				if v := aws.ToString(a.StringValue); v == "" || !validText(v) {
					t.Fatalf("attribute %q: value %q is empty or holds characters SQS refuses", name, v)
				}
			}
			got, headers, err := Decode(types.Message{Body: e.MessageBody, MessageAttributes: e.MessageAttributes})
			if err != nil || string(got) != string(m.Payload) {
				t.Fatalf("payload %q read back as %q, %v", m.Payload, got, err)
			}
			if want := wireHeaders(m); !maps.Equal(headers, want) {
				t.Fatalf("headers read back as %q, want %q", headers, want)
			}
		}
	})
}
