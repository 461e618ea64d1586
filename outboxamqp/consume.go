package outboxamqp

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/outboxkit/outbox/internal/lanes"
	"github.com/outboxkit/outbox/internal/reconnect"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
)

// ConsumerConfig configures Consume and DialConsume. Queue.Name is required.
//
// Consume works with three queues (see the package documentation, "Consuming"): the work
// queue, a retry queue that holds a rejected message for RetryDelay and then dead-letters
// it back to the work queue, and a dead-letter (parking) queue for what is given up on.
// Topology returns their declarations.
type ConsumerConfig struct {
	// Queue is the work queue: its name and the settings it is declared with (type,
	// TTL, bounds, ...), the same as in the topology that declares it. Consume declares
	// it with these settings plus x-dead-letter-exchange "" and x-dead-letter-routing-key
	// RetryQueue, so that a rejected message goes to the retry queue. Leave its
	// DeadLetterExchange, DeadLetterRoutingKey and x-dead-letter-* arguments unset.
	// Declaring is how Consume checks that rejects cannot drop messages: a queue that
	// exists with other settings (without that dead-letter exchange) makes Consume fail
	// before it takes any message.
	Queue Queue
	// RetryQueue is the retry queue's name. Defaults to Queue.Name + ".retry". Consume
	// declares it with x-message-ttl RetryDelay, dead-lettering back to the work queue
	// through the default exchange, and with the work queue's type.
	RetryQueue string
	// DeadLetterQueue is the parking queue that receives a copy of every message Consume
	// gives up on. Defaults to Queue.Name + ".dead". Consume declares it (durable, the work
	// queue's type) if it does not exist, and otherwise leaves it as it is, so it may be a
	// queue shared by several work queues and declared elsewhere.
	DeadLetterQueue string
	// NoDeclare makes Consume declare nothing: it only checks that the three queues exist
	// and trusts that the work queue dead-letters to RetryQueue. Set it when the
	// consumer's user lacks the configure permission, or a policy sets the dead-letter
	// exchange; a work queue that dead-letters nowhere then DROPS every message Consume
	// retries. Defaults to false.
	NoDeclare bool

	// RetryDelay is how long a rejected message waits in the retry queue before it is
	// delivered again: the retry queue's x-message-ttl, the same for every retry (RabbitMQ
	// cannot delay one rejected message differently from another, so the delay asked for
	// with outbox.Retry is not honoured). At least 1ms. Changing it for an existing retry
	// queue makes Consume fail (RabbitMQ cannot change a queue's TTL argument in place):
	// use a new RetryQueue name, or a policy. Defaults to 5s.
	RetryDelay time.Duration
	// MaxAttempts is how many times the handler sees a message before Consume
	// dead-letters it; 1 means no retries. Defaults to 5.
	MaxAttempts int
	// Prefetch is the QoS prefetch count: how many unacknowledged messages RabbitMQ
	// sends ahead. Too low starves the handlers between round trips; too high lets one
	// consumer hoard messages others could handle and holds them hostage while a slow
	// handler runs (RabbitMQ suggests 16 to 256; smaller for latency-critical queues).
	// At most 65535. Defaults to 32, or twice Concurrency when that is more.
	Prefetch int
	// Concurrency is how many handlers run at once. Messages with the same Outbox-Key
	// header are handled one after another, in delivery order; a message without one is
	// ordered with no other and waits only for a free handler. Defaults to 1.
	Concurrency int
	// ConsumerTag names the consumer in RabbitMQ's management views. Defaults to one the
	// client makes up.
	ConsumerTag string
	// Logger receives one line per retry and dead letter, and per lost connection in
	// DialConsume. Defaults to none.
	Logger *slog.Logger
	// TLS configures the TLS connection DialConsume makes for an amqps:// URL; see
	// Config.TLS. Consume ignores it.
	TLS *tls.Config
}

