package outboxamqp

import (
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/broken"
)

// confirmChannel is an AMQP channel in confirm mode, used by one Publish call at a time.
// Its goroutine (run) follows the broker's answers, basic.return and basic.ack/nack, and
// resolves each message in flight.
//
// The correlation that keeps an unroutable message from ever counting as published:
// RabbitMQ sends basic.return for an unroutable mandatory message before the basic.ack
// for it, on the same channel. The client's reader goroutine hands the return to the
// returns listener before it hands the ack to the confirms listener, and run, the only
// receiver of both, takes every return already handed over before it acts on an ack. So
// when run sees the ack of a message, that message's return, if any, has been recorded.
// Returns carry the message's properties, not its delivery tag: the message_id (the dedup
// key) finds the message in flight.
type confirmChannel struct {
	ch   *amqp.Channel
	conn *amqp.Connection

	mu      sync.Mutex
	batch   *batchWait           // the Publish call waiting for answers; nil when none
	pending map[uint64]*inflight // by delivery tag
	byID    map[string][]*inflight
	err     error // why the channel closed; nil while it is open

	done chan struct{} // closed when run has returned
}

// inflight is a message sent and awaiting its confirm.
type inflight struct {
	i        int // index in the batch
	tag      uint64
	id       string // message_id
	exchange string
	key      string
	returned *amqp.Return
}

// batchWait collects the outcomes of one Publish call's messages. It is guarded by the
// channel's mu.
type batchWait struct {
	errs   []error
	left   int  // messages sent whose outcome is unknown
	sealed bool // every message has been sent: done may close
	done   chan struct{}
}

// Buffer sizes of the listeners. run drains both all the time; the buffers only smooth
// bursts. The client gives up on a listener that stays full for 5 s (dropping the
// event): a dropped confirm leaves its message unresolved, an outage once ctx ends; a
// dropped return could let an unroutable message count as published, which is why run
// never blocks while holding anything but mu.
const (
	confirmBuffer = 1024
	returnBuffer  = 256
)

// errChannelClosed stands in for a channel the client closed without an error (Close).
var errChannelClosed = errors.New("channel closed")

// openConfirmChannel opens a channel on conn, puts it in confirm mode and starts its
// goroutine.
func openConfirmChannel(conn *amqp.Connection) (*confirmChannel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("outboxamqp: open a channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("outboxamqp: put the channel in confirm mode: %w", err)
	}
	c := &confirmChannel{
		ch:      ch,
		conn:    conn,
		pending: map[uint64]*inflight{},
		byID:    map[string][]*inflight{},
		done:    make(chan struct{}),
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, confirmBuffer))
	returns := ch.NotifyReturn(make(chan amqp.Return, returnBuffer))
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	go c.run(confirms, returns, closes)
	return c, nil
}

// run follows the broker's answers until the channel closes.
func (c *confirmChannel) run(confirms <-chan amqp.Confirmation, returns <-chan amqp.Return, closes <-chan *amqp.Error) {
	defer close(c.done)
	// takeReturns records every return handed over so far.
	takeReturns := func() {
		for {
			select {
			case r, ok := <-returns:
				if !ok {
					returns = nil
					return
				}
				c.returned(r)
			default:
				return
			}
		}
	}
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			c.returned(r)
		case conf, ok := <-confirms:
			if !ok {
				// amqp091 sends the close reason to closes (buffered) before it closes
				// confirms: report the broker's reason, not just that it closed, when
				// this select saw the confirms end first.
				var err error = errChannelClosed
				select {
				case e, ok := <-closes:
					if ok && e != nil {
						err = e
					}
				default:
				}
				c.shut(err)
				return
			}
			takeReturns()
			c.confirmed(conf)
		case e, ok := <-closes:
			// Answers that came before the close still count.
			for drained := false; !drained; {
				takeReturns()
				select {
				case conf, ok := <-confirms:
					if ok {
						c.confirmed(conf)
					} else {
						drained = true
					}
				default:
					drained = true
				}
			}
			var err error = errChannelClosed
			if ok && e != nil {
				err = e
			}
			c.shut(err)
			return
		}
	}
}

