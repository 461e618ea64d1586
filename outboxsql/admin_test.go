package outboxsql_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxsql"
)

// The store-independent Admin tests (status counts, dead-letter filters, replay, purge)
// are in outboxtest/storetest, run once per database/sql driver by the conformance tests.
// What is left here is what only this store has.

// fixture returns the test's schema for the testdb helpers that set rows up directly
// (Exec, CountIn); they go through pgx, not through the driver under test.
func (b *testBundle) fixture() *testdb.DB { return &testdb.DB{Pool: b.pool, Schema: b.schema} }

func (b *testBundle) mustWrite(t *testing.T, msgs ...outbox.Message) {
	t.Helper()
	if err := b.write(t, msgs...); err != nil {
		t.Fatal(err)
	}
}

func msg(topic, key string) outbox.Message {
	return outbox.Message{ID: outbox.NewID(), Topic: topic, Key: key, Payload: []byte(`{}`)}
}

// TestStatusEstimatesLargePublishedTable: the planner's estimate of a large published
// table (a float in pg_class) scans into Status with each database/sql driver.
func TestStatusEstimatesLargePublishedTable(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		const rows = outboxsql.PublishedExactBelow + 20_000
		f := b.fixture()
		f.Exec(t, `INSERT INTO %[1]s.outbox_published (seq, id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, shard, created_at, attempts)
SELECT i, gen_random_uuid(), 'orders', '', '', '', 'application/json', '\x7b7d', '{}', i::text, 0, now(), 0
FROM generate_series(1, $1::int) i`, rows)
		f.Exec(t, `ANALYZE %[1]s.outbox_published`)
		b.mustWrite(t, msg("orders", "p"))
		st, err := b.drv.Status(testenv.Context(t))
		if err != nil || st.Published < rows*9/10 || st.Published > rows*11/10 || st.Pending != 1 {
			t.Fatalf("status %+v, %v; want about %d published (the estimate) and 1 pending", st, err, rows)
		}
	})
}

func TestStoreAndAdminNeedDB(t *testing.T) {
	t.Parallel()
	drv, err := outboxsql.New(nil, outboxsql.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := context.Background()
	calls := map[string]func() error{
		"SyncLeases": func() error {
			_, err := drv.SyncLeases(c, outboxdriver.LeaseRequest{RelayID: "r", TTL: time.Minute})
			return err
		},
		"Fetch":           func() error { _, err := drv.Fetch(c, outboxdriver.FetchRequest{RelayID: "r", Limit: 1}); return err },
		"Complete":        func() error { _, err := drv.Complete(c, outboxdriver.Completion{RelayID: "r"}); return err },
		"DeletePublished": func() error { _, err := drv.DeletePublished(c, time.Hour, 1); return err },
		"Status":          func() error { _, err := drv.Status(c); return err },
		"DeadList":        func() error { _, err := drv.DeadList(c, outboxdriver.DeadFilter{}); return err },
		"DeadCount":       func() error { _, err := drv.DeadCount(c, outboxdriver.DeadFilter{}); return err },
		"DeadReplay":      func() error { _, err := drv.DeadReplay(c, outboxdriver.DeadFilter{}); return err },
		"DeadPurge":       func() error { _, err := drv.DeadPurge(c, outboxdriver.DeadFilter{Topic: "t"}); return err },
		"DeadPurgeAll":    func() error { _, err := drv.DeadPurgeAll(c); return err },
	}
	for name, call := range calls {
		if err := call(); err == nil {
			t.Errorf("%s without a *sql.DB: no error", name)
		}
	}
}

func startRelay(t *testing.T, store outboxdriver.Store, pub outbox.Publisher, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	cfg.Logger = testdb.Logger()
	r, err := outbox.NewRelay(store, pub, cfg)
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
