package outboxamqp

import (
	"errors"
	"fmt"

	"github.com/outboxkit/outbox"
)

// ErrTooLarge is matched (errors.Is) by the rejection of a message whose body is over
// Config.MaxMessageSize, or whose properties and headers do not fit one AMQP frame.
// Publish refuses such a message before sending it: RabbitMQ would answer it by closing
// the channel or the connection, taking every other message in flight with it.
var ErrTooLarge = errors.New("outboxamqp: message too large")

// ErrBadProperty is matched (errors.Is) by the rejection of a message that AMQP cannot
// carry: a routing key, message id, content type, event type or header name over 255
// bytes (an AMQP short string), or an Outbox-Priority header that is not a number from 0
// to 255. Publish refuses such a message before sending it.
var ErrBadProperty = errors.New("outboxamqp: message property not representable in AMQP")

// ReturnError reports a message that RabbitMQ returned (basic.return) because no queue is
// bound to its exchange with a matching routing key, and the exchange has no alternate
// exchange. Publish returns it as a rejection; errors.Is(err, outbox.ErrUnroutable) is
// true. RabbitMQ confirms a returned message too, so the confirm alone never counts as
// published: a ReturnError always wins over the ack.
type ReturnError struct {
	Exchange   string // "" is the default exchange
	RoutingKey string
	Code       uint16 // 312 NO_ROUTE
	Text       string // "NO_ROUTE"
}

func (e *ReturnError) Error() string {
	return fmt.Sprintf("outboxamqp: %s returned the message with routing key %q as unroutable (%d %s): "+
		"bind a queue that matches the routing key, or give the exchange an alternate exchange",
		exchangeName(e.Exchange), e.RoutingKey, e.Code, e.Text)
}

// Is makes errors.Is(err, outbox.ErrUnroutable) true.
func (e *ReturnError) Is(target error) bool { return target == outbox.ErrUnroutable }

// NackError reports a message RabbitMQ did not take: it answered the publish with
// basic.nack. RabbitMQ nacks when a queue the message routes to is full and has
// x-overflow reject-publish (or reject-publish-dlx), or on an internal error of a queue
// (a quorum queue without a leader, ...). Publish returns it as an outage: the broker
// cannot take messages now, and will again once the queue drains or recovers.
type NackError struct {
	Exchange   string
	RoutingKey string
}

func (e *NackError) Error() string {
	return fmt.Sprintf("outboxamqp: %s refused the message with routing key %q (basic.nack): "+
		"a queue it routes to is full with x-overflow reject-publish, or unavailable",
		exchangeName(e.Exchange), e.RoutingKey)
}

func exchangeName(name string) string {
	if name == "" {
		return "the default exchange"
	}
	return fmt.Sprintf("exchange %q", name)
}

// sendErr wraps an error of sending a message, or of the channel it was sent on, as an
// outage: a closed channel or connection, a channel or connection exception, a write
// error all leave the message's fate unknown. (The messages this package builds hold
// only strings in their header tables, so the client never refuses one on its merits.)
func sendErr(err error, exchange, key string) error {
	return outbox.Outage(fmt.Errorf("outboxamqp: publish to %s with routing key %q: %w", exchangeName(exchange), key, err))
}
