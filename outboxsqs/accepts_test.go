package outboxsqs

import (
	"errors"
	"maps"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest/conformance"
)

// FuzzWriteAcceptsSQS: a message Write accepts is one the publisher accepts too, or the
// refusal is one of SQS's own rules, which are documented (Config, ErrInvalidQueue,
// ErrTooLarge): a queue name of 1 to 80 ASCII letters, digits, '-' and '_' (and .fifo),
// and a size over Config.MaxMessageBytes (256 KiB by default, SQS's long-standing limit,
// which is under Write's). What it sends is within SQS's other rules, which it must meet
// by encoding rather than refuse: at most 10 attributes, a body and attribute values of
// the characters SQS allows only; and it reads back (Decode, as a consumer reads it) as
// the payload and the message's wire headers.
func FuzzWriteAcceptsSQS(f *testing.F) {
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
	conformance.FuzzMessages(f, func(t *testing.T, m *outbox.Message) {
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
			if want := conformance.WireHeaders(m); !maps.Equal(headers, want) {
				t.Fatalf("headers read back as %q, want %q", headers, want)
			}
		}
	})
}
