package outboxotel

import (
	"context"
	"maps"

	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox"
)

// Inject returns the hook for outbox.WriterConfig.Inject that writes the trace context
// of the span in Write's context into each message's headers: traceparent, and
// tracestate when the span has one (more with WithPropagator). That span becomes the
// message's creation context, which the relay's publish span links to and Handler
// continues.
//
// A message whose headers already have a traceparent (in any letter case) keeps it and
// gets nothing else: a caller that sets its own creation context wins. When ctx has no
// span but carries a traceparent from a consumer runner (outbox.TraceparentFromContext,
// a handler writing follow-up events without Handler), that traceparent is passed on. A
// context with neither leaves the message untouched.
//
// Inject creates no span itself (no semantic-conventions "create" span): to have one per
// message, start a span of kind Producer around Write. The returned function is safe for
// concurrent use.
func Inject(opts ...Option) func(ctx context.Context, m *outbox.Message) {
	c := newConfig(opts)
	return func(ctx context.Context, m *outbox.Message) {
		if hasHeader(m.Headers, outbox.HeaderTraceparent) {
			return
		}
		if !trace.SpanContextFromContext(ctx).IsValid() {
			tp := outbox.TraceparentFromContext(ctx)
			if tp == "" {
				return
			}
			var sc trace.SpanContext
			if ctx, sc = traceparentContext(ctx, tp); !sc.IsValid() {
				return
			}
		}
		h := headerCarrier{}
		c.prop.Inject(ctx, h)
		if len(h) == 0 {
			return
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string, len(h))
		}
		maps.Copy(m.Headers, h)
	}
}
