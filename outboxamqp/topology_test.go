package outboxamqp_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"gopkg.in/yaml.v3"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxamqp"
)

// exampleTopology reads deploy/rabbitmq/topology.yaml with every name prefixed, so that
// tests declare their own copy of it and delete it afterwards.
func exampleTopology(t *testing.T, prefix string) *outboxamqp.Topology {
	t.Helper()
	data, err := os.ReadFile("../deploy/rabbitmq/topology.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var top outboxamqp.Topology
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&top); err != nil {
		t.Fatalf("topology.yaml: %v", err)
	}
	p := func(s *string) {
		if *s != "" {
			*s = prefix + *s
		}
	}
	for i := range top.Exchanges {
		e := &top.Exchanges[i]
		p(&e.Name)
		p(&e.AlternateExchange)
		t.Cleanup(func() { deleteExchange(e.Name) })
	}
	for i := range top.Queues {
		q := &top.Queues[i]
		p(&q.Name)
		p(&q.DeadLetterExchange)
		t.Cleanup(func() { deleteQueue(q.Name) })
	}
	for i := range top.Bindings {
		p(&top.Bindings[i].Exchange)
		p(&top.Bindings[i].Queue)
	}
	return &top
}

// TestTopologyExample declares the example topology twice (idempotence), then checks it
// routes as its comments say: by pattern to the critical and background queues,
// unroutable to the parking queue (confirmed, not returned), rejected by a consumer to
// the dead-letter queue.
func TestTopologyExample(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	prefix := unique("top") + "."
	top := exampleTopology(t, prefix)
	for range 2 {
		if err := top.Declare(testenv.Context(t), channel(t, conn)); err != nil {
			t.Fatal(err)
		}
	}

	pub := newPublisher(t, conn, outboxamqp.Config{Exchange: prefix + "events.topic"})
	topics := map[string]string{
		"billing.payment.captured": "billing.high",
		"notify.email.sent":        "notify.low",
		"order.placed":             "order.events",
		"inventory.reserved":       "events.unroutable",
	}
	var batch []*outbox.Message
	for topic := range topics {
		batch = append(batch, testenv.Message(topic, topic, []byte(topic)))
	}
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batch))
	for topic, queue := range topics {
		got := readQueue(t, conn, prefix+queue, 1)
		if len(got) != 1 || string(got[0].Body) != topic {
			t.Errorf("queue %s holds %d messages, want the one of topic %s", queue, len(got), topic)
		}
	}

	// A consumer gives up on the order: it goes to the dead-letter queue with the
	// queue's dead-letter routing key.
	ch := channel(t, conn)
	d, ok, err := ch.Get(prefix+"order.events", false)
	if err != nil || !ok {
		t.Fatalf("get from order.events: %v %v", ok, err)
	}
	if d.Priority != 0 {
		t.Errorf("priority %d, want 0", d.Priority)
	}
	if err := d.Nack(false, false); err != nil {
		t.Fatal(err)
	}
	dead := readQueue(t, conn, prefix+"events.dead", 1)
	if len(dead) != 1 || string(dead[0].Body) != "order.placed" || dead[0].RoutingKey != "dead.order" {
		t.Fatalf("dead-letter queue holds %v, want the order under routing key dead.order", dead)
	}
}

// TestTopologyConflict: an object that exists with other settings is an error naming it.
func TestTopologyConflict(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	q := declareQueue(t, conn, unique("conflict"), amqp.Table{"x-message-ttl": int32(1000)})
	top := &outboxamqp.Topology{Queues: []outboxamqp.Queue{{Name: q, MessageTTL: outboxamqp.Duration(2 * time.Second)}}}
	err := top.Declare(testenv.Context(t), channel(t, conn))
	var ae *amqp.Error
	if err == nil || !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed ||
		!strings.Contains(err.Error(), `queue "`+q+`"`) || !strings.Contains(err.Error(), "other settings") {
		t.Errorf("conflicting queue: %v, want a 406 naming the queue", err)
	}
	// The same settings (the TTL as another integer type) are no conflict.
	top.Queues[0].MessageTTL = outboxamqp.Duration(time.Second)
	if err := top.Declare(testenv.Context(t), channel(t, conn)); err != nil {
		t.Errorf("equivalent queue: %v", err)
	}

	ex := unique("conflict")
	declareExchange(t, conn, ex, amqp.ExchangeDirect, nil)
	top = &outboxamqp.Topology{Exchanges: []outboxamqp.Exchange{{Name: ex, Type: amqp.ExchangeTopic}}}
	if err := top.Declare(testenv.Context(t), channel(t, conn)); err == nil || !strings.Contains(err.Error(), `exchange "`+ex+`"`) {
		t.Errorf("conflicting exchange type: %v, want an error naming the exchange", err)
	}

	bad := unique("invalid")
	t.Cleanup(func() { deleteQueue(bad) })
	top = &outboxamqp.Topology{Queues: []outboxamqp.Queue{{Name: bad, Arguments: map[string]any{"x-max-length": "five"}}}}
	if err := top.Declare(testenv.Context(t), channel(t, conn)); err == nil || !strings.Contains(err.Error(), "refuses its settings") {
		t.Errorf("invalid argument: %v, want an error saying RabbitMQ refuses the settings", err)
	}

	top = &outboxamqp.Topology{Bindings: []outboxamqp.Binding{{Exchange: unique("missing"), Queue: q}}}
	if err := top.Declare(testenv.Context(t), channel(t, conn)); err == nil || !strings.Contains(err.Error(), "binding of queue") {
		t.Errorf("binding to a missing exchange: %v, want an error naming the binding", err)
	}
}