// Defaults of ConsumerConfig.
const (
	RetryDelayDefault  = 5 * time.Second
	MaxAttemptsDefault = 5
	PrefetchDefault    = 32
)

// Headers Consume adds to the copy of a message it dead-letters to
// ConsumerConfig.DeadLetterQueue. ListDead reads them, and ReplayDead drops them.
const (
	HeaderDeadReason     = "Outbox-Dead-Reason"      // the handler's last error
	HeaderDeadQueue      = "Outbox-Dead-Queue"       // the work queue
	HeaderDeadAttempts   = "Outbox-Dead-Attempts"    // the attempt that failed last
	HeaderDeadAt         = "Outbox-Dead-At"          // RFC 3339 with nanoseconds, UTC
	HeaderDeadExchange   = "Outbox-Dead-Exchange"    // the exchange it was first published to
	HeaderDeadRoutingKey = "Outbox-Dead-Routing-Key" // and with which routing key
)

// deadReasonMax bounds the handler error copied into HeaderDeadReason: the headers of a
// message must fit one frame (128 KiB by default).
const deadReasonMax = 1024

func (c ConsumerConfig) withDefaults() ConsumerConfig {
	c.RetryQueue = cmp.Or(c.RetryQueue, c.Queue.Name+".retry")
	c.DeadLetterQueue = cmp.Or(c.DeadLetterQueue, c.Queue.Name+".dead")
	c.RetryDelay = cmp.Or(c.RetryDelay, RetryDelayDefault)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, MaxAttemptsDefault)
	c.Concurrency = cmp.Or(c.Concurrency, 1)
	c.Prefetch = cmp.Or(c.Prefetch, min(max(PrefetchDefault, 2*c.Concurrency), math.MaxUint16))
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// Validate checks c as the consume functions do, without connecting: a
// *outbox.ConfigError names the field at fault.
func (c ConsumerConfig) Validate() error { return c.validate() }

func (c ConsumerConfig) validate() error {
	q := c.Queue
	switch {
	case q.Name == "":
		return &outbox.ConfigError{Field: "Queue.Name", Reason: "required: name the work queue"}
	case q.DeadLetterExchange != "" || q.DeadLetterRoutingKey != "":
		return &outbox.ConfigError{Field: "Queue.DeadLetterExchange", Reason: "must be empty: Consume points the work queue's dead-letter exchange at RetryQueue (given-up messages go to DeadLetterQueue)"}
	case c.Concurrency < 0 || c.Concurrency > math.MaxUint16:
		return &outbox.ConfigError{Field: "Concurrency", Reason: "must be from 1 to 65535 (the largest prefetch)"}
	case c.MaxAttempts < 0:
		return &outbox.ConfigError{Field: "MaxAttempts", Reason: "must not be negative (1 means no retries)"}
	case c.RetryDelay < 0:
		return &outbox.ConfigError{Field: "RetryDelay", Reason: "must not be negative"}
	case c.RetryDelay > 0 && c.RetryDelay < time.Millisecond:
		return &outbox.ConfigError{Field: "RetryDelay", Reason: "must be at least 1ms (it is the retry queue's x-message-ttl, in milliseconds)"}
	case c.Prefetch < 0 || c.Prefetch > math.MaxUint16:
		return &outbox.ConfigError{Field: "Prefetch", Reason: "must be from 1 to 65535"}
	case c.Prefetch > 0 && c.Prefetch < c.Concurrency:
		return &outbox.ConfigError{Field: "Prefetch", Reason: fmt.Sprintf("%d is less than Concurrency (%d): at most Prefetch handlers could run", c.Prefetch, c.Concurrency)}
	}
	for k := range q.Arguments {
		if k == "x-dead-letter-exchange" || k == "x-dead-letter-routing-key" {
			return &outbox.ConfigError{Field: "Queue.Arguments", Reason: k + " must not be set: Consume points the work queue's dead-letter exchange at RetryQueue"}
		}
	}
	d := c.withDefaults()
	for _, n := range []struct{ field, name string }{{"Queue.Name", d.Queue.Name}, {"RetryQueue", d.RetryQueue}, {"DeadLetterQueue", d.DeadLetterQueue}} {
		if len(n.name) > shortstrMax {
			return &outbox.ConfigError{Field: n.field, Reason: fmt.Sprintf("%q is over AMQP's limit of %d bytes", n.name, shortstrMax)}
		}
	}
	switch {
	case d.RetryQueue == d.Queue.Name || d.DeadLetterQueue == d.Queue.Name:
		return &outbox.ConfigError{Field: "RetryQueue", Reason: "the retry and dead-letter queues must differ from the work queue"}
	case d.RetryQueue == d.DeadLetterQueue:
		return &outbox.ConfigError{Field: "DeadLetterQueue", Reason: "must differ from RetryQueue"}
	}
	return nil
}

