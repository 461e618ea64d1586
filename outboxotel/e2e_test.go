package outboxotel_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxotel"
	"github.com/outboxkit/outbox/outboxtest"
)

// TestEndToEnd follows messages through a real outbox: a span writes them (Inject), a
// relay publishes them (Observer: a publish span linked to the writer's span, an error
// span for a rejected attempt), and a handler consumes them (Handler: a process span in
// the writer's trace). Next to it: a message written without trace context, and one whose
// caller set its own traceparent.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	db := testdb.Migrated(t)
	ctx := context.Background()
	opts := []outboxotel.Option{outboxotel.WithTracerProvider(b.tp), outboxotel.WithSystem("nats")}

	w, err := outbox.NewWriter(db.Driver, outbox.WriterConfig{Inject: outboxotel.Inject(opts...)})
	if err != nil {
		t.Fatal(err)
	}
	write := func(ctx context.Context, msgs ...outbox.Message) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return w.Write(ctx, tx, msgs...) }); err != nil {
			t.Fatal(err)
		}
	}
	callerHeaders := map[string]string{"traceparent": callerTraceparent}
	traced := outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "order-1", EventType: "order.placed", Payload: []byte(`{"n":1}`)}
	untraced := outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "order-2", EventType: "order.placed", Payload: []byte(`{"n":2}`)}
	own := outbox.Message{ID: outbox.NewID(), Topic: "invoices", Key: "invoice-1", Payload: []byte(`{"n":3}`), Headers: callerHeaders}

	wctx, writerSpan := b.tracer.Start(ctx, "place order")
	write(wctx, traced, own)
	writerSpan.End()
	write(ctx, untraced)
	if len(callerHeaders) != 1 {
		t.Fatalf("Write changed the caller's headers: %v", callerHeaders)
	}
	writer := writerSpan.SpanContext()
	caller := remote(t, callerTraceparent, "")

	// The relay's first attempt at the untraced message is rejected; the retry succeeds.
	var mu sync.Mutex
	rejected := false
	pub := &outboxtest.Publisher{Fail: func(m *outbox.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if m.ID == untraced.ID && !rejected {
			rejected = true
			return errors.New("no route")
		}
		return nil
	}}
	relay, err := outbox.NewRelay(db.Driver, pub, outbox.RelayConfig{
		ID:            "relay-e2e",
		Logger:        testdb.Logger(),
		Observer:      outboxotel.NewObserver(opts...),
		PollInterval:  10 * time.Millisecond,
		RetryMinDelay: time.Millisecond,
		RetryMaxDelay: 5 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = relay.Stop(testenv.Context(t)) }) // on a failure below; stopping twice is safe
	testenv.Await(t, "the relay to publish 3 messages", func() (any, bool) {
		n := len(pub.Messages())
		return fmt.Sprintf("%d of 3 published, %d attempts", n, pub.Attempts()), n >= 3
	})
	if err := relay.Stop(testenv.Context(t)); err != nil {
		t.Fatalf("stop the relay: %v", err)
	}
	published := pub.Messages()
	byID := map[outbox.ID]outbox.Message{}
	for _, m := range published {
		byID[m.ID] = m
	}

	// Writer: the header is the writer span's traceparent, or the caller's own.
	if got, want := byID[traced.ID].Headers["traceparent"], traceparent(writer); got != want {
		t.Errorf("traced message: traceparent %q, want the writer span's %q", got, want)
	}
	if h := byID[untraced.ID].Headers; len(h) != 0 {
		t.Errorf("untraced message: headers %v, want none", h)
	}
	if h := byID[own.ID].Headers; len(h) != 1 || h["traceparent"] != callerTraceparent {
		t.Errorf("caller's message: headers %v, want its own traceparent alone", h)
	}

	// Relay: one publish span per attempt, linked to the creation context.
	publishSpans := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range b.rec.Ended() {
		if v, ok := attr(s, "messaging.operation.type"); ok && v.AsString() == "send" {
			id, _ := attr(s, "messaging.message.id")
			publishSpans[id.AsString()] = append(publishSpans[id.AsString()], s)
		}
	}
	if got := publishSpans[traced.ID.String()]; len(got) != 1 {
		t.Fatalf("traced message: %d publish spans, want 1", len(got))
	}
	p := publishSpans[traced.ID.String()][0]
	if p.Name() != "publish orders" || p.SpanKind() != trace.SpanKindProducer || p.Parent().IsValid() || p.Status().Code != codes.Unset {
		t.Errorf("traced publish span: %q kind %s parent %v status %v", p.Name(), p.SpanKind(), p.Parent().IsValid(), p.Status())
	}
	wantLinks(t, p, writer)
	wantAttrs(t, p, map[attribute.Key]any{
		"messaging.system":           "nats",
		"messaging.client.id":        "relay-e2e",
		"messaging.destination.name": "orders",
		outboxotel.AttrKey:           "order-1",
		outboxotel.AttrEventType:     "order.placed",
		outboxotel.AttrAttempt:       int64(1),
	})
	if p.EndTime().Before(p.StartTime()) {
		t.Errorf("publish span ends (%s) before it starts (%s)", p.EndTime(), p.StartTime())
	}

	ownSpans := publishSpans[own.ID.String()]
	if len(ownSpans) != 1 {
		t.Fatalf("caller's message: %d publish spans, want 1", len(ownSpans))
	}
	wantLinks(t, ownSpans[0], caller)

	un := publishSpans[untraced.ID.String()]
	if len(un) != 2 {
		t.Fatalf("untraced message: %d publish spans, want 2 (rejected, then published)", len(un))
	}
	for i, s := range un {
		wantLinks(t, s)
		wantAttrs(t, s, map[attribute.Key]any{outboxotel.AttrAttempt: int64(i + 1)})
	}
	if un[0].Status().Code != codes.Error || un[0].Status().Description != "no route" {
		t.Errorf("rejected attempt: status %v, want error: no route", un[0].Status())
	}
	wantAttrs(t, un[0], map[attribute.Key]any{"error.type": "rejected"})
	if un[1].Status().Code != codes.Unset {
		t.Errorf("published attempt: status %v, want unset", un[1].Status())
	}

	// Consumer: the delivery a runner makes from the published message, in a handler.
	handled := map[outbox.ID]trace.SpanContext{}
	h := outboxotel.Handler(func(ctx context.Context, d *outbox.Delivery) error {
		id, err := outbox.ParseID(d.ID)
		if err != nil {
			return err
		}
		handled[id] = trace.SpanContextFromContext(ctx)
		if d.Topic == "invoices" {
			return outbox.Permanent(errors.New("unknown customer"))
		}
		return nil
	}, opts...)
	processSpans := map[outbox.ID]sdktrace.ReadOnlySpan{}
	for _, m := range published {
		headers := map[string]string{}
		m.WireHeaders(func(k, v string) { headers[k] = v })
		d := outbox.NewDelivery(headers, "", "events."+m.Topic, m.Payload, 1)
		before := len(b.rec.Ended())
		err := h(outbox.HandlerContext(ctx, d), d)
		if (err != nil) != (m.Topic == "invoices") {
			t.Errorf("%s: handler error %v", m.Topic, err)
		}
		ended := b.rec.Ended()
		if len(ended) != before+1 {
			t.Fatalf("handling %s ended %d spans, want 1", m.ID, len(ended)-before)
		}
		processSpans[m.ID] = ended[len(ended)-1]
	}

	c := processSpans[traced.ID]
	if c.Name() != "process orders" || c.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("traced process span: %q kind %s", c.Name(), c.SpanKind())
	}
	if c.SpanContext().TraceID() != writer.TraceID() || c.Parent().SpanID() != writer.SpanID() {
		t.Errorf("traced process span in trace %s under %s, want the writer's trace %s under %s",
			c.SpanContext().TraceID(), c.Parent().SpanID(), writer.TraceID(), writer.SpanID())
	}
	wantLinks(t, c, writer)
	if handled[traced.ID].SpanID() != c.SpanContext().SpanID() {
		t.Errorf("handler ran in span %s, want the process span %s", handled[traced.ID].SpanID(), c.SpanContext().SpanID())
	}
	wantAttrs(t, c, map[attribute.Key]any{
		"messaging.message.id":       traced.ID.String(),
		"messaging.destination.name": "events.orders",
		outboxotel.AttrTopic:         "orders",
		outboxotel.AttrKey:           "order-1",
	})

	u := processSpans[untraced.ID]
	if u.Parent().IsValid() || u.SpanContext().TraceID() == writer.TraceID() {
		t.Errorf("untraced process span: parent %v in trace %s, want a new root", u.Parent().SpanID(), u.SpanContext().TraceID())
	}
	wantLinks(t, u)

	o := processSpans[own.ID]
	if o.Parent().SpanID() != caller.SpanID() || o.SpanContext().TraceID() != caller.TraceID() {
		t.Errorf("caller's process span under %s, want the caller's %s", o.Parent().SpanID(), caller.SpanID())
	}
	if o.Status().Code != codes.Error {
		t.Errorf("failed handler: status %v, want error", o.Status())
	}
	wantAttrs(t, o, map[attribute.Key]any{"error.type": "permanent"})
}