func TestTopologyValidate(t *testing.T) {
	t.Parallel()
	f := false
	for _, tc := range []struct {
		top  outboxamqp.Topology
		want string
	}{
		{outboxamqp.Topology{Exchanges: []outboxamqp.Exchange{{}}}, "no name"},
		{outboxamqp.Topology{Exchanges: []outboxamqp.Exchange{{Name: "e", Type: "fan-out"}}}, `exchange "e": type "fan-out"`},
		{outboxamqp.Topology{Exchanges: []outboxamqp.Exchange{{Name: "e"}, {Name: "e"}}}, "twice"},
		{outboxamqp.Topology{Queues: []outboxamqp.Queue{{}}}, "no name"},
		{outboxamqp.Topology{Queues: []outboxamqp.Queue{{Name: "q", Type: "stream"}}}, `type "stream"`},
		{outboxamqp.Topology{Queues: []outboxamqp.Queue{{Name: "q", Type: "quorum", MaxPriority: 5}}}, "no priorities"},
		{outboxamqp.Topology{Queues: []outboxamqp.Queue{{Name: "q", Type: "quorum", Lazy: true}}}, "no lazy"},
		{outboxamqp.Topology{Queues: []outboxamqp.Queue{{Name: "q", Type: "quorum", Durable: &f}}}, "always durable"},
		{outboxamqp.Topology{Queues: []outboxamqp.Queue{{Name: "q", MaxPriority: 256}}}, "max-priority"},
		{outboxamqp.Topology{Queues: []outboxamqp.Queue{{Name: "q", MaxLength: -1}}}, "negative"},
		{outboxamqp.Topology{Queues: []outboxamqp.Queue{{Name: "q", Overflow: "drop-tail"}}}, `overflow "drop-tail"`},
		{outboxamqp.Topology{Queues: []outboxamqp.Queue{{Name: "q", DeadLetterRoutingKey: "k"}}}, "needs a dead-letter-exchange"},
		{outboxamqp.Topology{Bindings: []outboxamqp.Binding{{Queue: "q"}}}, "default exchange"},
	} {
		err := tc.top.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an error containing %q", tc.top, err, tc.want)
		}
	}
	// A queue and an exchange may share a name.
	ok := outboxamqp.Topology{Exchanges: []outboxamqp.Exchange{{Name: "x"}}, Queues: []outboxamqp.Queue{{Name: "x"}}}
	if err := ok.Validate(); err != nil {
		t.Errorf("exchange and queue of one name: %v", err)
	}
}

// TestTopologyFormats reads durations and arguments from YAML and JSON alike, and
// declares JSON numbers as integers.
func TestTopologyFormats(t *testing.T) {
	t.Parallel()
	const y = `
queues:
  - name: q
    message-ttl: 1m30s
    arguments: {x-max-length: 5, x-single-active-consumer: true}
`
	const j = `{"queues": [{"name": "q", "message-ttl": "1m30s", "arguments": {"x-max-length": 5, "x-single-active-consumer": true}}]}`
	var fromYAML, fromJSON outboxamqp.Topology
	if err := yaml.Unmarshal([]byte(y), &fromYAML); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(j), &fromJSON); err != nil {
		t.Fatal(err)
	}
	for name, top := range map[string]outboxamqp.Topology{"yaml": fromYAML, "json": fromJSON} {
		if len(top.Queues) != 1 || time.Duration(top.Queues[0].MessageTTL) != 90*time.Second {
			t.Errorf("%s: %+v, want message-ttl 90s", name, top.Queues)
		}
	}
	if err := yaml.Unmarshal([]byte("queues: [{name: q, message-ttl: soon}]"), &fromYAML); err == nil || !strings.Contains(err.Error(), "60s") {
		t.Errorf("bad duration: %v, want an error with an example", err)
	}

	// Declared for real: RabbitMQ refuses x-max-length as a double, so the JSON 5 must
	// go as an integer.
	conn := dialTest(t)
	name := unique("formats")
	fromJSON.Queues[0].Name = name
	fromJSON.Queues[0].Type = "quorum"
	t.Cleanup(func() { deleteQueue(name) })
	if err := fromJSON.Declare(testenv.Context(t), channel(t, conn)); err != nil {
		t.Fatal(err)
	}
	if err := fromJSON.Declare(testenv.Context(t), channel(t, conn)); err != nil {
		t.Fatalf("again: %v", err)
	}
}
