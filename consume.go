package outbox

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Delivery is a message as a consumer runner (outboxnats.Consume, ...) hands it to a
// Handler: the payload and the outbox metadata read back from the broker's headers.
type Delivery struct {
	// ID identifies the message for deduplication: the Outbox-Id header, or, for a
	// message that has none (not written through an outbox), what DeliveryID falls back
	// to.
	ID            string
	Topic         string // the Outbox-Topic header
	Key           string // the ordering key: Kafka's record key, elsewhere the Outbox-Key header
	AggregateType string
	EventType     string
	ContentType   string
	Headers       map[string]string // every header as received, the Outbox-* ones included
	Payload       []byte
	// Attempt counts deliveries of this message, starting at 1, as far as the broker
	// tells (JetStream's delivery count, RabbitMQ's x-death count plus one, ...).
	Attempt int
	// Destination is where the broker delivered it from (subject, queue, topic).
	Destination string
}

// Handler processes one delivery. It returns nil when the message is done (the runner
// acks it), an error made with Retry to have it delivered again after a delay, an error
// made with Permanent to dead-letter it at once, and any other error to retry with the
// runner's default delay. After the runner's attempt limit, every error dead-letters.
type Handler func(ctx context.Context, d *Delivery) error

// RetryError asks for a redelivery after Delay.
type RetryError struct {
	Err   error
	Delay time.Duration
}

func (e *RetryError) Error() string { return fmt.Sprintf("retry in %s: %v", e.Delay, e.Err) }
func (e *RetryError) Unwrap() error { return e.Err }

// Retry wraps err so that the runner redelivers the message after delay (bounded by its
// attempt limit).
func Retry(err error, delay time.Duration) error { return &RetryError{Err: err, Delay: delay} }

// PermanentError marks a handler error, or a publisher's rejection, that retrying cannot
// fix: the message is dead-lettered at once.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err so that the runner dead-letters the message without retrying.
func Permanent(err error) error { return &PermanentError{Err: err} }

// IsPermanent reports whether err is, or wraps, a PermanentError.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// RetryDelay returns the delay err asks for with Retry, or def.
func RetryDelay(err error, def time.Duration) time.Duration {
	var r *RetryError
	if errors.As(err, &r) && r.Delay > 0 {
		return r.Delay
	}
	return def
}

