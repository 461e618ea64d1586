package outboxamqp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Topology is a set of exchanges, queues and bindings for RabbitMQ to have, read from
// YAML or JSON (deploy/rabbitmq/topology.yaml is an example; `outbox rabbitmq declare -f`
// declares one). Declaring is idempotent: what already exists with the same settings is
// left alone, so a service may declare its topology at every start. A Topology is a plain
// value, safe for concurrent reads.
type Topology struct {
	Exchanges []Exchange `yaml:"exchanges,omitempty" json:"exchanges,omitempty"`
	Queues    []Queue    `yaml:"queues,omitempty" json:"queues,omitempty"`
	Bindings  []Binding  `yaml:"bindings,omitempty" json:"bindings,omitempty"`
}

// Exchange is an exchange to declare.
type Exchange struct {
	Name string `yaml:"name" json:"name"`
	// Type is direct, fanout, topic or headers. Defaults to topic.
	Type string `yaml:"type,omitempty" json:"type,omitempty"`
	// Durable exchanges survive a broker restart. Defaults to true.
	Durable    *bool `yaml:"durable,omitempty" json:"durable,omitempty"`
	AutoDelete bool  `yaml:"auto-delete,omitempty" json:"auto-delete,omitempty"`
	// Internal exchanges take messages only from other exchanges (as an alternate or
	// dead-letter exchange), never from publishers.
	Internal bool `yaml:"internal,omitempty" json:"internal,omitempty"`
	// AlternateExchange receives the messages this exchange cannot route. With one, an
	// unroutable message is parked there and confirmed, never returned to the publisher.
	AlternateExchange string `yaml:"alternate-exchange,omitempty" json:"alternate-exchange,omitempty"`
	// Arguments are further x-arguments, passed as they are.
	Arguments map[string]any `yaml:"arguments,omitempty" json:"arguments,omitempty"`
}

// Queue is a queue to declare. Zero fields set nothing (the broker's default).
type Queue struct {
	Name string `yaml:"name" json:"name"`
	// Type is classic or quorum (x-queue-type). Defaults to classic. Quorum queues are
	// replicated; they are always durable and have no priorities and no lazy mode.
	Type string `yaml:"type,omitempty" json:"type,omitempty"`
	// Durable queues survive a broker restart. Defaults to true.
	Durable *bool `yaml:"durable,omitempty" json:"durable,omitempty"`
	// Lazy keeps a classic queue's messages on disk (x-queue-mode lazy). RabbitMQ 3.12
	// and later ignore it: every classic queue behaves so.
	Lazy bool `yaml:"lazy,omitempty" json:"lazy,omitempty"`
	// MessageTTL drops (or dead-letters) messages older than this (x-message-ttl), as a
	// duration: "60s".
	MessageTTL Duration `yaml:"message-ttl,omitempty" json:"message-ttl,omitempty"`
	// MaxLength and MaxLengthBytes bound the queue (x-max-length, x-max-length-bytes);
	// Overflow says what happens at the bound (x-overflow): drop-head (the default: the
	// oldest message is dropped or dead-lettered), reject-publish or reject-publish-dlx
	// (the new message is refused: the publisher gets a nack, an outage for the relay).
	MaxLength      int64  `yaml:"max-length,omitempty" json:"max-length,omitempty"`
	MaxLengthBytes int64  `yaml:"max-length-bytes,omitempty" json:"max-length-bytes,omitempty"`
	Overflow       string `yaml:"overflow,omitempty" json:"overflow,omitempty"`
	// MaxPriority makes a classic queue deliver higher priority messages first
	// (x-max-priority, 1 to 255; RabbitMQ advises at most 10).
	MaxPriority int `yaml:"max-priority,omitempty" json:"max-priority,omitempty"`
	// DeadLetterExchange receives the messages the queue drops: rejected by consumers
	// without requeue, expired, or over the length bound (x-dead-letter-exchange), with
	// DeadLetterRoutingKey as their routing key when set (x-dead-letter-routing-key).
	DeadLetterExchange   string `yaml:"dead-letter-exchange,omitempty" json:"dead-letter-exchange,omitempty"`
	DeadLetterRoutingKey string `yaml:"dead-letter-routing-key,omitempty" json:"dead-letter-routing-key,omitempty"`
	// Arguments are further x-arguments, passed as they are.
	Arguments map[string]any `yaml:"arguments,omitempty" json:"arguments,omitempty"`
}

