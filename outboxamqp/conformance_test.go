package outboxamqp_test

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testproxy"
	"github.com/outboxkit/outbox/outboxamqp"
	"github.com/outboxkit/outbox/outboxtest/conformance"
)

// TestConformance runs the shared publisher suite through a toxiproxy, which the outage
// test cuts.
//
// Each destination is a durable queue plus a direct exchange of the same name that binds
// it with the routing key "conformance", the topic of the suite's messages. The suite
// hands the publisher a placeholder-free route (the destination); the publisher uses it
// as its Exchange and routes by "{topic}". That is what lets the suite's refused message
// exist: it has another topic, so its routing key matches no binding and RabbitMQ returns
// it, mandatory, from an exchange without an alternate exchange.
func TestConformance(t *testing.T) {
	conn := dialTest(t)
	proxy := testproxy.New(t, testHostPort(t))
	conformance.Run(t, conformance.Broker{
		Destination: func(t *testing.T) string {
			name := unique("conformance")
			declareQueue(t, conn, name, nil)
			declareExchange(t, conn, name, amqp.ExchangeDirect, nil)
			bind(t, conn, name, "conformance", name)
			return name
		},
		Publisher: func(t *testing.T, route string) outbox.Publisher {
			pub, err := outboxamqp.Dial(testenv.Context(t), viaAddr(t, proxy.Addr()),
				outboxamqp.Config{Exchange: route, Route: "{topic}"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pub.Close)
			return pub
		},
		Read: func(t *testing.T, dest string, n int) []conformance.Received {
			var out []conformance.Received
			for _, d := range readQueue(t, conn, dest, n) {
				r := conformance.Received{
					DedupID:     d.MessageId,
					ContentType: d.ContentType,
					Payload:     d.Body,
					Headers:     map[string]string{},
				}
				for k, v := range d.Headers {
					s, ok := v.(string)
					if !ok {
						t.Errorf("header %s is a %T, want a string", k, v)
					}
					r.Headers[k] = s
				}
				r.Key = r.Headers[outbox.HeaderKey]
				out = append(out, r)
			}
			return out
		},
		Reject: func(t *testing.T, dest string) *outbox.Message {
			m := testenv.Message("unbound-topic", "reject", []byte(`{}`))
			m.ContentType = outbox.ContentTypeJSON
			return m
		},
		Cut:     func(t *testing.T) { proxy.Cut() },
		Restore: func(t *testing.T) { proxy.Restore(t) },
	})
}