// Topology returns the queues Consume works with, declared as Consume declares them:
// the work queue dead-lettering to the retry queue, the retry queue dead-lettering back
// to the work queue after RetryDelay, and the dead-letter queue. Declare it at deploy
// time (or write its YAML into the topology file) when the consumer's user may not
// declare queues, and run Consume with NoDeclare. Bind the work queue to your exchange
// as usual; the other two take no bindings (they are reached through the default
// exchange).
//
// A quorum work queue gets a quorum retry queue with at-least-once dead-lettering
// (x-dead-letter-strategy at-least-once, x-overflow reject-publish), so that a message
// on its way back cannot be lost by a node failure; give the work queue the same two
// arguments for the same guarantee on the way into the retry queue.
func (c ConsumerConfig) Topology() (*Topology, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	c = c.withDefaults()
	work := c.Queue
	work.Arguments = make(map[string]any, len(c.Queue.Arguments)+2)
	for k, v := range c.Queue.Arguments {
		work.Arguments[k] = v
	}
	work.Arguments["x-dead-letter-exchange"] = ""
	work.Arguments["x-dead-letter-routing-key"] = c.RetryQueue

	retry := Queue{
		Name:       c.RetryQueue,
		Type:       c.Queue.Type,
		Durable:    c.Queue.Durable,
		MessageTTL: Duration(c.RetryDelay),
		Arguments: map[string]any{
			"x-dead-letter-exchange":    "",
			"x-dead-letter-routing-key": c.Queue.Name,
		},
	}
	if c.Queue.Type == "quorum" {
		retry.Overflow = "reject-publish"
		retry.Arguments["x-dead-letter-strategy"] = "at-least-once"
	}
	dead := Queue{Name: c.DeadLetterQueue, Type: c.Queue.Type}
	return &Topology{Queues: []Queue{work, retry, dead}}, nil
}

// Consume runs handler for the messages of a work queue until ctx is done, then cancels
// the subscription, lets the handlers in progress finish and ack, and returns nil.
// Messages delivered ahead (prefetched) whose handler has not started go back to the
// queue unacked. Consume returns an error if the queues cannot be declared or checked,
// and when the channel or conn closes (a lost connection: unacked messages go back to
// the queue, redelivered with the redelivered flag), or the broker cancels the
// subscription (the queue was deleted). It never reconnects: DialConsume does.
//
// A message is acked only after handler returned nil for it. A handler error rejects it
// without requeue: the work queue dead-letters it to the retry queue, which sends it back
// after cfg.RetryDelay; the x-death header counts these rejections, and Delivery.Attempt
// is that count plus one. At attempt cfg.MaxAttempts, or at once for outbox.Permanent
// errors and panics, Consume publishes a copy to cfg.DeadLetterQueue (with publisher
// confirms, and the HeaderDead* headers saying why) and then acks the original, so a
// crash in between leaves two copies, never none; when the copy cannot be published,
// the message is rejected to the retry queue and tried again. Delivery is at least once:
// wrap handler with outbox.InboxHandler for exactly-once effects.
//
// conn stays the caller's. Consume refuses a connection with the client's automatic
// recovery (amqp.Config.Recovery), which would resume the subscription on a new channel
// whose delivery tags restart, letting an ack meant for one message ack another.
//
// Handlers get a context that is not cancelled when ctx is: work in progress finishes
// during shutdown. Give handlers their own timeouts.
func Consume(ctx context.Context, conn *amqp.Connection, cfg ConsumerConfig, handler outbox.Handler) error {
	_, err := consume(ctx, conn, cfg, handler)
	return err
}

