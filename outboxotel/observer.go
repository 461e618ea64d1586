package outboxotel

import (
	"context"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox"
)

// Observer is the relay side: an outbox.Observer that records one publish span per
// message of each Publisher.Publish call. Set it as outbox.RelayConfig.Observer (with
// the metrics observer through a fan-out when both are wanted). It implements only
// Running and PublishDone; the other events are the metrics' business.
//
// Each span is named "publish <topic>", of kind Producer, starts and ends with the
// Publish call (every message of a batch shares its times: the broker confirms them
// together), and is a new root linked to the message's creation context, the span whose
// traceparent the writer stored (see Inject). A message without trace context gives a
// span without links. A message the broker refused or could not take has status Error,
// the error recorded as an event, and error.type "rejected" or "outage"; a retried
// message gets a new span per attempt (outbox.attempt).
//
// Why a span per message rather than one per batch with a link per message: a batch mixes
// topics, so it has no destination to name; its messages succeed and fail one by one; and
// a per-message span carries the message's id, event type and attempt, so "what happened
// to event X" is one attribute search. The cost is one span per publish attempt, the same
// count as the consumers' process spans. Publish spans are roots, so the relay's sampler
// decides alone which are kept: a ratio sampler keeps that ratio of them, and a sampler
// that follows the links' sampled flag (sdktrace.SamplingParameters has the links) keeps
// exactly those of sampled requests.
//
// An Observer is safe for concurrent use. Give each relay its own: messaging.client.id is
// the id of the relay that last reported Running.
type Observer struct {
	outbox.NopObserver

	c       *config
	tracer  trace.Tracer
	relayID atomic.Pointer[string]
}

var _ outbox.Observer = (*Observer)(nil)

// NewObserver returns an Observer. WithTracerProvider, WithPropagator and WithSystem
// apply.
func NewObserver(opts ...Option) *Observer {
	c := newConfig(opts)
	return &Observer{c: c, tracer: c.tracer()}
}

// Running implements outbox.Observer: it keeps the relay's id for messaging.client.id.
func (o *Observer) Running(e outbox.RunningEvent) {
	if e.Running {
		o.relayID.Store(&e.RelayID)
	}
}

// PublishDone implements outbox.Observer: it records a publish span per message.
func (o *Observer) PublishDone(e outbox.PublishEvent) {
	batch, errs, start := e.Batch, e.Errs, e.Start
	end := start.Add(e.Took)
	var client []attribute.KeyValue
	if id := o.relayID.Load(); id != nil {
		client = []attribute.KeyValue{semconv.MessagingClientID(*id)}
	}
	for i, m := range batch {
		attrs := o.c.systemAttrs(make([]attribute.KeyValue, 0, 16))
		attrs = append(attrs,
			semconv.MessagingOperationTypeSend,
			semconv.MessagingOperationName("publish"),
			semconv.MessagingDestinationName(m.Topic),
			semconv.MessagingMessageID(m.ID.String()),
			semconv.MessagingMessageBodySize(len(m.Payload)),
			AttrTopic.String(m.Topic),
			AttrAttempt.Int(m.Attempts+1),
			AttrSeq.Int64(m.Seq),
			AttrShard.Int(m.Shard),
		)
		attrs = append(attrs, client...)
		attrs = appendNonEmpty(attrs, AttrKey, m.Key)
		attrs = appendNonEmpty(attrs, AttrAggregateType, m.AggregateType)
		attrs = appendNonEmpty(attrs, AttrEventType, m.EventType)
		if m.DedupKey != m.ID.String() {
			attrs = appendNonEmpty(attrs, AttrDedupKey, m.DedupKey)
		}
		opts := []trace.SpanStartOption{
			trace.WithNewRoot(),
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithTimestamp(start),
			trace.WithAttributes(attrs...),
		}
		if _, sc := o.c.creationContext(context.Background(), m.Headers); sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		}
		_, span := o.tracer.Start(context.Background(), "publish "+m.Topic, opts...)
		if i < len(errs) && errs[i] != nil {
			kind := ErrorRejected
			if outbox.IsOutage(errs[i]) {
				kind = ErrorOutage
			}
			span.SetAttributes(semconv.ErrorTypeKey.String(kind))
			span.RecordError(errs[i], trace.WithTimestamp(end))
			span.SetStatus(codes.Error, errs[i].Error())
		}
		span.End(trace.WithTimestamp(end))
	}
}

func appendNonEmpty(attrs []attribute.KeyValue, k attribute.Key, v string) []attribute.KeyValue {
	if v == "" {
		return attrs
	}
	return append(attrs, k.String(v))
}
