package bench

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/brokers"
	"github.com/outboxkit/outbox/outboxamqp"
)

func init() { RegisterTarget(brokers.RabbitMQ, openAMQP) }

// amqpTarget publishes to durable classic queues of its own (queue version 2, RabbitMQ's
// recommended format for persistent messages since 3.10) through the default exchange,
// persistent messages with publisher confirms, as the relay does by default.
type amqpTarget struct {
	url  string
	conn *amqp.Connection
}

func openAMQP(ctx context.Context, url string) (Target, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, fmt.Errorf("connect to RabbitMQ at %s: %w", outboxamqp.RedactURL(url), err)
	}
	return &amqpTarget{url: url, conn: conn}, nil
}

func (t *amqpTarget) Prepare(ctx context.Context, name string) (string, func(), error) {
	ch, err := t.conn.Channel()
	if err != nil {
		return "", nil, err
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-version": 2}); err != nil {
		return "", nil, fmt.Errorf("declare queue %s: %w", name, err)
	}
	drop := func() {
		if ch, err := t.conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(name, false, false, false)
			_ = ch.Close()
		}
	}
	return name, drop, nil
}

// Empty purges the queue: a classic queue holding 100,000 messages confirms new ones
// with a p99 several times that of an empty one (docs/benchmarks.md).
func (t *amqpTarget) Empty(ctx context.Context, route string) error {
	ch, err := t.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if _, err := ch.QueuePurge(route, false); err != nil {
		return fmt.Errorf("purge queue %s: %w", route, err)
	}
	return nil
}

func (t *amqpTarget) Broker() (string, brokers.Settings) { return t.url, brokers.Settings{} }

// amqpRawWindow is how many messages Raw keeps published and unconfirmed on its channel.
const amqpRawWindow = 4096

// Raw publishes on one channel in confirm mode, mandatory and persistent like the
// publisher, keeping up to amqpRawWindow messages unconfirmed while a second goroutine
// takes the confirms (the client's ordered NotifyPublish stream, so one counter tracks
// them all). The wire messages are built by the publisher's own code
// (outboxamqp.Publisher.Publishing).
func (t *amqpTarget) Raw(ctx context.Context, route string, msgs []*outbox.Message) error {
	builder, err := outboxamqp.New(t.conn, outboxamqp.Config{Route: route})
	if err != nil {
		return err
	}
	defer builder.Close()
	ch, err := t.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, amqpRawWindow))
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	window := make(chan struct{}, amqpRawWindow)
	errc := make(chan error, 1)
	go func() {
		for range msgs {
			select {
			case c, ok := <-confirms:
				if !ok {
					errc <- errors.New("channel closed before every confirm came")
					return
				}
				if !c.Ack {
					errc <- fmt.Errorf("message %d nacked", c.DeliveryTag)
					return
				}
				<-window
			case r := <-returns:
				errc <- fmt.Errorf("message %s returned: %s", r.MessageId, r.ReplyText)
				return
			case <-ctx.Done():
				errc <- ctx.Err()
				return
			}
		}
		errc <- nil
	}()
	for _, m := range msgs {
		key, pub, err := builder.Publishing(m)
		if err != nil {
			return err
		}
		select {
		case window <- struct{}{}:
		case err := <-errc:
			return err
		}
		if err := ch.Publish("", key, true, false, pub); err != nil {
			return err
		}
	}
	return <-errc
}

func (t *amqpTarget) Close() { _ = t.conn.Close() }