// DialConsume is Consume on a connection of its own to rawURL (amqp:// or amqps:// with
// cfg.TLS), which it dials again whenever it breaks, with exponential backoff from 100
// ms to 5 s plus jitter, until ctx is done; it then returns nil. It returns an error
// without retrying when the first connection, or the first declaration of the queues,
// fails: a wrong URL, credentials, permissions or topology. Messages unacked when a
// connection broke are delivered again on the next (the inbox absorbs a second delivery
// of a message whose effects committed). Credentials never appear in its errors or logs.
func DialConsume(ctx context.Context, rawURL string, cfg ConsumerConfig, handler outbox.Handler) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	safe := RedactURL(rawURL)
	if cfg.TLS != nil && !strings.HasPrefix(strings.ToLower(strings.TrimSpace(rawURL)), "amqps://") {
		return &outbox.ConfigError{Field: "TLS", Reason: fmt.Sprintf("set, but %s is not an amqps:// URL", safe)}
	}
	log := cfg.withDefaults().Logger
	timeout := 30 * time.Second
	if d, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(d), time.Millisecond)
	}
	conn, err := dialConsumer(rawURL, safe, cfg.TLS, timeout)
	if err != nil {
		return err
	}
	for attempt, first := 0, true; ; first = false {
		started, err := consume(ctx, conn, cfg, handler)
		_ = conn.Close()
		switch {
		case ctx.Err() != nil:
			return nil
		case first && !started:
			return err
		}
		log.Warn("consumer lost its connection; reconnecting", "queue", cfg.Queue.Name, "broker", safe, "err", err)
		if started {
			attempt = 0
		}
		for conn = nil; conn == nil; attempt++ {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(reconnect.Delay(attempt)):
			}
			if conn, err = dialConsumer(rawURL, safe, cfg.TLS, 10*time.Second); err != nil {
				log.Warn("consumer cannot reconnect", "queue", cfg.Queue.Name, "attempt", attempt+1, "err", err)
			}
		}
	}
}

// dialConsumer connects as Publisher.dial does, under a connection name of its own so
// that the management views tell consumers from relays.
func dialConsumer(rawURL, safe string, tlsConfig *tls.Config, timeout time.Duration) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("outboxamqp-consumer")
	cfg := amqp.Config{
		Heartbeat:  10 * time.Second,
		Properties: props,
		Dial:       amqp.DefaultDial(timeout),
	}
	if tlsConfig != nil {
		cfg.TLSClientConfig = tlsConfig.Clone() // the client writes ServerName into it
	}
	conn, err := amqp.DialConfig(rawURL, cfg)
	if err != nil {
		return nil, fmt.Errorf("outboxamqp: connect to %s: %w", safe, scrubErr(err))
	}
	return conn, nil
}