// returned marks the messages in flight with r's message_id as returned. Two messages in
// flight may share a message_id (the same dedup key sent twice); then both are marked: a
// message that did reach a queue may then be reported unroutable and published again,
// but an unroutable one is never reported published.
func (c *confirmChannel) returned(r amqp.Return) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, fl := range c.byID[r.MessageId] {
		fl.returned = &r
	}
}

// confirmed resolves the message with conf's delivery tag.
func (c *confirmChannel) confirmed(conf amqp.Confirmation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fl := c.pending[conf.DeliveryTag]
	if fl == nil {
		return
	}
	if broken.Has(broken.IgnoreReturns) {
		fl.returned = nil // the canary's bug: an unroutable message counts as published
	}
	var err error
	switch {
	case fl.returned != nil:
		err = &ReturnError{Exchange: fl.exchange, RoutingKey: fl.key, Code: fl.returned.ReplyCode, Text: fl.returned.ReplyText}
	case !conf.Ack:
		err = outbox.Outage(&NackError{Exchange: fl.exchange, RoutingKey: fl.key})
	}
	c.resolve(fl, err)
}

// shut records that the channel closed and fails every message still in flight as an
// outage: the broker may or may not have taken it.
func (c *confirmChannel) shut(cause error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.err = cause
	for _, fl := range c.pending {
		c.resolve(fl, outbox.Outage(fmt.Errorf("outboxamqp: channel closed before the confirm of the message to %s with routing key %q: %w",
			exchangeName(fl.exchange), fl.key, cause)))
	}
}

// resolve ends fl with err (nil: published). c.mu must be held.
func (c *confirmChannel) resolve(fl *inflight, err error) {
	delete(c.pending, fl.tag)
	if same := c.byID[fl.id]; len(same) <= 1 {
		delete(c.byID, fl.id)
	} else {
		for j, other := range same {
			if other == fl {
				c.byID[fl.id] = append(same[:j:j], same[j+1:]...)
				break
			}
		}
	}
	b := c.batch
	if b == nil {
		return
	}
	b.errs[fl.i] = err
	b.left--
	if b.sealed && b.left == 0 {
		close(b.done)
	}
}

// begin attaches a Publish call's batch of n messages.
func (c *confirmChannel) begin(errs []error) *batchWait {
	b := &batchWait{errs: errs, done: make(chan struct{})}
	c.mu.Lock()
	c.batch = b
	c.mu.Unlock()
	return b
}

// send publishes one message as the i-th of the batch. An error means it was not sent
// (or its fate is unknown) and is already recorded as the message's outcome.
func (c *confirmChannel) send(i int, exchange, key string, pub *amqp.Publishing) {
	c.mu.Lock()
	if c.err != nil {
		c.batch.errs[i] = sendErr(c.err, exchange, key)
		c.mu.Unlock()
		return
	}
	// Only this goroutine publishes on the channel, so the next tag is this message's.
	// It is registered first: the ack may come before Publish returns.
	fl := &inflight{i: i, tag: c.ch.GetNextPublishSeqNo(), id: pub.MessageId, exchange: exchange, key: key}
	c.pending[fl.tag] = fl
	c.byID[fl.id] = append(c.byID[fl.id], fl)
	c.batch.left++
	c.mu.Unlock()

	if err := c.ch.Publish(exchange, key, true, false, *pub); err != nil {
		c.mu.Lock()
		if c.pending[fl.tag] == fl { // not already failed by shut
			c.resolve(fl, sendErr(err, exchange, key))
		}
		c.mu.Unlock()
	}
}

// seal says every message of the batch has been sent.
func (c *confirmChannel) seal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.batch.sealed = true
	if c.batch.left == 0 {
		close(c.batch.done)
	}
}

// finish detaches the batch. Messages without an outcome yet fail with cause, an
// outage. It reports whether the channel can serve another Publish call: open, with
// nothing in flight.
func (c *confirmChannel) finish(cause error) (reusable bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.batch
	c.batch = nil
	for _, fl := range c.pending {
		b.errs[fl.i] = cause
	}
	return c.err == nil && len(c.pending) == 0
}

// usable reports whether the channel is still open.
func (c *confirmChannel) usable() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err == nil && !c.ch.IsClosed()
}

// close closes the channel and waits for run to return. Messages still in flight are
// left to the broker; nobody waits for their confirms any more.
func (c *confirmChannel) close() {
	_ = c.ch.Close()
	<-c.done
}
