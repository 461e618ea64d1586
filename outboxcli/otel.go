package outboxcli

import (
	"cmp"
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/brokers"
	"github.com/outboxkit/outbox/outboxotel"
)

// startTracing exports the relay's publish spans over OTLP/HTTP, configured by the
// standard OTEL_* environment (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS, OTEL_SERVICE_NAME,
// OTEL_TRACES_SAMPLER, ...), and returns the Observer that records them and the function
// that flushes and stops the exporter. The endpoint is logged without its user
// information; the headers (often an API key) never are.
func startTracing(ctx context.Context, inv *invocation, broker *brokers.Broker, log *slog.Logger) (outbox.Observer, func(context.Context) error, error) {
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, err
	}
	v, _ := buildVersion()
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (WithFromEnv) win over the defaults.
	res, err := resource.New(ctx, resource.WithAttributes(semconv.ServiceName("outbox-relay"), semconv.ServiceVersion(v)),
		resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	endpoint := cmp.Or(inv.env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), inv.env("OTEL_EXPORTER_OTLP_ENDPOINT"), "http://localhost:4318")
	log.Info("exporting traces over OTLP/HTTP", "endpoint", brokers.Redact(endpoint))
	obs := outboxotel.NewObserver(outboxotel.WithTracerProvider(tp), outboxotel.WithSystem(outboxotel.System(broker.Label)))
	return obs, tp.Shutdown, nil
}
