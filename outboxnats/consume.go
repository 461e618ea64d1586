package outboxnats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/lanes"
)

// ConsumerConfig configures Consume. Stream and Durable are required.
type ConsumerConfig struct {
	// Stream is the JetStream stream to consume.
	Stream string
	// Durable names the durable pull consumer; Consume creates it, or updates it to this
	// configuration. Consumers sharing the name share the work.
	Durable string
	// FilterSubjects limits the consumer to these subjects. Defaults to all of the
	// stream's. More than one needs nats-server 2.10 or later.
	FilterSubjects []string

	// Concurrency is how many handlers run at once. Messages of one key (the Outbox-Key
	// header) are handled one after another, so a key's messages are handled in stream
	// order until one is retried (a redelivery comes after its successors); a message
	// without a key is ordered with no other and waits only for a free handler. Defaults
	// to 1.
	Concurrency int
	// MaxDeliver is how many times a message is delivered before it is dead-lettered.
	// Defaults to 5.
	MaxDeliver int
	// RetryDelay is the redelivery delay for handler errors not made with outbox.Retry.
	// Defaults to 1s.
	RetryDelay time.Duration
	// AckWait is how long the server waits for an ack before redelivering; a handler that
	// runs longer keeps its message with progress signals every AckWait/2. Defaults to
	// 30s.
	AckWait time.Duration
	// DeadLetterSubject, when set, receives a copy of every dead-lettered message, with
	// the headers Outbox-Dead-Reason, Outbox-Dead-Stream, Outbox-Dead-Subject and
	// Outbox-Dead-Attempts added, before the original is terminated. Put a stream on it
	// to keep them (see outbox nats dead). When empty, a dead-lettered message is only
	// terminated: the server keeps it in the stream and emits a JetStream advisory.
	DeadLetterSubject string
	// Logger receives one line per retry and dead letter. Defaults to none.
	Logger *slog.Logger
}

// Headers added to a message that Consume dead-letters to Config.DeadLetterSubject.
const (
	HeaderDeadReason   = "Outbox-Dead-Reason"
	HeaderDeadStream   = "Outbox-Dead-Stream"
	HeaderDeadSubject  = "Outbox-Dead-Subject"
	HeaderDeadAttempts = "Outbox-Dead-Attempts"
)

