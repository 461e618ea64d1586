package outboxamqp

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
)

// DeadLetter is a message in a dead-letter (parking) queue, as ListDead reads it. It was
// put there either by Consume, which adds the HeaderDead* headers (the handler's error
// among them), or by RabbitMQ itself, dead-lettering it through a queue's
// x-dead-letter-exchange (rejected by a consumer, expired, dropped at the queue's length
// bound, or over a quorum queue's delivery limit), which records why in the x-death
// header.
type DeadLetter struct {
	ID        string // the id consumers deduplicate on (outbox.DeliveryID): the Outbox-Id header, ...
	MessageID string // the AMQP message_id (the outbox's dedup key)

	// Queue is the queue the message was dead-lettered from ("" when neither the
	// HeaderDead* headers nor x-death say).
	Queue string
	// Reason is why: the handler's last error for Consume's dead letters, the broker's
	// reason (rejected, expired, maxlen, delivery_limit) for the others.
	Reason string
	// Attempts is the attempt that failed last for Consume's dead letters, and how many
	// times the broker dead-lettered the message from Queue for the others.
	Attempts int
	// DeadAt is when it was dead-lettered (for the broker's, the first time it was
	// dead-lettered from Queue for Reason, to the second).
	DeadAt time.Time

	// Exchange and RoutingKeys are where the message was first published: where
	// ReplayDead sends it back. Known reports whether the message says so.
	Exchange    string
	RoutingKeys []string
	Known       bool

	Deaths      []Death           // the x-death header, newest first
	Headers     map[string]string // the headers, as HeaderStrings makes them
	ContentType string
	EventType   string // the AMQP type property
	Timestamp   time.Time
	Payload     []byte
}

// newDeadLetter reads d, taken from the dead-letter queue queue.
func newDeadLetter(d amqp.Delivery, queue string) DeadLetter {
	h := HeaderStrings(d.Headers)
	dl := DeadLetter{
		ID:          outbox.DeliveryID(h, d.MessageId, queue, d.Body),
		MessageID:   d.MessageId,
		Deaths:      Deaths(d.Headers),
		Headers:     h,
		ContentType: d.ContentType,
		EventType:   d.Type,
		Timestamp:   d.Timestamp,
		Payload:     d.Body,
	}
	if from, ok := h[HeaderDeadQueue]; ok {
		// Dead-lettered by Consume.
		dl.Queue, dl.Reason = from, h[HeaderDeadReason]
		dl.Attempts, _ = strconv.Atoi(h[HeaderDeadAttempts])
		dl.DeadAt, _ = time.Parse(time.RFC3339Nano, h[HeaderDeadAt])
		if key, ok := h[HeaderDeadRoutingKey]; ok {
			dl.Exchange, dl.RoutingKeys, dl.Known = h[HeaderDeadExchange], []string{key}, true
		}
		return dl
	}
	if len(dl.Deaths) == 0 {
		return dl
	}
	// Dead-lettered by the broker. The newest entry says why it is here; the first
	// death says where it was published (an entry keeps the exchange and routing keys of
	// its first occurrence).
	last := dl.Deaths[0]
	dl.Queue, dl.Reason, dl.Attempts, dl.DeadAt = last.Queue, last.Reason, int(min(last.Count, 1<<31-1)), last.Time
	first := dl.Deaths[len(dl.Deaths)-1]
	fq, _ := d.Headers["x-first-death-queue"].(string)
	fr, _ := d.Headers["x-first-death-reason"].(string)
	for _, e := range dl.Deaths {
		if e.Queue == fq && e.Reason == fr {
			first = e
			break
		}
	}
	if len(first.RoutingKeys) > 0 {
		dl.Exchange, dl.RoutingKeys, dl.Known = first.Exchange, first.RoutingKeys, true
	}
	return dl
}