// consume is Consume, also reporting whether the subscription started.
func consume(ctx context.Context, conn *amqp.Connection, cfg ConsumerConfig, handler outbox.Handler) (started bool, err error) {
	switch {
	case conn == nil:
		return false, errors.New("outboxamqp: Consume: nil connection")
	case handler == nil:
		return false, errors.New("outboxamqp: Consume: nil handler")
	case conn.IsRecoveryEnabled():
		return false, errors.New("outboxamqp: Consume: the connection has automatic recovery enabled (amqp.Config.Recovery): " +
			"acks cannot survive it; use a connection without it, or DialConsume, which reconnects by itself")
	}
	if err := cfg.validate(); err != nil {
		return false, err
	}
	cfg = cfg.withDefaults()
	if err := prepare(ctx, conn, cfg); err != nil {
		return false, err
	}

	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("outboxamqp: consume %s: open a channel: %w", cfg.Queue.Name, err)
	}
	defer ch.Close() // returns every message not acked to the queue
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	cancels := ch.NotifyCancel(make(chan string, 1))
	if err := ch.Qos(cfg.Prefetch, 0, false); err != nil {
		return false, fmt.Errorf("outboxamqp: consume %s: set prefetch: %w", cfg.Queue.Name, err)
	}
	tag := cfg.ConsumerTag
	if tag == "" {
		tag = "outboxamqp-" + strconv.FormatUint(rand.Uint64(), 36)
	}
	deliveries, err := ch.Consume(cfg.Queue.Name, tag, false, false, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("outboxamqp: consume %s: %w", cfg.Queue.Name, err)
	}

	r := &consumer{conn: conn, cfg: cfg}
	defer r.closeDead()
	// Prefetch bounds what the lanes hold, so the dispatcher never waits for a busy
	// handler. After shutdown began (Quit) or the channel broke, messages not started
	// stay unacked and go back to the queue when the channel closes.
	lr := lanes.New(lanes.Config{
		Handler:     handler,
		Context:     context.WithoutCancel(ctx),
		Limit:       cfg.Concurrency,
		MaxAttempts: cfg.MaxAttempts,
		Quit:        ctx.Done(),
	})
	finish := lr.Stop

	var cause error
	for {
		select {
		case d, ok := <-deliveries:
			if ok {
				key, _ := headerString(d.Headers[outbox.HeaderKey])
				lr.Go(key, func(t *lanes.Turn) {
					if !r.broken.Load() {
						r.handle(t, d)
					}
				})
				continue
			}
			// The channel closed, or the broker cancelled the subscription.
			r.broken.Store(true)
			finish()
			if cause == nil {
				select {
				case e, ok := <-closes:
					cause = closeCause(e, ok)
				case <-cancels:
				case <-time.After(100 * time.Millisecond):
				}
			}
			if cause == nil {
				cause = errors.New("the broker cancelled the subscription (was the queue deleted?)")
			}
			if ctx.Err() != nil {
				return true, nil
			}
			return true, fmt.Errorf("outboxamqp: consume %s: %w", cfg.Queue.Name, cause)
		case e, ok := <-closes:
			// Handlers in progress cannot ack any more; start no other. The client
			// closes deliveries next.
			r.broken.Store(true)
			cause, closes = closeCause(e, ok), nil
		case <-ctx.Done():
			// Stop deliveries, then drain what the client still holds (it must be
			// received, or it blocks the connection) without handling it: it goes back
			// to the queue when the channel closes, as do the messages in the lanes,
			// which skip everything now that ctx is done.
			if err := ch.Cancel(tag, false); err == nil {
				for range deliveries {
				}
			}
			finish()
			return true, nil
		}
	}
}

func closeCause(e *amqp.Error, ok bool) error {
	if ok && e != nil {
		return e
	}
	return amqp.ErrClosed
}