// DeliveryID returns the id a consumer deduplicates a message on: the Outbox-Id header;
// else the Outbox-Dedup-Key header; else the broker's own message id (brokerID: the
// Nats-Msg-Id header, the AMQP message-id, ...); else, for a message with none of these,
// "sha256:" and the hex SHA-256 of the destination and payload, so that a redelivery of
// the same bytes maps to the same id while a malformed message never stops the consumer.
// The last rule treats two distinct messages with equal payloads on one destination as
// one: publish through the outbox, which always sets Outbox-Id, to avoid it.
func DeliveryID(headers map[string]string, brokerID, destination string, payload []byte) string {
	for _, id := range []string{headers[HeaderID], headers[HeaderDedupKey], brokerID} {
		if id != "" {
			return id
		}
	}
	h := sha256.New()
	h.Write([]byte(destination))
	h.Write([]byte{0})
	h.Write(payload)
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// NewDelivery fills a Delivery from what a broker gave: headers, the broker's own message
// id, destination and payload. Runners call it; a missing header leaves its field empty.
//
// A CloudEvent (WithCloudEvents) is read in both content modes: in structured mode (a
// payload of content type application/cloudevents+json) the Delivery's Payload and
// ContentType are the event's data and datacontenttype; in binary mode the attributes
// are headers (ce-id, ce_id, cloudEvents:id, ...). Either way, for an event that does
// not come from an outbox (no Outbox-* headers), the event's id is the Delivery's ID
// (before the broker's own message id), its type the EventType and its subject the Key.
func NewDelivery(headers map[string]string, brokerID, destination string, payload []byte, attempt int) *Delivery {
	if headers == nil {
		headers = map[string]string{}
	}
	contentType := headers[HeaderContentType]
	attrs := binaryCloudEvent(headers)
	if data, ce, ok := structuredCloudEvent(contentType, payload); ok {
		payload, contentType, attrs = data, ce["datacontenttype"], ce
	}
	d := &Delivery{
		Topic:         headers[HeaderTopic],
		Key:           headers[HeaderKey],
		AggregateType: headers[HeaderAggregateType],
		EventType:     headers[HeaderEventType],
		ContentType:   contentType,
		Headers:       headers,
		Payload:       payload,
		Attempt:       max(attempt, 1),
		Destination:   destination,
	}
	if attrs != nil && headers[HeaderID] == "" && headers[HeaderDedupKey] == "" && attrs["id"] != "" {
		brokerID = attrs["id"]
	}
	d.ID = DeliveryID(headers, brokerID, destination, payload)
	if d.EventType == "" {
		d.EventType = attrs["type"]
	}
	if d.Key == "" {
		d.Key = attrs["subject"]
	}
	return d
}

// TxFunc runs fn in a new transaction of the consumer's database and commits it when fn
// returns nil, rolling it back otherwise: pgx.BeginFunc bound to a pool, or SQLTx for a
// *sql.DB.
type TxFunc[TTx any] func(ctx context.Context, fn func(tx TTx) error) error

// SQLTx returns the TxFunc of a *sql.DB: it begins a transaction with opts (nil for the
// driver's defaults), runs fn, and commits when fn returns nil, rolling back otherwise.
func SQLTx(db *sql.DB, opts *sql.TxOptions) TxFunc[*sql.Tx] {
	return func(ctx context.Context, fn func(*sql.Tx) error) error {
		tx, err := db.BeginTx(ctx, opts)
		if err != nil {
			return err
		}
		if err := fn(tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
}

// InboxHandler turns work that runs in a transaction into a Handler with exactly-once
// effects: for each delivery it begins a transaction with inTx, claims the delivery's id
// in the inbox first, runs work only if the id is new, and commits. A duplicate delivery
// commits nothing and is acked. An error from work rolls everything back, the claim
// included, and goes back to the runner (to retry or dead-letter).
func InboxHandler[TTx any](inbox *Inbox[TTx], inTx TxFunc[TTx], work func(ctx context.Context, tx TTx, d *Delivery) error) Handler {
	return func(ctx context.Context, d *Delivery) error {
		return inTx(ctx, func(tx TTx) error {
			fresh, err := inbox.Claim(ctx, tx, d.ID)
			if err != nil || !fresh {
				return err
			}
			return work(ctx, tx, d)
		})
	}
}

// Version returns the HeaderAggregateVersion header as a number, and whether it is there
// and valid.
func (d *Delivery) Version() (int64, bool) {
	v, err := strconv.ParseInt(d.Headers[HeaderAggregateVersion], 10, 64)
	return v, err == nil
}

// HeaderTraceparent is the W3C trace context header. Writers copy it from the caller's
// context into the message (see the tracing plugin); consumer runners put it back into
// the handler's context.
const HeaderTraceparent = "traceparent"

type traceparentKey struct{}

// ContextWithTraceparent returns ctx carrying a W3C traceparent value, as consumer
// runners give it to handlers. An empty value returns ctx unchanged.
func ContextWithTraceparent(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return context.WithValue(ctx, traceparentKey{}, traceparent)
}

// TraceparentFromContext returns the W3C traceparent ctx carries, if any. Tracing
// libraries turn it into a remote parent span context.
func TraceparentFromContext(ctx context.Context) string {
	s, _ := ctx.Value(traceparentKey{}).(string)
	return s
}

// HandlerContext is the context a runner gives a handler for d: base with d's trace
// context.
func HandlerContext(base context.Context, d *Delivery) context.Context {
	return ContextWithTraceparent(base, headerFold(d.Headers, HeaderTraceparent))
}

// headerFold looks name up exactly, then case-insensitively (HTTP and some brokers
// canonicalise header names).
func headerFold(h map[string]string, name string) string {
	if v, ok := h[name]; ok {
		return v
	}
	for k, v := range h {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}
