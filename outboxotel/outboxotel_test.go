package outboxotel_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxotel"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type testBundle struct {
	rec    *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &testBundle{rec: rec, tp: tp, tracer: tp.Tracer("app")}
}

// ended returns the ended spans named name.
func (b *testBundle) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range b.rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func traceparent(sc trace.SpanContext) string {
	return fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[attribute.Key]any) {
	t.Helper()
	for k, w := range want {
		v, ok := attr(s, k)
		switch {
		case w == nil && ok:
			t.Errorf("%s: %s = %v, want it absent", s.Name(), k, v.Emit())
		case w == nil:
		case !ok:
			t.Errorf("%s: %s missing, want %v", s.Name(), k, w)
		case v.AsInterface() != w:
			t.Errorf("%s: %s = %#v, want %#v", s.Name(), k, v.AsInterface(), w)
		}
	}
}

// wantLinks checks that s links to exactly the span contexts want (by trace and span id).
func wantLinks(t *testing.T, s sdktrace.ReadOnlySpan, want ...trace.SpanContext) {
	t.Helper()
	links := s.Links()
	if len(links) != len(want) {
		t.Fatalf("%s has %d links, want %d", s.Name(), len(links), len(want))
	}
	for i, l := range links {
		if l.SpanContext.TraceID() != want[i].TraceID() || l.SpanContext.SpanID() != want[i].SpanID() {
			t.Errorf("%s link %d = %s/%s, want %s/%s", s.Name(), i, l.SpanContext.TraceID(), l.SpanContext.SpanID(), want[i].TraceID(), want[i].SpanID())
		}
	}
}

func remote(t *testing.T, tp, ts string) trace.SpanContext {
	t.Helper()
	carrier := propagation.MapCarrier{"traceparent": tp}
	if ts != "" {
		carrier["tracestate"] = ts
	}
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier))
	if !sc.IsValid() {
		t.Fatalf("bad test traceparent %q", tp)
	}
	return sc
}

const callerTraceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

func TestInjectWritesTraceContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A span under a remote parent with a tracestate inherits the tracestate.
	parent := remote(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "vendor=opaque")
	ctx, span := b.tracer.Start(trace.ContextWithRemoteSpanContext(context.Background(), parent), "place order")
	defer span.End()

	m := &outbox.Message{Topic: "orders", Headers: map[string]string{"x-own": "kept"}}
	outboxotel.Inject()(ctx, m)
	if got, want := m.Headers["traceparent"], traceparent(span.SpanContext()); got != want {
		t.Errorf("traceparent = %q, want %q", got, want)
	}
	if got := m.Headers["tracestate"]; got != "vendor=opaque" {
		t.Errorf("tracestate = %q, want vendor=opaque", got)
	}
	if m.Headers["x-own"] != "kept" || len(m.Headers) != 3 {
		t.Errorf("headers = %v, want the own header plus traceparent and tracestate", m.Headers)
	}

	// No tracestate, no tracestate header; a nil Headers map is made.
	ctx2, span2 := b.tracer.Start(context.Background(), "other")
	defer span2.End()
	m2 := &outbox.Message{Topic: "orders"}
	outboxotel.Inject()(ctx2, m2)
	if _, ok := m2.Headers["tracestate"]; ok || m2.Headers["traceparent"] != traceparent(span2.SpanContext()) {
		t.Errorf("headers = %v, want only the traceparent of %s", m2.Headers, span2.SpanContext().SpanID())
	}
}

func TestInjectKeepsCallerTraceparent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, span := b.tracer.Start(context.Background(), "place order")
	defer span.End()
	for _, name := range []string{"traceparent", "Traceparent", "TRACEPARENT"} {
		m := &outbox.Message{Topic: "orders", Headers: map[string]string{name: callerTraceparent}}
		outboxotel.Inject()(ctx, m)
		if len(m.Headers) != 1 || m.Headers[name] != callerTraceparent {
			t.Errorf("%s: headers = %v, want the caller's traceparent alone", name, m.Headers)
		}
	}
}