// prepare declares the consumer's queues, or checks that they exist (NoDeclare).
func prepare(ctx context.Context, conn *amqp.Connection, cfg ConsumerConfig) error {
	top, err := cfg.Topology()
	if err != nil {
		return err
	}
	work, retry, dead := top.Queues[0], top.Queues[1], top.Queues[2]
	withChannel := func(fn func(ch *amqp.Channel) error) error {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("outboxamqp: consume %s: open a channel: %w", cfg.Queue.Name, err)
		}
		defer ch.Close()
		return fn(ch)
	}
	exists := func(name string) error {
		return withChannel(func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
			return err
		})
	}
	if cfg.NoDeclare {
		for _, q := range top.Queues {
			if err := exists(q.Name); err != nil {
				return fmt.Errorf("outboxamqp: consume %s: queue %q: %w (NoDeclare: declare the consumer's topology first)", cfg.Queue.Name, q.Name, err)
			}
		}
		return nil
	}
	err = withChannel(func(ch *amqp.Channel) error {
		return (&Topology{Queues: []Queue{work, retry}}).Declare(ctx, ch)
	})
	if err != nil {
		return fmt.Errorf("%w (Consume declares the work queue with x-dead-letter-exchange \"\" and x-dead-letter-routing-key %q, so that rejected messages go to the retry queue and are never dropped)", err, cfg.RetryQueue)
	}
	if exists(dead.Name) == nil {
		return nil
	}
	return withChannel(func(ch *amqp.Channel) error {
		return (&Topology{Queues: []Queue{dead}}).Declare(ctx, ch)
	})
}

// consumer is one run of Consume.
type consumer struct {
	conn   *amqp.Connection
	cfg    ConsumerConfig
	broken atomic.Bool // the subscription ended: start no handler

	deadMu sync.Mutex
	dead   *confirmChannel // for dead-letter copies; opened on first use
}

// handle runs the handler on d in its turn and settles it: ack, reject to the retry
// queue, or dead letter. A turn that ends before the handler starts leaves d unacked.
func (r *consumer) handle(t *lanes.Turn, d amqp.Delivery) {
	attempt := Attempt(d.Headers, r.cfg.Queue.Name)
	del := NewDelivery(d, r.cfg.Queue.Name, attempt)
	out, ok := t.Handle(del)
	if !ok {
		return
	}

	log := r.cfg.Logger.With("event_id", del.ID, "aggregate_id", del.Key, "event_type", del.EventType, "queue", r.cfg.Queue.Name, "attempt", attempt)
	switch {
	case out.Err == nil:
		if aerr := d.Ack(false); aerr != nil {
			log.Warn("ack failed; the message will be delivered again", "err", aerr)
		}
	case out.Dead:
		r.deadLetter(d, attempt, out.Err, log)
	default:
		// The retry queue's TTL is the delay: out.Delay cannot be honoured.
		log.Warn("handler failed; retrying", "retry_in", r.cfg.RetryDelay, "err", out.Err)
		if rerr := d.Reject(false); rerr != nil {
			log.Warn("reject failed; the message will be delivered again", "err", rerr)
		}
	}
}

// deadLetter publishes a copy of d to the dead-letter queue and acks d once RabbitMQ
// confirmed the copy. When the copy fails, d is rejected to the retry queue instead: it
// comes back after RetryDelay and is dead-lettered again.
func (r *consumer) deadLetter(d amqp.Delivery, attempt int, cause error, log *slog.Logger) {
	pub := deadCopy(d, r.cfg.Queue.Name, attempt, cause)
	if err := r.publishDead(&pub); err != nil {
		log.Error("dead-lettering failed; the message goes to the retry queue and is dead-lettered again after the retry delay",
			"err", err, "cause", cause, "dead_letter_queue", r.cfg.DeadLetterQueue)
		_ = d.Reject(false)
		return
	}
	log.Error("message dead-lettered", "err", cause, "dead_letter_queue", r.cfg.DeadLetterQueue)
	if aerr := d.Ack(false); aerr != nil {
		log.Warn("ack of a dead-lettered message failed; it will be delivered again (and may be dead-lettered twice)", "err", aerr)
	}
}

