package outboxpgx_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxtest"
)

type testBundle struct{ *testdb.DB }

func setup(t *testing.T) *testBundle {
	t.Helper()
	return &testBundle{testdb.Migrated(t)}
}

func (b *testBundle) count(t *testing.T, where string) int {
	t.Helper()
	return b.CountIn(t, "outbox", where)
}

func startRelay(t *testing.T, b *testBundle, pub outbox.Publisher, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testdb.Logger()
	}
	cfg.PollInterval = max(cfg.PollInterval, 0)
	r, err := outbox.NewRelay(b.Driver, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Stop(testenv.Context(t)); err != nil {
			t.Errorf("stop relay: %v", err)
		}
	})
	return r
}

// awaitCount waits until table has want rows matching where, showing the count meanwhile.
func (b *testBundle) awaitCount(t *testing.T, table, where string, want int) {
	t.Helper()
	testenv.Await(t, fmt.Sprintf("%d rows in %s where %s", want, table, where), func() (any, bool) {
		n := b.CountIn(t, table, where)
		return fmt.Sprintf("%d rows", n), n == want
	})
}

func TestWriteAndPublish(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.Write(t,
		outbox.Message{Topic: "orders", Key: "o-1", EventType: "order.placed", Payload: []byte(`{"n":1}`),
			Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}},
		outbox.Message{Topic: "orders", Key: "o-1", EventType: "order.paid", Payload: []byte(`{"n":2}`)},
	)
	pub := &outboxtest.Publisher{}
	startRelay(t, b, pub, outbox.RelayConfig{})
	got := pub.Await(t, 2)
	if got[0].EventType != "order.placed" || got[1].EventType != "order.paid" {
		t.Fatalf("order: got %s, %s", got[0].EventType, got[1].EventType)
	}
	if got[0].Headers["traceparent"] == "" || got[0].ContentType != outbox.ContentTypeJSON || got[0].DedupKey != got[0].ID.String() {
		t.Fatalf("message not carried whole: %+v", got[0])
	}
	b.awaitCount(t, "outbox_published", "true", 2)
}

func TestRollbackNeverPublished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// A rolled-back transaction.
	tx, err := b.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Writer.Write(ctx, tx, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`"rolled back"`)}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// A savepoint rolled back inside a committed transaction.
	err = pgx.BeginFunc(ctx, b.Pool, func(tx pgx.Tx) error {
		if err := b.Writer.Write(ctx, tx, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`"kept-1"`)}); err != nil {
			return err
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if err := b.Writer.Write(ctx, sp, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`"savepoint rolled back"`)}); err != nil {
			return err
		}
		if err := sp.Rollback(ctx); err != nil {
			return err
		}
		return b.Writer.Write(ctx, tx, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`"kept-2"`)})
	})
	if err != nil {
		t.Fatal(err)
	}
	pub := &outboxtest.Publisher{}
	r := startRelay(t, b, pub, outbox.RelayConfig{PollInterval: 20 * time.Millisecond})
	pub.Await(t, 2)
	// Give the relay time to publish anything else it (wrongly) could: a chance to go
	// wrong before the check below, not a wait for work.
	time.Sleep(300 * time.Millisecond)
	if err := r.Stop(testenv.Context(t)); err != nil {
		t.Fatalf("stop relay: %v", err)
	}
	got := pub.Messages()
	if len(got) != 2 || string(got[0].Payload) != `"kept-1"` || string(got[1].Payload) != `"kept-2"` {
		var ps []string
		for _, m := range got {
			ps = append(ps, string(m.Payload))
		}
		t.Fatalf("published %v, want only kept-1, kept-2", ps)
	}
}

func TestInvalidMessageWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cases := []struct {
		name  string
		msg   outbox.Message
		field string
	}{
		{"no topic", outbox.Message{Payload: []byte(`{}`)}, "Topic"},
		{"bad json", outbox.Message{Topic: "t", ContentType: "application/json", Payload: []byte(`{"a":`)}, "Payload"},
		{"bad json suffix", outbox.Message{Topic: "t", ContentType: "application/cloudevents+json; charset=utf-8", Payload: []byte(`nope`)}, "Payload"},
		{"oversized", outbox.Message{Topic: "t", Payload: make([]byte, outbox.MaxPayloadBytesDefault+1)}, "Payload"},
		{"header CRLF", outbox.Message{Topic: "t", Headers: map[string]string{"x": "a\r\nInjected: 1"}}, `Headers["x"]`},
		{"header name", outbox.Message{Topic: "t", Headers: map[string]string{"bad name": "v"}}, `Headers["bad name"]`},
		{"topic space", outbox.Message{Topic: "a b"}, "Topic"},
		{"key NUL", outbox.Message{Topic: "t", Key: "a\x00b"}, "Key"},
		{"key invalid utf8", outbox.Message{Topic: "t", Key: "\xff"}, "Key"},
	}
	for _, tc := range cases {
		err := pgx.BeginFunc(ctx, b.Pool, func(tx pgx.Tx) error {
			good := outbox.Message{Topic: "t", Payload: []byte(`{}`)}
			return b.Writer.Write(ctx, tx, good, tc.msg)
		})
		var ve *outbox.ValidationError
		if !errors.As(err, &ve) || !errors.Is(err, outbox.ErrInvalidMessage) {
			t.Fatalf("%s: got %v, want *ValidationError", tc.name, err)
		}
		if ve.Index != 1 || ve.Field != tc.field {
			t.Fatalf("%s: got index %d field %q, want 1 %q (%v)", tc.name, ve.Index, ve.Field, tc.field, err)
		}
	}
	if n := b.count(t, "true"); n != 0 {
		t.Fatalf("%d rows written by rejected calls", n)
	}
}

func TestBadIdentifiersRejected(t *testing.T) {
	t.Parallel()
	for _, cfg := range []outboxpgx.Config{
		{Schema: `x"; DROP TABLE y; --`},
		{Schema: "Upper"},
		{Prefix: "a b"},
		{Prefix: "p\x00"},
		{Schema: "s" + string(make([]byte, 70))},
		{Prefix: "a_very_long_prefix_that_would_be_truncated_by_pg_"},
	} {
		_, err := outboxpgx.New(nil, cfg)
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Fatalf("%+v: got %v, want *ConfigError", cfg, err)
		}
	}
}
