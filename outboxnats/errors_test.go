package outboxnats

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest"
)

// TestClassify pins the error table of the package documentation for errors that the
// tests against a real server cannot provoke cheaply.
func TestClassify(t *testing.T) {
	t.Parallel()
	api := func(code int, errCode jetstream.ErrorCode) error {
		return fmt.Errorf("nats: %w", &jetstream.APIError{Code: code, ErrorCode: errCode, Description: "x"})
	}
	for _, tc := range []struct {
		name   string
		err    error
		outage bool
	}{
		{"closed", nats.ErrConnectionClosed, true},
		{"jetstream closed", jetstream.ErrConnectionClosed, true},
		{"draining", nats.ErrConnectionDraining, true},
		{"reconnecting", nats.ErrConnectionReconnecting, true},
		{"disconnected", nats.ErrDisconnected, true},
		{"reconnect buffer", nats.ErrReconnectBufExceeded, true},
		{"timeout", nats.ErrTimeout, true},
		{"ack timeout", jetstream.ErrAsyncPublishTimeout, true},
		{"stalled", jetstream.ErrTooManyStalledMsgs, true},
		{"deadline", context.DeadlineExceeded, true},
		{"no responders", nats.ErrNoResponders, true},
		{"no stream response", jetstream.ErrNoStreamResponse, true},
		{"unknown", errors.New("something new"), true},
		{"insufficient resources", api(503, 10023), true},
		{"storage exceeded", api(500, 10047), true},
		{"store failed", api(503, 10077), true},
		{"account resources", api(400, 10002), true},
		{"sealed", api(400, 10109), true},
		{"duplicate in process", api(409, 10158), true},
		{"too many requests", api(429, 10167), true},
		{"stream offline", api(500, 10118), true},
		{"not enabled", api(503, 10076), true},
		{"max payload", nats.ErrMaxPayload, false},
		{"bad subject", nats.ErrBadSubject, false},
		{"not a PubAck", jetstream.ErrInvalidJSAck, false},
		{"bad header", nats.ErrBadHeaderMsg, false},
		{"max msg size", api(400, 10054), false},
		{"header too large", api(400, 10097), false},
		{"wrong last sequence", api(400, 10071), false},
		{"wrong last sequence constant", api(400, 10164), false},
		{"wrong last msg id", api(400, 10070), false},
		{"expected stream", api(400, 10060), false},
		{"invalid ttl", api(400, 10165), false},
	} {
		got := classify(tc.err, "s.x")
		if outbox.IsUnavailable(got) != tc.outage {
			t.Errorf("%s: IsUnavailable(%v) = %v, want %v", tc.name, got, !tc.outage, tc.outage)
		}
		if !errors.Is(got, tc.err) {
			t.Errorf("%s: %v does not wrap %v", tc.name, got, tc.err)
		}
	}
}

func TestCheckSubject(t *testing.T) {
	t.Parallel()
	for s, valid := range map[string]bool{
		"a": true, "a.b.c": true, "a*b.c>": true, "a-b_c.D9": true,
		"": false, ".a": false, "a.": false, "a..b": false, "*": false, "a.*": false,
		"a.>": false, ">": false, "a b": false, "a\tb": false, "a\x00b": false, "a\x7fb": false,
		"$JS.API.STREAM.DELETE.X": false, "$SYS.REQ.SERVER.PING": false, "$KV.b.k": false, "$O.b": false,
		"_INBOX.abc": false, "_R_.x": false, "$": false, "a.$JS.b": true, "_INBOXES.a": true,
	} {
		if got := checkSubject(s) == ""; got != valid {
			t.Errorf("checkSubject(%q) valid = %v, want %v", s, got, valid)
		}
	}
}

func TestCovers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		filter, sub string
		want        bool
	}{
		{"a.>", "a.b", true},
		{"a.>", "a.b.c", true},
		{"a.>", "a.>", true},
		{"a.>", "a.*", true},
		{"a.>", "a", false},
		{">", "a", true},
		{"a.*", "a.b", true},
		{"a.*", "a.*", true},
		{"a.*", "a.>", false},
		{"a.*", "a.b.c", false},
		{"a.b", "a.b", true},
		{"a.b", "a.*", false},
		{"a.b", "a.c", false},
		{"a.*.c", "a.b.c", true},
		{"a.b.c", "a.b", false},
	} {
		if got := covers(tc.filter, tc.sub); got != tc.want {
			t.Errorf("covers(%q, %q) = %v, want %v", tc.filter, tc.sub, got, tc.want)
		}
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                 "nats://127.0.0.1:4222",
		"nats://u:p@h:4222":                     "nats://REDACTED@h:4222",
		"nats://tok@h:4222, nats://u:p@h2:4222": "nats://REDACTED@h:4222,nats://REDACTED@h2:4222",
		"nats://u:p%zz@h:4222":                  "nats://REDACTED@h:4222",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestCheck: with outboxnats.Check as the writer's check, a message whose subject NATS
// refuses (a wildcard, a reserved subject, a placeholder's field empty) is refused at
// write time with its index and field named, and nothing of the call is written.
func TestCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	check, err := Check("events.{topic}.{event_type}")
	if err != nil {
		t.Fatal(err)
	}
	store := outboxtest.NewStore(outboxtest.StoreConfig{})
	w, err := outbox.NewWriter(store, outbox.WriterConfig{Check: check})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		bad   outbox.Message
		field string
	}{
		{outbox.Message{Topic: "orders.>", EventType: "placed"}, "Topic"},
		{outbox.Message{Topic: "orders", EventType: "*"}, "Topic"},
		{outbox.Message{Topic: "orders..x", EventType: "placed"}, "Topic"},
		{outbox.Message{Topic: "orders"}, "EventType"},
	} {
		tx := store.Begin()
		err := w.Write(ctx, tx, outbox.Message{Topic: "orders", EventType: "placed"}, tc.bad)
		var ve *outbox.ValidationError
		if !errors.As(err, &ve) || ve.Index != 1 || ve.Field != tc.field {
			t.Errorf("%+v: got %v, want a ValidationError on message 1 field %s", tc.bad, err, tc.field)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if st, err := store.Status(ctx); err != nil || st.Pending != 0 {
		t.Fatalf("pending after refused writes: %+v, %v; want none", st, err)
	}
	tx := store.Begin()
	if err := w.Write(ctx, tx, outbox.Message{Topic: "orders", EventType: "placed"}); err != nil {
		t.Fatalf("a valid subject refused: %v", err)
	}
	if _, err := Check("{nope}"); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Fatalf("Check with an unknown placeholder: %v, want a ConfigError", err)
	}
	reserved, _ := Check("$JS.API.{topic}")
	if err := reserved(&outbox.Message{Topic: "STREAM.DELETE.x"}); err == nil {
		t.Fatal("a route into the JetStream API accepted at write time")
	}
}