func TestInjectWithoutTraceContext(t *testing.T) {
	t.Parallel()
	m := &outbox.Message{Topic: "orders"}
	outboxotel.Inject()(context.Background(), m)
	if m.Headers != nil {
		t.Errorf("headers = %v, want nil", m.Headers)
	}
	// A runner's traceparent that does not parse is not passed on.
	outboxotel.Inject()(outbox.ContextWithTraceparent(context.Background(), "00-garbage-01"), m)
	if m.Headers != nil {
		t.Errorf("headers = %v, want nil for an invalid runner traceparent", m.Headers)
	}
	// A span context that is not valid writes nothing either.
	outboxotel.Inject()(trace.ContextWithSpanContext(context.Background(), trace.SpanContext{}), m)
	if m.Headers != nil {
		t.Errorf("headers = %v, want nil", m.Headers)
	}
}

func TestInjectPassesOnRunnerTraceparent(t *testing.T) {
	t.Parallel()
	ctx := outbox.ContextWithTraceparent(context.Background(), callerTraceparent)
	m := &outbox.Message{Topic: "follow-up"}
	outboxotel.Inject()(ctx, m)
	if m.Headers["traceparent"] != callerTraceparent {
		t.Errorf("traceparent = %q, want the runner's %q", m.Headers["traceparent"], callerTraceparent)
	}
	// A span in ctx wins over the runner's traceparent.
	b := setup(t)
	sctx, span := b.tracer.Start(ctx, "handle")
	defer span.End()
	m2 := &outbox.Message{Topic: "follow-up"}
	outboxotel.Inject()(sctx, m2)
	if m2.Headers["traceparent"] != traceparent(span.SpanContext()) {
		t.Errorf("traceparent = %q, want the span's %q", m2.Headers["traceparent"], traceparent(span.SpanContext()))
	}
}

func TestInjectPropagator(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, span := b.tracer.Start(context.Background(), "place order")
	defer span.End()
	member, err := baggage.NewMember("tenant", "acme")
	if err != nil {
		t.Fatal(err)
	}
	bag, err := baggage.New(member)
	if err != nil {
		t.Fatal(err)
	}
	ctx = baggage.ContextWithBaggage(ctx, bag)
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

	m := &outbox.Message{Topic: "orders"}
	outboxotel.Inject()(ctx, m)
	if _, ok := m.Headers["baggage"]; ok {
		t.Errorf("default propagator wrote baggage: %v", m.Headers)
	}
	m2 := &outbox.Message{Topic: "orders"}
	outboxotel.Inject(outboxotel.WithPropagator(prop))(ctx, m2)
	if m2.Headers["baggage"] != "tenant=acme" || m2.Headers["traceparent"] != traceparent(span.SpanContext()) {
		t.Errorf("headers = %v, want traceparent and baggage", m2.Headers)
	}

	// The consumer side reads the baggage back with the same propagator.
	d := outbox.NewDelivery(m2.Headers, "", "orders", nil, 1)
	var got string
	h := outboxotel.Handler(func(ctx context.Context, d *outbox.Delivery) error {
		got = baggage.FromContext(ctx).Member("tenant").Value()
		return nil
	}, outboxotel.WithTracerProvider(b.tp), outboxotel.WithPropagator(prop))
	if err := h(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	if got != "acme" {
		t.Errorf("handler baggage tenant = %q, want acme", got)
	}
}

func TestObserverPublishDone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	writer := remote(t, callerTraceparent, "")
	msgs := []*outbox.Message{
		{ID: outbox.NewID(), Topic: "orders", Key: "order-1", AggregateType: "order", EventType: "order.placed",
			Payload: []byte(`{"id":1}`), Headers: map[string]string{"Traceparent": callerTraceparent}, Seq: 7, Shard: 3},
		{ID: outbox.NewID(), Topic: "orders", Key: "order-2", Attempts: 2, DedupKey: "custom-dedup"},
		{ID: outbox.NewID(), Topic: "invoices"},
	}
	msgs[0].DedupKey = msgs[0].ID.String()
	start := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	took := 42 * time.Millisecond

	o := outboxotel.NewObserver(outboxotel.WithTracerProvider(b.tp), outboxotel.WithSystem("nats"))
	o.Running(outbox.RunningEvent{RelayID: "relay-1", Running: true})
	o.FetchDone(outbox.FetchEvent{Messages: 3, Took: time.Millisecond}) // the Nop methods are there
	o.PublishDone(outbox.PublishEvent{Batch: msgs, Errs: []error{nil, errors.New("no route"), outbox.Outage(errors.New("connection refused"))}, Start: start, Took: took})
	o.Running(outbox.RunningEvent{RelayID: "relay-1"})

	spans := b.rec.Ended()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want one per message (3)", len(spans))
	}
	for _, s := range spans {
		if s.SpanKind() != trace.SpanKindProducer || !s.StartTime().Equal(start) || !s.EndTime().Equal(start.Add(took)) {
			t.Errorf("%s: kind %s, %s..%s, want producer from %s to %s", s.Name(), s.SpanKind(), s.StartTime(), s.EndTime(), start, start.Add(took))
		}
		if s.Parent().IsValid() {
			t.Errorf("%s has parent %s, want a root span", s.Name(), s.Parent().SpanID())
		}
		if s.InstrumentationScope().Name != outboxotel.ScopeName {
			t.Errorf("%s: scope %q", s.Name(), s.InstrumentationScope().Name)
		}
	}

	ok := spans[0]
	if ok.Name() != "publish orders" || ok.Status().Code != codes.Unset {
		t.Errorf("span 0 = %q status %v, want publish orders, unset", ok.Name(), ok.Status())
	}
	wantLinks(t, ok, writer)
	wantAttrs(t, ok, map[attribute.Key]any{
		"messaging.system":            "nats",
		"messaging.operation.type":    "send",
		"messaging.operation.name":    "publish",
		"messaging.destination.name":  "orders",
		"messaging.message.id":        msgs[0].ID.String(),
		"messaging.message.body.size": int64(8),
		"messaging.client.id":         "relay-1",
		outboxotel.AttrTopic:          "orders",
		outboxotel.AttrKey:            "order-1",
		outboxotel.AttrAggregateType:  "order",
		outboxotel.AttrEventType:      "order.placed",
		outboxotel.AttrAttempt:        int64(1),
		outboxotel.AttrSeq:            int64(7),
		outboxotel.AttrShard:          int64(3),
		outboxotel.AttrDedupKey:       nil, // equal to the id
		"error.type":                  nil,
	})

	rejected := spans[1]
	wantLinks(t, rejected)
	if rejected.Status().Code != codes.Error || rejected.Status().Description != "no route" {
		t.Errorf("rejected status = %v, want error: no route", rejected.Status())
	}
	wantAttrs(t, rejected, map[attribute.Key]any{
		"error.type":            "rejected",
		outboxotel.AttrAttempt:  int64(3),
		outboxotel.AttrDedupKey: "custom-dedup",
	})
	if ev := rejected.Events(); len(ev) != 1 || ev[0].Name != "exception" || !ev[0].Time.Equal(start.Add(took)) {
		t.Errorf("rejected events = %v, want one exception at the end", ev)
	}

	outage := spans[2]
	if outage.Name() != "publish invoices" || outage.Status().Code != codes.Error {
		t.Errorf("outage span = %q %v", outage.Name(), outage.Status())
	}
	wantAttrs(t, outage, map[attribute.Key]any{"error.type": "outage", outboxotel.AttrKey: nil})
}