// destination is where ReplayDead publishes dl: its original exchange and first routing
// key (the others as the CC header), or with toQueue the queue it was dead-lettered from,
// through the default exchange.
func (dl *DeadLetter) destination(toQueue bool) (exchange, key string, cc []string, err error) {
	if toQueue {
		if dl.Queue == "" {
			return "", "", nil, fmt.Errorf("dead letter %s does not say which queue it was dead-lettered from (no x-death or %s header)", dl.ID, HeaderDeadQueue)
		}
		return "", dl.Queue, nil, nil
	}
	if !dl.Known {
		return "", "", nil, fmt.Errorf("dead letter %s does not say where it was published (no x-death or %s header)", dl.ID, HeaderDeadRoutingKey)
	}
	return dl.Exchange, dl.RoutingKeys[0], dl.RoutingKeys[1:], nil
}

// ListDead returns up to limit messages of the dead-letter queue, oldest first (0 means
// as many as the queue holds when ListDead starts), without removing any: it takes them
// with basic.get without acknowledging, then closes its channel, which returns all of
// them to the queue, each to its place. Reading a queue has side effects AMQP cannot
// avoid: the messages are marked redelivered, are invisible to other consumers of the
// queue while ListDead runs, and a quorum queue counts a delivery for each (a quorum
// parking queue should have no delivery limit: x-delivery-limit -1 on RabbitMQ 4).
func ListDead(ctx context.Context, conn *amqp.Connection, queue string, limit int) ([]DeadLetter, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("outboxamqp: list dead letters of %s: open a channel: %w", queue, err)
	}
	defer ch.Close() // returns every message taken
	var out []DeadLetter
	err = take(ctx, ch, queue, limit, func(batch []amqp.Delivery) error {
		for _, d := range batch {
			out = append(out, newDeadLetter(d, queue))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("outboxamqp: list dead letters of %s: %w", queue, err)
	}
	return out, nil
}

// replayBatch is how many dead letters ReplayDead moves per round of publisher confirms.
const replayBatch = 100

// ReplayOptions configures ReplayDead.
type ReplayOptions struct {
	// Limit is the most messages to replay, oldest first. Defaults to (0 means) as many as
	// the queue holds when ReplayDead starts, so that messages that die again while it
	// runs are not replayed over and over.
	Limit int
	// DryRun takes the messages and returns them to the queue, changing nothing: the
	// result lists what would be replayed.
	DryRun bool
	// ToQueue sends each message to the queue it was dead-lettered from, through the
	// default exchange, instead of to the exchange and routing key it was first
	// published with. Other queues bound to that routing key, whose consumers handled the
	// message already, then do not get it again.
	ToQueue bool
}

// ReplayDead moves messages of the dead-letter queue back to the exchange and routing key
// they were first published with (see DeadLetter.Exchange; ReplayOptions.ToQueue sends
// them to the queue they died in instead), oldest first, in batches of 100: it publishes
// a batch (persistent, mandatory, with publisher confirms) and acks each parked copy
// only once its new copy is confirmed and not returned. A message is never lost; a
// crash between the two leaves it both replayed and parked, replayed twice at worst.
//
// The new copy keeps the body, the properties (less user id and expiration) and the
// headers, less the x-death and x-first-death-*/x-last-death-* headers and Consume's
// HeaderDead* headers: Consume counts its attempts afresh. Its message_id and Outbox-Id
// are the original ones, so consumers with an inbox skip it if they handled it before.
//
// It returns the messages replayed (with DryRun, those that would be). Messages it could
// not replay (no known origin, unroutable, refused by the broker) stay in the queue; the
// error then names each.
func ReplayDead(ctx context.Context, conn *amqp.Connection, queue string, opts ReplayOptions) ([]DeadLetter, error) {
	fail := func(err error) error { return fmt.Errorf("outboxamqp: replay dead letters of %s: %w", queue, err) }
	if opts.Limit < 0 {
		return nil, fail(errors.New("negative limit"))
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fail(fmt.Errorf("open a channel: %w", err))
	}
	defer ch.Close() // returns every message taken and not acked
	var cc *confirmChannel
	if !opts.DryRun {
		if cc, err = openConfirmChannel(conn); err != nil {
			return nil, fail(err)
		}
		defer cc.close()
	}

	var replayed []DeadLetter
	var skipped []error
	err = take(ctx, ch, queue, opts.Limit, func(batch []amqp.Delivery) error {
		var pubs []*amqp.Publishing
		var dests [][2]string
		var letters []DeadLetter
		var tags []uint64
		for _, d := range batch {
			dl := newDeadLetter(d, queue)
			exchange, key, extra, err := dl.destination(opts.ToQueue)
			if err != nil {
				skipped = append(skipped, err)
				continue
			}
			if opts.DryRun {
				replayed = append(replayed, dl)
				continue
			}
			pub := replayCopy(d, extra)
			pubs, dests, letters, tags = append(pubs, &pub), append(dests, [2]string{exchange, key}), append(letters, dl), append(tags, d.DeliveryTag)
		}
		if len(pubs) == 0 {
			return nil
		}
		errs := publishConfirmedTo(cc, func(i int) (string, string) { return dests[i][0], dests[i][1] }, pubs, 30*time.Second)
		for i, perr := range errs {
			dl := letters[i]
			if perr != nil {
				skipped = append(skipped, fmt.Errorf("dead letter %s to %s with routing key %q: %w", dl.ID, exchangeName(dests[i][0]), dests[i][1], perr))
				continue
			}
			replayed = append(replayed, dl)
			if err := ch.Ack(tags[i], false); err != nil {
				return fmt.Errorf("dead letter %s replayed but not removed from the queue (it goes back to it: replaying it again publishes a second copy): %w", dl.ID, err)
			}
		}
		if !cc.usable() {
			return errors.New("the publishing channel closed (see the errors of the messages above)")
		}
		return nil
	})
	if err != nil {
		return replayed, fail(errors.Join(append([]error{err}, skipped...)...))
	}
	if len(skipped) > 0 {
		return replayed, fail(fmt.Errorf("%d left in the queue: %w", len(skipped), errors.Join(skipped...)))
	}
	return replayed, nil
}

// take gets messages of queue on ch without acknowledging them, in batches of up to
// replayBatch, and passes each batch to fn, until limit messages (0: as many as the
// queue held at the first get) or the queue is empty. The messages stay unacked on ch
// unless fn acks them.
func take(ctx context.Context, ch *amqp.Channel, queue string, limit int, fn func([]amqp.Delivery) error) error {
	taken := 0
	for limit <= 0 || taken < limit {
		var batch []amqp.Delivery
		for len(batch) < replayBatch && (limit <= 0 || taken < limit) {
			if err := ctx.Err(); err != nil {
				return err
			}
			d, ok, err := ch.Get(queue, false)
			if err != nil {
				return err
			}
			if !ok {
				break
			}
			if limit <= 0 {
				limit = int(d.MessageCount) + 1 // this one and those behind it
			}
			batch = append(batch, d)
			taken++
		}
		if len(batch) == 0 {
			return nil
		}
		if err := fn(batch); err != nil {
			return err
		}
		if len(batch) < replayBatch && taken < limit {
			return nil // the queue is empty
		}
	}
	return nil
}

// replayCopy is the message ReplayDead publishes for the parked d.
func replayCopy(d amqp.Delivery, cc []string) amqp.Publishing {
	h := make(amqp.Table, len(d.Headers))
	for k, v := range d.Headers {
		switch {
		case k == "x-death", k == "CC", k == "BCC",
			strings.HasPrefix(k, "x-first-death-"), strings.HasPrefix(k, "x-last-death-"),
			strings.HasPrefix(k, "Outbox-Dead-"):
			continue
		}
		h[k] = v
	}
	if len(cc) > 0 {
		keys := make([]any, len(cc))
		for i, k := range cc {
			keys[i] = k
		}
		h["CC"] = keys
	}
	return resend(d, h)
}
