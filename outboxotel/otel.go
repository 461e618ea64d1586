package outboxotel

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox"
)

// ScopeName is the instrumentation scope of the spans this package records.
const ScopeName = "github.com/outboxkit/outbox/outboxotel"

// Attribute keys of the outbox's own span attributes, next to the messaging semantic
// conventions (messaging.system, messaging.destination.name, messaging.message.id, ...).
// They name the same things as the relay's log keys.
const (
	AttrTopic         = attribute.Key("outbox.topic")
	AttrKey           = attribute.Key("outbox.key") // the ordering key: the aggregate id
	AttrAggregateType = attribute.Key("outbox.aggregate_type")
	AttrEventType     = attribute.Key("outbox.event_type")
	AttrDedupKey      = attribute.Key("outbox.dedup_key") // only when it differs from the id
	AttrAttempt       = attribute.Key("outbox.attempt")   // 1 for the first try
	AttrSeq           = attribute.Key("outbox.seq")
	AttrShard         = attribute.Key("outbox.shard")
)

// Error types set as the error.type attribute of failed spans: few and fixed, so that
// they can be grouped on.
const (
	ErrorOutage    = "outage"    // publish: the broker was unreachable; retried without counting an attempt
	ErrorRejected  = "rejected"  // publish: the broker refused the message; counts an attempt
	ErrorRetry     = "retry"     // process: the handler asked for a redelivery (outbox.Retry)
	ErrorPermanent = "permanent" // process: the handler gave up on the message (outbox.Permanent)
	ErrorPanic     = "panic"     // process: the handler panicked
	ErrorOther     = "_OTHER"    // process: any other handler error
)

// Option configures Inject, NewObserver, Handler and ContextFromDelivery.
type Option func(*config)

type config struct {
	tp       trace.TracerProvider
	prop     propagation.TextMapPropagator
	system   string
	linkOnly bool
}

func newConfig(opts []Option) *config {
	c := &config{}
	for _, o := range opts {
		o(c)
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.prop == nil {
		c.prop = propagation.TraceContext{}
	}
	return c
}

func (c *config) tracer() trace.Tracer {
	return c.tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL))
}

// WithTracerProvider sets the provider the relay's publish spans and the handlers'
// process spans come from. Defaults to otel.GetTracerProvider() (the global one, which
// records nothing until the program sets one).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithPropagator sets how trace context is written into message headers and read back.
// Defaults to propagation.TraceContext{} (the W3C traceparent and tracestate headers),
// not otel's global propagator: outbox.HeaderTraceparent and the consumer runners speak
// W3C trace context, and the global propagator records nothing until the program sets
// one. Pass otel.GetTextMapPropagator() to carry baggage (or B3) as well; give the
// writer, the relay and the consumers the same propagator.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) { c.prop = p }
}

// WithSystem sets the messaging.system attribute: the broker, as the semantic
// conventions name it ("nats", "rabbitmq", "kafka", "redis", "aws_sqs"; System maps the
// CLI's broker kinds). Defaults to none: the attribute is left out.
func WithSystem(system string) Option {
	return func(c *config) { c.system = system }
}

// WithLinkOnly makes Handler start each process span in the trace of the span already
// in the handler's context (a new trace when there is none) with only a link to the
// message's creation context, instead of continuing the writer's trace. Use it when
// messages are consumed long after they are written, or fanned out to many consumers,
// and the writer's trace should not grow with them. The relay's publish spans always
// link only.
func WithLinkOnly() Option {
	return func(c *config) { c.linkOnly = true }
}

// System returns the messaging.system value for a broker kind of the outbox CLI (nats,
// amqp, kafka, redis, sqs, webhook): the semantic conventions' name where they have one
// ("rabbitmq", "aws_sqs"), the kind itself otherwise.
func System(brokerKind string) string {
	switch brokerKind {
	case "amqp":
		return "rabbitmq"
	case "sqs":
		return "aws_sqs"
	}
	return brokerKind
}

// creationContext returns ctx with the trace context that headers carry (the message's
// creation context: the writer's span) as its remote span, and that span context. When
// headers carry none, the span context is invalid and ctx's own span is hidden, so that
// a caller cannot mistake it for one that came from the headers.
func (c *config) creationContext(ctx context.Context, headers map[string]string) (context.Context, trace.SpanContext) {
	ctx = c.prop.Extract(trace.ContextWithSpanContext(ctx, trace.SpanContext{}), headerCarrier(headers))
	return ctx, trace.SpanContextFromContext(ctx)
}

// traceparentContext is creationContext for a bare W3C traceparent value, as
// outbox.TraceparentFromContext returns it.
func traceparentContext(ctx context.Context, traceparent string) (context.Context, trace.SpanContext) {
	ctx = propagation.TraceContext{}.Extract(trace.ContextWithSpanContext(ctx, trace.SpanContext{}),
		propagation.MapCarrier{outbox.HeaderTraceparent: traceparent})
	return ctx, trace.SpanContextFromContext(ctx)
}

func (c *config) systemAttrs(attrs []attribute.KeyValue) []attribute.KeyValue {
	if c.system != "" {
		attrs = append(attrs, semconv.MessagingSystemKey.String(c.system))
	}
	return attrs
}

// headerCarrier adapts message headers to a propagator. Get matches names exactly, then
// case-insensitively: HTTP and some brokers canonicalise "traceparent" to "Traceparent".
type headerCarrier map[string]string

func (h headerCarrier) Get(key string) string {
	if v, ok := h[key]; ok {
		return v
	}
	for k, v := range h {
		if strings.EqualFold(k, key) {
			return v
		}
	}
	return ""
}

func (h headerCarrier) Set(key, value string) { h[key] = value }

func (h headerCarrier) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// hasHeader reports whether h has a header named name, in any case.
func hasHeader(h map[string]string, name string) bool {
	if _, ok := h[name]; ok {
		return true
	}
	for k := range h {
		if strings.EqualFold(k, name) {
			return true
		}
	}
	return false
}