func TestObserverWithoutRelayID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := outboxotel.NewObserver(outboxotel.WithTracerProvider(b.tp))
	o.PublishDone(outbox.PublishEvent{Batch: []*outbox.Message{{ID: outbox.NewID(), Topic: "orders"}}, Start: time.Now(), Took: time.Millisecond})
	spans := b.rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	wantAttrs(t, spans[0], map[attribute.Key]any{"messaging.client.id": nil, "messaging.system": nil})
}

func TestHandlerContinuesCreationContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	writer := remote(t, callerTraceparent, "")
	d := outbox.NewDelivery(map[string]string{
		"Traceparent":              callerTraceparent, // canonicalised by the broker
		outbox.HeaderID:            "id-1",
		outbox.HeaderTopic:         "orders",
		outbox.HeaderKey:           "order-1",
		outbox.HeaderAggregateType: "order",
		outbox.HeaderEventType:     "order.placed",
	}, "", "events.orders", []byte("{}"), 2)

	var inHandler trace.SpanContext
	h := outboxotel.Handler(func(ctx context.Context, d *outbox.Delivery) error {
		inHandler = trace.SpanContextFromContext(ctx)
		return nil
	}, outboxotel.WithTracerProvider(b.tp), outboxotel.WithSystem("nats"))
	// A span the runner has in ctx is not the parent: the creation context is.
	rctx, runner := b.tracer.Start(context.Background(), "runner")
	if err := h(outbox.HandlerContext(rctx, d), d); err != nil {
		t.Fatal(err)
	}
	runner.End()

	spans := b.ended("process orders")
	if len(spans) != 1 {
		t.Fatalf("%d process spans, want 1", len(spans))
	}
	s := spans[0]
	if s.SpanKind() != trace.SpanKindConsumer || s.Status().Code != codes.Unset {
		t.Errorf("kind %s status %v, want consumer, unset", s.SpanKind(), s.Status())
	}
	if s.Parent().SpanID() != writer.SpanID() || s.SpanContext().TraceID() != writer.TraceID() || !s.Parent().IsRemote() {
		t.Errorf("parent %s/%s, want the writer's %s/%s", s.SpanContext().TraceID(), s.Parent().SpanID(), writer.TraceID(), writer.SpanID())
	}
	wantLinks(t, s, writer)
	if inHandler.SpanID() != s.SpanContext().SpanID() {
		t.Errorf("handler ran in span %s, want the process span %s", inHandler.SpanID(), s.SpanContext().SpanID())
	}
	wantAttrs(t, s, map[attribute.Key]any{
		"messaging.system":            "nats",
		"messaging.operation.type":    "process",
		"messaging.operation.name":    "process",
		"messaging.destination.name":  "events.orders",
		"messaging.message.id":        "id-1",
		"messaging.message.body.size": int64(2),
		outboxotel.AttrTopic:          "orders",
		outboxotel.AttrKey:            "order-1",
		outboxotel.AttrAggregateType:  "order",
		outboxotel.AttrEventType:      "order.placed",
		outboxotel.AttrAttempt:        int64(2),
		"error.type":                  nil,
	})
}