// Binding binds a queue to an exchange.
type Binding struct {
	Exchange string `yaml:"exchange" json:"exchange"`
	Queue    string `yaml:"queue" json:"queue"`
	// RoutingKey is the binding key: a pattern for a topic exchange ("order.*"), ignored
	// by fanout and headers exchanges.
	RoutingKey string `yaml:"routing-key,omitempty" json:"routing-key,omitempty"`
	// Arguments are the binding's arguments (x-match and header values for a headers
	// exchange).
	Arguments map[string]any `yaml:"arguments,omitempty" json:"arguments,omitempty"`
}

// Duration is a time.Duration written as a string such as "60s" or "1h30m" in YAML and
// JSON.
type Duration time.Duration

// MarshalText writes d as time.Duration.String does.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText reads a duration such as "60s".
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("want a duration such as 60s or 10m: %w", err)
	}
	*d = Duration(v)
	return nil
}

func durable(b *bool) bool { return b == nil || *b }

// Validate checks t without a broker: names, types and settings RabbitMQ would refuse or
// that contradict each other. Its error names the object.
func (t *Topology) Validate() error {
	seen := map[string]bool{}
	for _, e := range t.Exchanges {
		what := fmt.Sprintf("exchange %q", e.Name)
		switch {
		case e.Name == "":
			return errors.New("outboxamqp: topology: an exchange has no name")
		case len(e.Name) > shortstrMax:
			return fmt.Errorf("outboxamqp: topology: %s: the name is over %d bytes", what, shortstrMax)
		case seen["e"+e.Name]:
			return fmt.Errorf("outboxamqp: topology: %s is listed twice", what)
		}
		seen["e"+e.Name] = true
		switch e.Type {
		case "", amqp.ExchangeDirect, amqp.ExchangeFanout, amqp.ExchangeTopic, amqp.ExchangeHeaders:
		default:
			return fmt.Errorf("outboxamqp: topology: %s: type %q: want direct, fanout, topic or headers", what, e.Type)
		}
	}
	for _, q := range t.Queues {
		what := fmt.Sprintf("queue %q", q.Name)
		switch {
		case q.Name == "":
			return errors.New("outboxamqp: topology: a queue has no name (server-named queues do not belong in a topology)")
		case len(q.Name) > shortstrMax:
			return fmt.Errorf("outboxamqp: topology: %s: the name is over %d bytes", what, shortstrMax)
		case seen["q"+q.Name]:
			return fmt.Errorf("outboxamqp: topology: %s is listed twice", what)
		case q.MessageTTL < 0 || q.MaxLength < 0 || q.MaxLengthBytes < 0:
			return fmt.Errorf("outboxamqp: topology: %s: message-ttl, max-length and max-length-bytes must not be negative", what)
		case q.MaxPriority < 0 || q.MaxPriority > 255:
			return fmt.Errorf("outboxamqp: topology: %s: max-priority %d: want 1 to 255", what, q.MaxPriority)
		case q.DeadLetterRoutingKey != "" && q.DeadLetterExchange == "":
			return fmt.Errorf("outboxamqp: topology: %s: dead-letter-routing-key needs a dead-letter-exchange", what)
		}
		seen["q"+q.Name] = true
		switch q.Overflow {
		case "", "drop-head", "reject-publish", "reject-publish-dlx":
		default:
			return fmt.Errorf("outboxamqp: topology: %s: overflow %q: want drop-head, reject-publish or reject-publish-dlx", what, q.Overflow)
		}
		switch q.Type {
		case "", "classic":
		case "quorum":
			switch {
			case !durable(q.Durable):
				return fmt.Errorf("outboxamqp: topology: %s: a quorum queue is always durable", what)
			case q.Lazy:
				return fmt.Errorf("outboxamqp: topology: %s: a quorum queue has no lazy mode (it keeps messages on disk anyway)", what)
			case q.MaxPriority > 0:
				return fmt.Errorf("outboxamqp: topology: %s: a quorum queue has no priorities: use a separate queue for urgent messages", what)
			case q.Overflow == "reject-publish-dlx":
				return fmt.Errorf("outboxamqp: topology: %s: a quorum queue does not support overflow reject-publish-dlx", what)
			}
		default:
			return fmt.Errorf("outboxamqp: topology: %s: type %q: want classic or quorum", what, q.Type)
		}
	}
	for _, b := range t.Bindings {
		if b.Exchange == "" || b.Queue == "" {
			return fmt.Errorf("outboxamqp: topology: binding of queue %q to exchange %q with key %q: both the exchange and the queue are needed (the default exchange takes no bindings)",
				b.Queue, b.Exchange, b.RoutingKey)
		}
	}
	return nil
}