// deadCopy is what Consume publishes to the dead-letter queue for d: its body and
// properties (persistent, without expiration or user id) and headers (less CC), plus
// the HeaderDead* headers.
func deadCopy(d amqp.Delivery, queue string, attempt int, cause error) amqp.Publishing {
	h := make(amqp.Table, len(d.Headers)+6)
	for k, v := range d.Headers {
		// CC and BCC would route copies to the queues they name (RabbitMQ removes BCC
		// on delivery; a publisher may have set CC).
		if k != "CC" && k != "BCC" {
			h[k] = v
		}
	}
	exchange, key := d.Exchange, d.RoutingKey
	for _, death := range Deaths(d.Headers) {
		// The entry of the work queue's rejections keeps where the message was first
		// published: later deliveries come from the retry queue.
		if death.Queue == queue && len(death.RoutingKeys) > 0 {
			exchange, key = death.Exchange, death.RoutingKeys[0]
			break
		}
	}
	h[HeaderDeadReason] = truncateUTF8(cause.Error(), deadReasonMax)
	h[HeaderDeadQueue] = queue
	h[HeaderDeadAttempts] = strconv.Itoa(attempt)
	h[HeaderDeadAt] = time.Now().UTC().Format(time.RFC3339Nano)
	h[HeaderDeadExchange] = exchange
	h[HeaderDeadRoutingKey] = key
	return resend(d, h)
}

// resend is the message of d, persistent, with headers h, for publishing again: a dead
// letter's copy, or a replay.
func resend(d amqp.Delivery, h amqp.Table) amqp.Publishing {
	return amqp.Publishing{
		Headers:         h,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}

// publishDead publishes pub to the dead-letter queue and waits for its confirm (10 s at
// most). Dead letters are rare: one at a time, on one confirm channel.
func (r *consumer) publishDead(pub *amqp.Publishing) error {
	r.deadMu.Lock()
	defer r.deadMu.Unlock()
	if r.dead == nil || !r.dead.usable() {
		if r.dead != nil {
			r.dead.close()
		}
		c, err := openConfirmChannel(r.conn)
		if err != nil {
			r.dead = nil
			return err
		}
		r.dead = c
	}
	return publishConfirmed(r.dead, "", r.cfg.DeadLetterQueue, []*amqp.Publishing{pub}, 10*time.Second)[0]
}

func (r *consumer) closeDead() {
	r.deadMu.Lock()
	defer r.deadMu.Unlock()
	if r.dead != nil {
		r.dead.close()
		r.dead = nil
	}
}

// publishConfirmed publishes pubs on c (mandatory) and waits up to timeout for their
// confirms. A nil error means confirmed and not returned.
func publishConfirmed(c *confirmChannel, exchange, key string, pubs []*amqp.Publishing, timeout time.Duration) []error {
	return publishConfirmedTo(c, func(int) (string, string) { return exchange, key }, pubs, timeout)
}

// publishConfirmedTo is publishConfirmed with a destination per message.
func publishConfirmedTo(c *confirmChannel, dest func(i int) (exchange, key string), pubs []*amqp.Publishing, timeout time.Duration) []error {
	errs := make([]error, len(pubs))
	b := c.begin(errs)
	for i, pub := range pubs {
		exchange, key := dest(i)
		c.send(i, exchange, key, pub)
	}
	c.seal()
	var cause error
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-b.done:
	case <-t.C:
		cause = fmt.Errorf("outboxamqp: no publisher confirm within %s", timeout)
	}
	c.finish(cause)
	return errs
}

// Attempt returns the attempt number of a delivery from queue with headers h: one plus
// the number of times queue dead-lettered it because a consumer rejected it (or, for a
// quorum queue, because it reached the delivery limit), as the x-death header counts. A
// missing or malformed x-death header counts as none.
func Attempt(h amqp.Table, queue string) int {
	n := int64(1)
	for _, d := range Deaths(h) {
		if d.Queue == queue && (d.Reason == "rejected" || d.Reason == "delivery_limit") && d.Count > 0 {
			n += min(d.Count, math.MaxInt32)
		}
	}
	return int(min(n, math.MaxInt32))
}

