package outboxotel_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/outboxotel"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxtest"
)

// Example traces one event through the three places: the request that writes it, the
// relay that publishes it, and the handler that consumes it. A span recorder stands in
// for an exporter, and the in-memory publisher for a broker.
func Example() {
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)) // in production: an OTLP exporter
	defer tp.Shutdown(ctx)

	pool, err := pgxpool.New(ctx, testdb.URL()) // your database
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	_, _ = pool.Exec(ctx, `DROP SCHEMA IF EXISTS outboxotel_example CASCADE`)
	defer pool.Exec(ctx, `DROP SCHEMA IF EXISTS outboxotel_example CASCADE`)
	drv, err := outboxpgx.New(pool, outboxpgx.Config{Schema: "outboxotel_example"})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := drv.MigrateUp(ctx, 0); err != nil {
		log.Fatal(err)
	}

	// 1. Writer: the request's span goes into the message as its traceparent.
	w, err := outbox.NewWriter(drv, outbox.WriterConfig{Inject: outboxotel.Inject()})
	if err != nil {
		log.Fatal(err)
	}
	rctx, request := tp.Tracer("shop").Start(ctx, "POST /orders")
	err = pgx.BeginFunc(rctx, pool, func(tx pgx.Tx) error {
		return w.Write(rctx, tx, outbox.Message{Topic: "orders", Key: "order-42", EventType: "order.placed", Payload: []byte(`{"id":"order-42"}`)})
	})
	request.End()
	if err != nil {
		log.Fatal(err)
	}

	// 2. Relay: a publish span per message, linked to the request's span.
	pub := &outboxtest.Publisher{}
	relay, err := outbox.NewRelay(drv, pub, outbox.RelayConfig{
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Observer: outboxotel.NewObserver(outboxotel.WithTracerProvider(tp), outboxotel.WithSystem("nats")),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil {
		log.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	msgs, err := pub.WaitFor(wctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Stop(wctx); err != nil {
		log.Fatal(err)
	}

	// 3. Consumer: what a runner (outboxnats.Consume, ...) does with the broker's message.
	handle := outboxotel.Handler(func(ctx context.Context, d *outbox.Delivery) error {
		// Spans started from ctx here belong to the request's trace.
		return nil
	}, outboxotel.WithTracerProvider(tp), outboxotel.WithSystem("nats"))
	headers := map[string]string{}
	msgs[0].WireHeaders(func(k, v string) { headers[k] = v })
	d := outbox.NewDelivery(headers, "", "orders", msgs[0].Payload, 1)
	if err := handle(outbox.HandlerContext(ctx, d), d); err != nil {
		log.Fatal(err)
	}

	req := request.SpanContext()
	for _, s := range rec.Ended() {
		fmt.Printf("%-14s %-8s child of the request: %-5t linked to it: %t\n", s.Name(), s.SpanKind(),
			s.Parent().SpanID() == req.SpanID(), len(s.Links()) == 1 && s.Links()[0].SpanContext.SpanID() == req.SpanID())
	}
	// Output:
	// POST /orders   internal child of the request: false linked to it: false
	// publish orders producer child of the request: false linked to it: true
	// process orders consumer child of the request: true  linked to it: true
}