// Declare declares t on ch, in order: exchanges, queues, then bindings. Declaring what
// already exists with the same settings is a no-op, so running it twice is fine. An
// object that exists with other settings is an error that names it; RabbitMQ then closes
// ch, so Declare stops there and ch cannot be used again. Objects t does not name are
// left alone, and nothing is ever deleted or unbound. Declare checks ctx between
// declarations (the client cannot interrupt one).
func (t *Topology) Declare(ctx context.Context, ch *amqp.Channel) error {
	if err := t.Validate(); err != nil {
		return err
	}
	for _, e := range t.Exchanges {
		if err := ctx.Err(); err != nil {
			return err
		}
		args := table(e.Arguments)
		if e.AlternateExchange != "" {
			args["alternate-exchange"] = e.AlternateExchange
		}
		kind := e.Type
		if kind == "" {
			kind = amqp.ExchangeTopic
		}
		if err := ch.ExchangeDeclare(e.Name, kind, durable(e.Durable), e.AutoDelete, e.Internal, false, args); err != nil {
			return declareErr(fmt.Sprintf("exchange %q", e.Name), err)
		}
	}
	for _, q := range t.Queues {
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(q.Name, durable(q.Durable), false, false, false, q.args()); err != nil {
			return declareErr(fmt.Sprintf("queue %q", q.Name), err)
		}
	}
	for _, b := range t.Bindings {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := ch.QueueBind(b.Queue, b.RoutingKey, b.Exchange, false, table(b.Arguments)); err != nil {
			return declareErr(fmt.Sprintf("binding of queue %q to exchange %q with key %q", b.Queue, b.Exchange, b.RoutingKey), err)
		}
	}
	return nil
}

// args returns q's x-arguments.
func (q Queue) args() amqp.Table {
	args := table(q.Arguments)
	set := func(k string, v any, ok bool) {
		if ok {
			args[k] = v
		}
	}
	// Classic is the default type: leaving it out keeps a queue declared elsewhere
	// without x-queue-type equivalent.
	set("x-queue-type", q.Type, q.Type != "" && q.Type != "classic")
	set("x-queue-mode", "lazy", q.Lazy)
	set("x-message-ttl", time.Duration(q.MessageTTL).Milliseconds(), q.MessageTTL > 0)
	set("x-max-length", q.MaxLength, q.MaxLength > 0)
	set("x-max-length-bytes", q.MaxLengthBytes, q.MaxLengthBytes > 0)
	set("x-overflow", q.Overflow, q.Overflow != "")
	set("x-max-priority", int64(q.MaxPriority), q.MaxPriority > 0)
	set("x-dead-letter-exchange", q.DeadLetterExchange, q.DeadLetterExchange != "")
	set("x-dead-letter-routing-key", q.DeadLetterRoutingKey, q.DeadLetterRoutingKey != "")
	return args
}

// declareErr explains a failed declaration of what.
func declareErr(what string, err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case amqp.PreconditionFailed:
			if !strings.Contains(ae.Reason, "inequivalent") {
				return fmt.Errorf("outboxamqp: declare %s: RabbitMQ refuses its settings: %w", what, err)
			}
			return fmt.Errorf("outboxamqp: declare %s: it exists with other settings, which RabbitMQ cannot change in place "+
				"(delete and declare it again, losing its messages, or change it with a policy): %w", what, err)
		case amqp.NotFound:
			return fmt.Errorf("outboxamqp: declare %s: %w (declare the exchange and the queue first)", what, err)
		case amqp.AccessRefused:
			return fmt.Errorf("outboxamqp: declare %s: %w (the user lacks the configure permission, or the name is reserved: amq.*)", what, err)
		}
	}
	return fmt.Errorf("outboxamqp: declare %s: %w", what, err)
}

// table converts arguments read from YAML or JSON to the types AMQP tables carry: whole
// numbers become 64-bit integers (the client would cut a Go int to 32 bits, and JSON
// numbers arrive as float64, which RabbitMQ refuses where it wants an integer).
func table(m map[string]any) amqp.Table {
	t := make(amqp.Table, len(m))
	for k, v := range m {
		t[k] = fieldValue(v)
	}
	return t
}

func fieldValue(v any) any {
	switch v := v.(type) {
	case int:
		return int64(v)
	case uint64:
		if v <= math.MaxInt64 {
			return int64(v)
		}
	case float64:
		if v == math.Trunc(v) && math.Abs(v) < 1<<53 {
			return int64(v)
		}
	case map[string]any:
		return table(v)
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = fieldValue(x)
		}
		return out
	}
	return v
}
