package outboxotel

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox"
)

// Handler is the consumer side: it wraps h so that each delivery runs in a process span,
// with that span in the context h gets (spans h starts are its children, and messages h
// writes through a Writer with Inject carry it on).
//
// The span is named "process <topic>", of kind Consumer, carries the delivery's
// attributes (messaging.destination.name is where the broker delivered it from,
// outbox.topic the outbox topic, outbox.attempt the broker's delivery count), and links
// to the message's creation context: the traceparent of d's headers (any letter case),
// or else the one the runner put in ctx (outbox.TraceparentFromContext). It is also that
// context's child, so the consumer continues the writer's trace, as the messaging
// semantic conventions allow for a span that processes a single message; WithLinkOnly
// keeps the span in the trace of ctx's own span instead. A delivery without trace
// context gets a span that is a child of ctx's span, if any, without links.
//
// An error from h sets status Error and error.type "retry" (outbox.Retry), "permanent"
// (outbox.Permanent) or "_OTHER"; the error goes back to the runner unchanged. A panic
// ends the span with error.type "panic" and goes on panicking. The returned Handler is
// safe for concurrent use.
func Handler(h outbox.Handler, opts ...Option) outbox.Handler {
	c := newConfig(opts)
	tracer := c.tracer()
	return func(ctx context.Context, d *outbox.Delivery) (err error) {
		pctx, parent := c.deliveryContext(ctx, d)
		sopts := []trace.SpanStartOption{
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(c.deliveryAttrs(d)...),
		}
		if parent.IsValid() {
			sopts = append(sopts, trace.WithLinks(trace.Link{SpanContext: parent}))
		}
		if !parent.IsValid() || c.linkOnly {
			// The baggage of the headers stays; the parent is ctx's own span.
			pctx = trace.ContextWithSpan(pctx, trace.SpanFromContext(ctx))
		}
		name := "process"
		if dest := cmp.Or(d.Topic, d.Destination); dest != "" {
			name += " " + dest
		}
		pctx, span := tracer.Start(pctx, name, sopts...)
		defer func() {
			if r := recover(); r != nil {
				span.SetAttributes(semconv.ErrorTypeKey.String(ErrorPanic))
				span.SetStatus(codes.Error, fmt.Sprint("panic: ", r))
				span.End()
				panic(r)
			}
		}()
		err = h(pctx, d)
		if err != nil {
			span.SetAttributes(semconv.ErrorTypeKey.String(handlerErrorType(err)))
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
		return err
	}
}

// ContextFromDelivery returns ctx with d's creation context (the writer's span, read
// from d's headers or else from outbox.TraceparentFromContext(ctx)) as its remote parent
// span, for consumers that run deliveries their own way and start their own spans. With
// no trace context it returns ctx unchanged. WithPropagator applies.
func ContextFromDelivery(ctx context.Context, d *outbox.Delivery, opts ...Option) context.Context {
	pctx, sc := newConfig(opts).deliveryContext(ctx, d)
	if !sc.IsValid() {
		return ctx
	}
	return pctx
}

// deliveryContext returns ctx with d's creation context as its remote span, and that span
// context (invalid when d carries none).
func (c *config) deliveryContext(ctx context.Context, d *outbox.Delivery) (context.Context, trace.SpanContext) {
	pctx, sc := c.creationContext(ctx, d.Headers)
	if !sc.IsValid() {
		if tp := outbox.TraceparentFromContext(ctx); tp != "" {
			pctx, sc = traceparentContext(pctx, tp)
		}
	}
	return pctx, sc
}

func (c *config) deliveryAttrs(d *outbox.Delivery) []attribute.KeyValue {
	attrs := c.systemAttrs(make([]attribute.KeyValue, 0, 12))
	attrs = append(attrs,
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingMessageID(d.ID),
		semconv.MessagingMessageBodySize(len(d.Payload)),
		AttrAttempt.Int(d.Attempt),
	)
	attrs = appendNonEmpty(attrs, semconv.MessagingDestinationNameKey, cmp.Or(d.Destination, d.Topic))
	attrs = appendNonEmpty(attrs, AttrTopic, d.Topic)
	attrs = appendNonEmpty(attrs, AttrKey, d.Key)
	attrs = appendNonEmpty(attrs, AttrAggregateType, d.AggregateType)
	attrs = appendNonEmpty(attrs, AttrEventType, d.EventType)
	return attrs
}

func handlerErrorType(err error) string {
	var r *outbox.RetryError
	switch {
	case outbox.IsPermanent(err):
		return ErrorPermanent
	case errors.As(err, &r):
		return ErrorRetry
	}
	return ErrorOther
}