func TestHandlerRunnerTraceparent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	writer := remote(t, callerTraceparent, "")
	// The headers lack the traceparent; the runner's context has it.
	d := outbox.NewDelivery(map[string]string{outbox.HeaderTopic: "orders"}, "", "orders", nil, 1)
	h := outboxotel.Handler(func(context.Context, *outbox.Delivery) error { return nil }, outboxotel.WithTracerProvider(b.tp))
	if err := h(outbox.ContextWithTraceparent(context.Background(), callerTraceparent), d); err != nil {
		t.Fatal(err)
	}
	s := b.ended("process orders")[0]
	if s.Parent().SpanID() != writer.SpanID() {
		t.Errorf("parent %s, want the writer's %s", s.Parent().SpanID(), writer.SpanID())
	}
	wantLinks(t, s, writer)
}

func TestHandlerLinkOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	writer := remote(t, callerTraceparent, "")
	d := outbox.NewDelivery(map[string]string{"traceparent": callerTraceparent, outbox.HeaderTopic: "orders"}, "", "orders", nil, 1)
	h := outboxotel.Handler(func(context.Context, *outbox.Delivery) error { return nil },
		outboxotel.WithTracerProvider(b.tp), outboxotel.WithLinkOnly())

	// With a span in ctx, the process span is its child.
	rctx, runner := b.tracer.Start(context.Background(), "runner")
	if err := h(rctx, d); err != nil {
		t.Fatal(err)
	}
	runner.End()
	// Without, it is a root.
	if err := h(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	spans := b.ended("process orders")
	if len(spans) != 2 {
		t.Fatalf("%d process spans, want 2", len(spans))
	}
	if spans[0].Parent().SpanID() != runner.SpanContext().SpanID() || spans[0].SpanContext().TraceID() != runner.SpanContext().TraceID() {
		t.Errorf("parent %s, want the runner's span %s", spans[0].Parent().SpanID(), runner.SpanContext().SpanID())
	}
	if spans[1].Parent().IsValid() || spans[1].SpanContext().TraceID() == writer.TraceID() {
		t.Errorf("without a span in ctx: parent %v trace %s, want a new root", spans[1].Parent(), spans[1].SpanContext().TraceID())
	}
	for _, s := range spans {
		wantLinks(t, s, writer)
	}
}

func TestHandlerWithoutTraceContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := outbox.NewDelivery(nil, "", "raw.subject", []byte("x"), 1)
	h := outboxotel.Handler(func(context.Context, *outbox.Delivery) error { return nil }, outboxotel.WithTracerProvider(b.tp))
	if err := h(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	rctx, runner := b.tracer.Start(context.Background(), "runner")
	if err := h(rctx, d); err != nil {
		t.Fatal(err)
	}
	runner.End()
	spans := b.ended("process raw.subject") // no topic header: named for the destination
	if len(spans) != 2 {
		t.Fatalf("%d process spans, want 2", len(spans))
	}
	wantLinks(t, spans[0])
	wantLinks(t, spans[1])
	if spans[0].Parent().IsValid() {
		t.Errorf("parent %s, want a root", spans[0].Parent().SpanID())
	}
	if spans[1].Parent().SpanID() != runner.SpanContext().SpanID() {
		t.Errorf("parent %s, want the runner's span", spans[1].Parent().SpanID())
	}
	wantAttrs(t, spans[0], map[attribute.Key]any{outboxotel.AttrTopic: nil, "messaging.destination.name": "raw.subject"})
}

func TestHandlerErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	boom := errors.New("boom")
	cases := []struct {
		topic string
		err   error
		want  string
	}{
		{"plain", boom, "_OTHER"},
		{"retry", outbox.Retry(boom, time.Second), "retry"},
		{"permanent", fmt.Errorf("wrapped: %w", outbox.Permanent(boom)), "permanent"},
	}
	for _, c := range cases {
		d := outbox.NewDelivery(map[string]string{outbox.HeaderTopic: c.topic}, "", c.topic, nil, 1)
		h := outboxotel.Handler(func(context.Context, *outbox.Delivery) error { return c.err }, outboxotel.WithTracerProvider(b.tp))
		if err := h(context.Background(), d); err != c.err {
			t.Errorf("%s: handler returned %v, want its own error unchanged", c.topic, err)
		}
		s := b.ended("process " + c.topic)[0]
		if s.Status().Code != codes.Error || s.Status().Description != c.err.Error() {
			t.Errorf("%s: status %v, want error %q", c.topic, s.Status(), c.err)
		}
		wantAttrs(t, s, map[attribute.Key]any{"error.type": c.want})
		if ev := s.Events(); len(ev) != 1 || ev[0].Name != "exception" {
			t.Errorf("%s: events %v, want the recorded exception", c.topic, ev)
		}
	}
}

func TestHandlerPanic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := outbox.NewDelivery(map[string]string{outbox.HeaderTopic: "orders"}, "", "orders", nil, 1)
	h := outboxotel.Handler(func(context.Context, *outbox.Delivery) error { panic("bad payload") }, outboxotel.WithTracerProvider(b.tp))
	func() {
		defer func() {
			if r := recover(); r != "bad payload" {
				t.Errorf("recovered %v, want the handler's panic to go on", r)
			}
		}()
		_ = h(context.Background(), d)
	}()
	spans := b.ended("process orders")
	if len(spans) != 1 || spans[0].Status().Code != codes.Error {
		t.Fatalf("spans %v, want one ended with an error", spans)
	}
	wantAttrs(t, spans[0], map[attribute.Key]any{"error.type": "panic"})
}

func TestContextFromDelivery(t *testing.T) {
	t.Parallel()
	writer := remote(t, callerTraceparent, "")
	d := outbox.NewDelivery(map[string]string{"traceparent": callerTraceparent}, "", "orders", nil, 1)
	sc := trace.SpanContextFromContext(outboxotel.ContextFromDelivery(context.Background(), d))
	if !sc.Equal(writer) || !sc.IsRemote() {
		t.Errorf("span context %v, want the remote writer's %v", sc, writer)
	}

	// Without trace context, ctx comes back unchanged, its span included.
	b := setup(t)
	ctx, span := b.tracer.Start(context.Background(), "runner")
	defer span.End()
	bare := outbox.NewDelivery(nil, "", "orders", nil, 1)
	if got := outboxotel.ContextFromDelivery(ctx, bare); got != ctx {
		t.Errorf("ContextFromDelivery changed ctx for a delivery without trace context")
	}
	// The runner's traceparent is the fallback.
	sc = trace.SpanContextFromContext(outboxotel.ContextFromDelivery(outbox.ContextWithTraceparent(context.Background(), callerTraceparent), bare))
	if !sc.Equal(writer) {
		t.Errorf("span context %v, want the runner's traceparent %v", sc, writer)
	}
}

func TestSystem(t *testing.T) {
	t.Parallel()
	for kind, want := range map[string]string{"nats": "nats", "amqp": "rabbitmq", "kafka": "kafka", "redis": "redis", "sqs": "aws_sqs", "webhook": "webhook"} {
		if got := outboxotel.System(kind); got != want {
			t.Errorf("System(%q) = %q, want %q", kind, got, want)
		}
	}
}