// Death is one entry of the x-death header RabbitMQ adds when it dead-letters a message:
// how often the message was dead-lettered from Queue for Reason, and where it had been
// published when that first happened.
type Death struct {
	Queue       string    // the queue that dead-lettered the message
	Reason      string    // rejected, expired, maxlen or delivery_limit
	Count       int64     // how many times
	Time        time.Time // the first time
	Exchange    string    // the exchange the message had been published to ("" is the default exchange)
	RoutingKeys []string  // and its routing keys (CC included)
}

// Deaths reads the x-death header of h, newest first. Entries that are not tables, and
// fields of the wrong type, are skipped: it never fails.
func Deaths(h amqp.Table) []Death {
	arr, _ := h["x-death"].([]any)
	out := make([]Death, 0, len(arr))
	for _, e := range arr {
		t, ok := e.(amqp.Table)
		if !ok {
			continue
		}
		var d Death
		d.Queue, _ = t["queue"].(string)
		d.Reason, _ = t["reason"].(string)
		d.Exchange, _ = t["exchange"].(string)
		d.Time, _ = t["time"].(time.Time)
		d.Count, _ = toInt64(t["count"])
		keys, _ := t["routing-keys"].([]any)
		for _, k := range keys {
			if s, ok := k.(string); ok {
				d.RoutingKeys = append(d.RoutingKeys, s)
			}
		}
		out = append(out, d)
	}
	return out
}

func toInt64(v any) (int64, bool) {
	switch v := v.(type) {
	case int64:
		return v, true
	case int32:
		return int64(v), true
	case int16:
		return int64(v), true
	case int8:
		return int64(v), true
	case int:
		return int64(v), true
	case uint8:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint32:
		return int64(v), true
	case uint64:
		if v <= math.MaxInt64 {
			return int64(v), true
		}
	}
	return 0, false
}

// NewDelivery makes the outbox.Delivery that Consume hands to a handler for d, consumed
// from queue: the headers as strings (see HeaderStrings), the id by outbox.DeliveryID
// with the AMQP message_id as the broker's id, and the content type and event type from
// the AMQP properties when the headers lack them. It never fails, whatever the headers.
func NewDelivery(d amqp.Delivery, queue string, attempt int) *outbox.Delivery {
	del := outbox.NewDelivery(HeaderStrings(d.Headers), d.MessageId, queue, d.Body, attempt)
	del.ContentType = cmp.Or(del.ContentType, d.ContentType)
	del.EventType = cmp.Or(del.EventType, d.Type)
	return del
}

// HeaderStrings returns the AMQP headers h as strings: strings as they are, byte arrays
// as text, numbers in decimal, booleans as true or false, timestamps in RFC 3339 (UTC),
// and nothing for void values, nested tables and arrays (x-death among them: see Deaths
// and Attempt).
func HeaderStrings(h amqp.Table) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		if s, ok := headerString(v); ok {
			out[k] = s
		}
	}
	return out
}

func headerString(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	case bool:
		return strconv.FormatBool(v), true
	case float32:
		return strconv.FormatFloat(float64(v), 'g', -1, 32), true
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64), true
	case time.Time:
		return v.UTC().Format(time.RFC3339), true
	case amqp.Decimal:
		return formatDecimal(v), true
	}
	if n, ok := toInt64(v); ok {
		return strconv.FormatInt(n, 10), true
	}
	if n, ok := v.(uint64); ok {
		return strconv.FormatUint(n, 10), true
	}
	return "", false
}

func formatDecimal(d amqp.Decimal) string {
	s := strconv.FormatInt(int64(d.Value), 10)
	if d.Scale == 0 {
		return s
	}
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	if n := int(d.Scale); len(s) <= n {
		s = strings.Repeat("0", n-len(s)+1) + s
	}
	s = s[:len(s)-int(d.Scale)] + "." + s[len(s)-int(d.Scale):]
	if neg {
		s = "-" + s
	}
	return s
}

// truncateUTF8 cuts s to at most n bytes without splitting a character.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n-3]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "..."
}
