// Package outboxotel traces outbox messages with OpenTelemetry, from the transaction
// that writes them, through the relay that publishes them, to the handler that consumes
// them. The root package outbox has the seams (WriterConfig.Inject, Observer, Handler)
// and none of OpenTelemetry's code; import this package only where you trace.
//
// # How a message is traced
//
//  1. Writer: Inject copies the W3C traceparent (and tracestate) of the span in Write's
//     context into the message's headers, in the same transaction as the message. That
//     span is the message's creation context.
//  2. Relay: Observer records a "publish <topic>" span (kind Producer) per message and
//     attempt, timed by the Publisher.Publish call, linked to the creation context. It is
//     a link, not a child: publishing happens in the relay's own time, maybe long after
//     the request that wrote the message ended, and possibly in a batch with messages of
//     other traces.
//  3. Consumer: the broker carries the headers; Handler starts a "process <topic>" span
//     (kind Consumer) as a child of the creation context, also linked to it, so the
//     consumer continues the writer's trace (WithLinkOnly to start its own trace
//     instead). ContextFromDelivery gives the creation context to other runners.
//
// A trace then reads: the request's span, under it the consumer's process span and
// whatever the consumer does; the publish span sits in its own trace and links back to
// the request's span. Attributes follow the OpenTelemetry messaging semantic conventions
// (messaging.system, messaging.operation.type, messaging.destination.name,
// messaging.message.id, messaging.message.body.size, messaging.client.id for the relay's
// id, error.type) plus outbox.topic, outbox.key, outbox.aggregate_type,
// outbox.event_type, outbox.dedup_key, outbox.attempt, outbox.seq and outbox.shard.
// Payloads and headers are never recorded; broker and handler error messages are, as
// in the relay's logs.
//
// The trace context travels as the headers "traceparent" and "tracestate" by default
// (propagation.TraceContext), whatever otel's global propagator is; WithPropagator
// changes that, and then the writer, the relay and the consumers need the same one.
//
// # Writer
//
//	w, err := outbox.NewWriter(drv, outbox.WriterConfig{Inject: outboxotel.Inject()})
//	...
//	ctx, span := tracer.Start(ctx, "place order")
//	defer span.End()
//	err = w.Write(ctx, tx, outbox.Message{Topic: "orders", Key: orderID, Payload: body})
//
// A message whose Headers already have a traceparent keeps it.
//
// # Relay
//
//	relay, err := outbox.NewRelay(drv, pub, outbox.RelayConfig{
//		Observer: outboxotel.NewObserver(outboxotel.WithSystem("nats")),
//	})
//
// To have metrics as well, give RelayConfig.Observer a fan-out of this Observer and the
// metrics observer. Publish spans are roots: the relay's sampler alone decides which are
// kept (see Observer).
//
// # Consumer
//
//	err := outboxnats.Consume(ctx, js, cfg, outboxotel.Handler(handle, outboxotel.WithSystem("nats")))
//
// or, with a runner of your own:
//
//	d := outbox.NewDelivery(headers, brokerID, subject, payload, attempt)
//	ctx = outboxotel.ContextFromDelivery(ctx, d)
//	ctx, span := tracer.Start(ctx, "process orders", trace.WithSpanKind(trace.SpanKindConsumer))
//
// Without WithTracerProvider the spans go to otel.GetTracerProvider(), which records
// nothing until the program sets a provider (otel.SetTracerProvider).
package outboxotel
