package outboxpgx_test

import (
	"context"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// The store-independent Admin tests (status counts, dead-letter filters, replay, purge)
// are in outboxtest/storetest, run by TestStoreConformance. These are PostgreSQL's own.

// TestStatusEstimatesLargePublishedTable: past PublishedExactBelow rows, Status reports
// the planner's estimate of the published table rather than counting it.
func TestStatusEstimatesLargePublishedTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const rows = outboxpgx.PublishedExactBelow + 20_000
	b.Exec(t, `INSERT INTO %[1]s.outbox_published (seq, id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, shard, created_at, attempts)
SELECT i, gen_random_uuid(), 'orders', '', '', '', 'application/json', '\x7b7d', '{}', i::text, 0, now(), 0
FROM generate_series(1, $1::int) i`, rows)
	b.Exec(t, `ANALYZE %[1]s.outbox_published`)
	b.Write(t, outbox.Message{Topic: "orders", Key: "p", Payload: []byte(`{}`)})

	st, err := b.Driver.Status(testenv.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	if st.Published < rows*9/10 || st.Published > rows*11/10 {
		t.Fatalf("published estimate %d, want about %d", st.Published, rows)
	}
	if st.Pending != 1 || st.Dead != 0 {
		t.Fatalf("pending %d dead %d next to a large published table; want 1, 0", st.Pending, st.Dead)
	}
}

func TestAdminNeedsPool(t *testing.T) {
	t.Parallel()
	drv, err := outboxpgx.New(nil, outboxpgx.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := drv.Status(ctx); err == nil {
		t.Fatal("Status without a pool: no error")
	}
	if _, err := drv.DeadList(ctx, outboxdriver.DeadFilter{}); err == nil {
		t.Fatal("DeadList without a pool: no error")
	}
	if _, err := drv.DeadReplay(ctx, outboxdriver.DeadFilter{}); err == nil {
		t.Fatal("DeadReplay without a pool: no error")
	}
	if _, err := drv.DeadPurgeAll(ctx); err == nil {
		t.Fatal("DeadPurgeAll without a pool: no error")
	}
}