func (c ConsumerConfig) withDefaults() ConsumerConfig {
	c.Concurrency = cmp.Or(c.Concurrency, 1)
	c.MaxDeliver = cmp.Or(c.MaxDeliver, 5)
	c.RetryDelay = cmp.Or(c.RetryDelay, time.Second)
	c.AckWait = cmp.Or(c.AckWait, 30*time.Second)
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// Validate checks c as the consume functions do, without connecting: a
// *outbox.ConfigError names the field at fault.
func (c ConsumerConfig) Validate() error { return c.validate() }

func (c ConsumerConfig) validate() error {
	switch {
	case c.Stream == "":
		return &outbox.ConfigError{Field: "Stream", Reason: "required"}
	case c.Durable == "":
		return &outbox.ConfigError{Field: "Durable", Reason: "required"}
	case c.Concurrency < 0:
		return &outbox.ConfigError{Field: "Concurrency", Reason: "must not be negative"}
	case c.MaxDeliver < 0:
		return &outbox.ConfigError{Field: "MaxDeliver", Reason: "must not be negative"}
	case c.RetryDelay < 0 || c.AckWait < 0:
		return &outbox.ConfigError{Field: "RetryDelay", Reason: "durations must not be negative"}
	case c.AckWait > 0 && c.AckWait < time.Second:
		return &outbox.ConfigError{Field: "AckWait", Reason: "must be at least 1s"}
	}
	return nil
}

// Consume runs handler for the messages of a durable pull consumer until ctx is done,
// then stops taking messages, lets the handlers in progress finish and returns nil. It
// returns early with an error if the consumer cannot be created or the subscription
// ends.
//
// A message is acked only after handler returned nil for it. A handler error naks it
// with a delay (outbox.RetryDelay(err, cfg.RetryDelay)) until its MaxDeliver-th
// delivery, after which, or at once for outbox.Permanent errors, it is dead-lettered:
// copied to cfg.DeadLetterSubject when set, then terminated. The copy is published before
// the termination, so a crash in between leaves the message to be delivered again, never
// lost. Delivery is at least once: wrap handler with outbox.InboxHandler for exactly-once
// effects.
//
// Handlers get a context that is not cancelled when ctx is: work in progress finishes
// during shutdown. Give handlers their own timeouts.
func Consume(ctx context.Context, js jetstream.JetStream, cfg ConsumerConfig, handler outbox.Handler) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	cc := jetstream.ConsumerConfig{
		Durable:   cfg.Durable,
		AckPolicy: jetstream.AckExplicitPolicy,
		AckWait:   cfg.AckWait,
		// Consume dead-letters by itself after MaxDeliver deliveries; the server must not
		// stop delivering first and strand the message without a dead letter.
		MaxDeliver:    -1,
		MaxAckPending: max(1000, 4*cfg.Concurrency),
	}
	// One subject goes as FilterSubject, which every server takes; several need
	// FilterSubjects, which servers before 2.10 refuse.
	if len(cfg.FilterSubjects) == 1 {
		cc.FilterSubject = cfg.FilterSubjects[0]
	} else {
		cc.FilterSubjects = cfg.FilterSubjects
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, cc)
	if err != nil {
		return fmt.Errorf("outboxnats: consumer %s on stream %s: %w", cfg.Durable, cfg.Stream, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(max(16, 2*cfg.Concurrency)))
	if err != nil {
		return fmt.Errorf("outboxnats: consume %s: %w", cfg.Durable, err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()

	r := &runner{js: js, cfg: cfg, hctx: context.WithoutCancel(ctx)}
	// A backlog of one job per handler keeps the messages held here, where no progress
	// signal covers them, few: the rest wait in the iterator and on the server.
	lr := lanes.New(lanes.Config{
		Handler:     handler,
		Context:     r.hctx,
		Limit:       cfg.Concurrency,
		Backlog:     cfg.Concurrency,
		MaxAttempts: cfg.MaxDeliver,
		RetryDelay:  cfg.RetryDelay,
	})
	defer func() {
		lr.Close()
		// Acks are sent without waiting for the server: make sure the last ones reached
		// it before the caller closes the connection.
		_ = js.Conn().FlushTimeout(5 * time.Second)
	}()
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			if errors.Is(err, jetstream.ErrNoHeartbeat) {
				// A missed heartbeat (a busy server or client, a slow network) is not fatal:
				// the iterator has dropped its pending pull and issues a new one.
				continue
			}
			return fmt.Errorf("outboxnats: consume %s: %w", cfg.Durable, err)
		}
		lr.Go(msg.Headers().Get(outbox.HeaderKey), func(t *lanes.Turn) { r.handle(t, msg) })
	}
}

type runner struct {
	js   jetstream.JetStream
	cfg  ConsumerConfig
	hctx context.Context
}

// handle runs the handler on msg in its turn and settles it: ack, nak with delay, or
// dead letter.
func (r *runner) handle(t *lanes.Turn, msg jetstream.Msg) {
	attempt := 1
	if md, err := msg.Metadata(); err == nil {
		attempt = int(md.NumDelivered)
	}
	d := outbox.NewDelivery(flatHeaders(msg.Headers()), msg.Headers().Get(jetstream.MsgIDHeader), msg.Subject(), msg.Data(), attempt)

	// Keep the message while a long handler runs.
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(r.cfg.AckWait / 2)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	out, _ := t.Handle(d) // the runner neither drops lanes nor quits: always handled
	close(done)

	log := r.cfg.Logger.With("event_id", d.ID, "aggregate_id", d.Key, "event_type", d.EventType, "subject", d.Destination, "attempt", attempt)
	switch {
	case out.Err == nil:
		if aerr := msg.Ack(); aerr != nil {
			log.Warn("ack failed; the message will be delivered again", "err", aerr)
		}
	case out.Dead:
		r.deadLetter(msg, d, out.Err, log)
	default:
		log.Warn("handler failed; retrying", "retry_in", out.Delay, "err", out.Err)
		_ = msg.NakWithDelay(out.Delay)
	}
}

func (r *runner) deadLetter(msg jetstream.Msg, d *outbox.Delivery, cause error, log *slog.Logger) {
	if r.cfg.DeadLetterSubject != "" {
		copyMsg := &nats.Msg{Subject: r.cfg.DeadLetterSubject, Header: nats.Header{}, Data: msg.Data()}
		for k, vs := range msg.Headers() {
			copyMsg.Header[k] = append([]string(nil), vs...)
		}
		copyMsg.Header.Set(HeaderDeadReason, cause.Error())
		copyMsg.Header.Set(HeaderDeadStream, r.cfg.Stream)
		copyMsg.Header.Set(HeaderDeadSubject, msg.Subject())
		copyMsg.Header.Set(HeaderDeadAttempts, strconv.Itoa(d.Attempt))
		// The broker's dedup id of the copy is the message id: a crash between this and
		// the termination below stores one copy, not two.
		copyMsg.Header.Set(jetstream.MsgIDHeader, "dead:"+d.ID)
		ctx, cancel := context.WithTimeout(r.hctx, 10*time.Second)
		_, err := r.js.PublishMsg(ctx, copyMsg)
		cancel()
		if err != nil {
			log.Error("dead-lettering failed; the message will be delivered again", "err", err, "cause", cause)
			_ = msg.NakWithDelay(r.cfg.RetryDelay)
			return
		}
	}
	log.Error("message dead-lettered", "err", cause, "dead_letter_subject", r.cfg.DeadLetterSubject)
	_ = msg.TermWithReason(truncateReason(cause.Error()))
}

func truncateReason(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

// flatHeaders keeps the first value of each header.
func flatHeaders(h nats.Header) map[string]string {
	out := make(map[string]string, len(h))
	for k, vs := range h {
		if len(vs) > 0 {
			out[k] = vs[0]
		}
	}
	return out
}
