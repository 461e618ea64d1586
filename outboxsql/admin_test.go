package outboxsql_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxsql"
	"github.com/outboxkit/outbox/outboxtest"
)

// The admin tests of outboxpgx, through database/sql: the statements are shared, so what
// these check is that every parameter (uuid arrays, times, LIKE patterns, limits) binds
// and every column scans the same with each database/sql driver.

// fixture returns the test's schema for the testdb helpers that set rows up directly
// (Kill, MarkPublished, Exec, CountIn); they go through pgx, not through the driver
// under test.
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

func ids(dls []outbox.DeadLetter) []outbox.ID {
	out := make([]outbox.ID, len(dls))
	for i, dl := range dls {
		out[i] = dl.ID
	}
	return out
}

func TestStatusCountsEveryState(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		f := b.fixture()
		due1, due2 := msg("orders", "o-1"), msg("orders", "o-2")
		delayed := msg("orders", "o-3")
		delayed.DeliverAt = time.Now().Add(time.Hour)
		retryDue, retryLater := msg("billing", "b-1"), msg("billing", "b-2")
		dead1, dead2 := msg("billing", "b-3"), msg("shipping", "s-1")
		pub1, pub2, pub3 := msg("orders", "o-4"), msg("orders", "o-5"), msg("shipping", "s-2")
		b.mustWrite(t, due1, due2, delayed, retryDue, retryLater, dead1, dead2, pub1, pub2, pub3)

		aged := time.Now() // due1 is an hour old from here on
		f.Exec(t, `UPDATE %[1]s.outbox SET created_at = now() - interval '1 hour' WHERE id = $1`, due1.ID.String())
		f.Exec(t, `UPDATE %[1]s.outbox SET attempts = 1, last_error = 'nack' WHERE id = $1`, retryDue.ID.String())
		f.Exec(t, `UPDATE %[1]s.outbox SET attempts = 2, last_error = 'nack', next_attempt_at = now() + interval '10 minutes' WHERE id = $1`, retryLater.ID.String())
		f.Kill(t, dead1.ID, 3, "nack", time.Minute)
		f.Kill(t, dead2.ID, 3, "nack", time.Minute)
		for _, m := range []outbox.Message{pub1, pub2, pub3} {
			f.MarkPublished(t, m.ID)
		}
		f.Exec(t, `INSERT INTO %[1]s.outbox_relays (id, hostname, pid, expires_at) VALUES
			('r1', 'host-a', 11, now() + interval '1 hour'), ('r2', 'host-b', 22, now() - interval '1 minute')`)
		f.Exec(t, `UPDATE %[1]s.outbox_leases SET owner = 'r1', token = shard + 1, expires_at = now() + interval '1 hour' WHERE shard < 10`)
		f.Exec(t, `UPDATE %[1]s.outbox_leases SET owner = 'r2', token = shard + 1, expires_at = now() - interval '1 minute' WHERE shard BETWEEN 10 AND 12`)

		st, err := b.drv.Status(testenv.Context(t))
		if err != nil {
			t.Fatal(err)
		}
		want := struct{ pending, due, retrying, delayed, dead, published int64 }{5, 3, 2, 2, 2, 3}
		got := struct{ pending, due, retrying, delayed, dead, published int64 }{st.Pending, st.Due, st.Retrying, st.Delayed, st.Dead, st.Published}
		if got != want {
			t.Fatalf("counts: got %+v, want %+v", got, want)
		}
		// An hour, plus however long the statements since took (and a second for the clock).
		if limit := time.Hour + time.Since(aged) + time.Second; st.OldestPendingAge < time.Hour || st.OldestPendingAge > limit {
			t.Fatalf("oldest pending age %v, want between 1h and %v", st.OldestPendingAge, limit)
		}
		wantTopics := []outbox.TopicStatus{
			{Topic: "billing", Pending: 2, Due: 1, Retrying: 2, Dead: 1},
			{Topic: "orders", Pending: 3, Due: 2, Retrying: 0, Dead: 0},
			{Topic: "shipping", Pending: 0, Due: 0, Retrying: 0, Dead: 1},
		}
		if len(st.Topics) != len(wantTopics) {
			t.Fatalf("topics: got %+v", st.Topics)
		}
		for i, w := range wantTopics {
			g := st.Topics[i]
			age := g.OldestPendingAge
			g.OldestPendingAge = 0
			if g != w {
				t.Fatalf("topic %d: got %+v, want %+v", i, g, w)
			}
			if (w.Pending == 0) != (age == 0) {
				t.Fatalf("topic %s: oldest pending age %v with %d pending", w.Topic, age, w.Pending)
			}
		}
		if st.Shards != 64 || st.ShardsLeased != 10 {
			t.Fatalf("shards: got %d total, %d leased; want 64, 10", st.Shards, st.ShardsLeased)
		}
		if len(st.Relays) != 2 {
			t.Fatalf("relays: got %+v", st.Relays)
		}
		r1, r2 := st.Relays[0], st.Relays[1]
		if r1.ID != "r1" || !r1.Live || r1.Shards != 10 || r1.Hostname != "host-a" || r1.PID != 11 || r1.StartedAt.IsZero() || r1.HeartbeatAt.IsZero() {
			t.Fatalf("relay r1: %+v", r1)
		}
		if r2.ID != "r2" || r2.Live || r2.Shards != 0 || r2.PID != 22 {
			t.Fatalf("relay r2: %+v", r2)
		}
	})
}

func TestStatusEstimatesLargePublishedTable(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		f := b.fixture()
		const rows = outboxsql.PublishedExactBelow + 20_000
		f.Exec(t, `INSERT INTO %[1]s.outbox_published (seq, id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, shard, created_at, attempts)
SELECT i, gen_random_uuid(), 'orders', '', '', '', 'application/json', '\x7b7d', '{}', i::text, 0, now(), 0
FROM generate_series(1, $1::int) i`, rows)
		f.Exec(t, `ANALYZE %[1]s.outbox_published`)
		b.mustWrite(t, msg("orders", "p"))
		st, err := b.drv.Status(testenv.Context(t))
		if err != nil {
			t.Fatal(err)
		}
		if st.Published < rows*9/10 || st.Published > rows*11/10 {
			t.Fatalf("published estimate %d, want about %d", st.Published, rows)
		}
		if st.Pending != 1 || st.Dead != 0 {
			t.Fatalf("pending %d dead %d next to a large published table; want 1, 0", st.Pending, st.Dead)
		}
	})
}

func TestStatusEmptyOutbox(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		st, err := b.drv.Status(testenv.Context(t))
		if err != nil {
			t.Fatal(err)
		}
		if st.Pending != 0 || st.Dead != 0 || st.Published != 0 || st.OldestPendingAge != 0 || st.Shards != 64 {
			t.Fatalf("empty outbox: %+v", st)
		}
		if st.Topics == nil || st.Relays == nil {
			t.Fatalf("nil slices in %+v", st)
		}
	})
}

// deadFixture writes three dead letters and one pending message that has failed with
// an error the filters would match, so that a filter leaking into live rows shows. The
// errors are chosen so that an unescaped % or _ in a LIKE pattern matches more.
type deadFixture struct {
	b                *testBundle
	f                *testdb.DB
	old, mid, recent outbox.Message
	pending          outbox.Message
}

func newDeadFixture(t *testing.T, b *testBundle) *deadFixture {
	t.Helper()
	x := &deadFixture{b: b, f: b.fixture()}
	x.old, x.mid, x.recent = msg("orders", "k1"), msg("orders", "k2"), msg("billing", "k1")
	x.old.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	x.pending = msg("orders", "k3")
	b.mustWrite(t, x.old, x.mid, x.recent, x.pending)
	x.f.Kill(t, x.old.ID, 3, "disk 100% full_disk", 3*time.Hour)
	x.f.Kill(t, x.mid.ID, 3, "publish timeout after 10s for ack", time.Hour)
	x.f.Kill(t, x.recent.ID, 3, "Schema mismatch: field x in all/data", 10*time.Minute)
	x.f.Exec(t, `UPDATE %[1]s.outbox SET attempts = 2, last_error = 'publish timeout 100% full_disk Schema' WHERE id = $1`, x.pending.ID.String())
	return x
}

func TestDeadListFilters(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		x := newDeadFixture(t, b)
		c := testenv.Context(t)
		now := time.Now()
		cases := []struct {
			name   string
			filter outbox.DeadFilter
			want   []outbox.ID
		}{
			{"all, newest first", outbox.DeadFilter{}, []outbox.ID{x.recent.ID, x.mid.ID, x.old.ID}},
			{"topic", outbox.DeadFilter{Topic: "orders"}, []outbox.ID{x.mid.ID, x.old.ID}},
			{"key", outbox.DeadFilter{Key: "k1"}, []outbox.ID{x.recent.ID, x.old.ID}},
			{"topic and key", outbox.DeadFilter{Topic: "orders", Key: "k1"}, []outbox.ID{x.old.ID}},
			{"ids", outbox.DeadFilter{IDs: []outbox.ID{x.mid.ID, x.pending.ID}}, []outbox.ID{x.mid.ID}},
			{"one id", outbox.DeadFilter{IDs: []outbox.ID{x.recent.ID}}, []outbox.ID{x.recent.ID}},
			{"error, any case", outbox.DeadFilter{ErrorContains: "SCHEMA MISMATCH"}, []outbox.ID{x.recent.ID}},
			{"error with % is literal", outbox.DeadFilter{ErrorContains: "0% f"}, []outbox.ID{x.old.ID}},
			{"error with _ is literal", outbox.DeadFilter{ErrorContains: "l_d"}, []outbox.ID{x.old.ID}},
			{"error % alone", outbox.DeadFilter{ErrorContains: "%"}, []outbox.ID{x.old.ID}},
			{"error ! escape char", outbox.DeadFilter{ErrorContains: "!"}, nil},
			{"since", outbox.DeadFilter{Since: now.Add(-2 * time.Hour)}, []outbox.ID{x.recent.ID, x.mid.ID}},
			{"until", outbox.DeadFilter{Until: now.Add(-2 * time.Hour)}, []outbox.ID{x.old.ID}},
			{"since and until, another zone", outbox.DeadFilter{Since: now.Add(-2 * time.Hour).In(time.FixedZone("x", 5*3600)),
				Until: now.Add(-30 * time.Minute).UTC()}, []outbox.ID{x.mid.ID}},
			{"limit takes the newest", outbox.DeadFilter{Limit: 2}, []outbox.ID{x.recent.ID, x.mid.ID}},
			{"nothing matches", outbox.DeadFilter{Topic: "nope"}, nil},
		}
		for _, tc := range cases {
			got, err := b.drv.DeadList(c, tc.filter)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if !slices.Equal(ids(got), tc.want) {
				t.Errorf("%s: got %v, want %v", tc.name, ids(got), tc.want)
			}
			n, err := b.drv.DeadCount(c, tc.filter)
			if err != nil || n != len(tc.want) {
				t.Errorf("%s: DeadCount = %d, %v; want %d", tc.name, n, err, len(tc.want))
			}
		}

		// A dead letter comes back whole.
		got, err := b.drv.DeadList(c, outbox.DeadFilter{IDs: []outbox.ID{x.old.ID}})
		if err != nil || len(got) != 1 {
			t.Fatalf("got %v, %v", got, err)
		}
		dl := got[0]
		if dl.ID != x.old.ID || dl.Topic != "orders" || dl.Key != "k1" || dl.DedupKey != x.old.ID.String() || dl.Attempts != 3 ||
			dl.LastError != "disk 100% full_disk" || string(dl.Payload) != `{}` || !maps(dl.Headers, x.old.Headers) ||
			dl.ContentType != outbox.ContentTypeJSON || dl.Seq == 0 || dl.CreatedAt.IsZero() {
			t.Fatalf("dead letter not read back whole: %+v", dl)
		}
		if age := time.Since(dl.DeadAt); age < 2*time.Hour || age > 4*time.Hour {
			t.Fatalf("dead_at %v is %v ago, want about 3h", dl.DeadAt, age)
		}
		if _, err := b.drv.DeadList(c, outbox.DeadFilter{Limit: -1}); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Fatalf("negative limit: got %v, want ErrInvalidConfig", err)
		}
	})
}

// TestDeadReplayPublishesWithSameIdentity runs a relay on this store: it dead-letters
// what a broken broker rejects, and publishes the replayed messages with their identity.
func TestDeadReplayPublishesWithSameIdentity(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		var broken atomic.Bool
		broken.Store(true)
		pub := &outboxtest.Publisher{Fail: func(m *outbox.Message) error {
			if broken.Load() {
				return errors.New(`rejected: schema registry says "no" {at, \ all}`)
			}
			return nil
		}}
		a1, a2, other := msg("orders", "a"), msg("orders", "a"), msg("billing", "b")
		a1.DedupKey = "order-a-placed"
		b.mustWrite(t, a1, a2, other)
		startRelay(t, b.drv, pub, outbox.RelayConfig{PollInterval: 20 * time.Millisecond, MaxAttempts: 1})

		testenv.Await(t, "3 dead letters", func() (any, bool) {
			ctx, cancel := testenv.CallContext()
			defer cancel()
			n, err := b.drv.DeadCount(ctx, outbox.DeadFilter{})
			return fmt.Sprint(n, " dead, err ", err), err == nil && n == 3
		})
		broken.Store(false)
		f := b.fixture()
		if n := f.CountIn(t, "outbox", "true"); n != 0 {
			t.Fatalf("%d rows left pending after dead-lettering, want 0", n)
		}
		before, err := b.drv.DeadList(testenv.Context(t), outbox.DeadFilter{Topic: "orders"})
		if err != nil || len(before) != 2 {
			t.Fatalf("dead orders: %v, %v", ids(before), err)
		}
		seqOf := map[outbox.ID]int64{}
		for _, dl := range before {
			if dl.Attempts != 1 || dl.LastError != `rejected: schema registry says "no" {at, \ all}` || dl.DeadAt.IsZero() {
				t.Fatalf("dead letter as the relay wrote it: %+v", dl)
			}
			seqOf[dl.ID] = dl.Seq
		}

		n, err := b.drv.DeadReplay(testenv.Context(t), outbox.DeadFilter{Topic: "orders"})
		if err != nil || n != 2 {
			t.Fatalf("replay: %d, %v; want 2", n, err)
		}
		got := pub.Await(t, 2)
		if got[0].ID != a1.ID || got[1].ID != a2.ID {
			t.Fatalf("replayed %v, %v; want %v, %v in write order", got[0].ID, got[1].ID, a1.ID, a2.ID)
		}
		if got[0].DedupKey != "order-a-placed" || got[1].DedupKey != a2.ID.String() || got[0].Attempts != 0 {
			t.Fatalf("replayed with dedup keys %q, %q and %d attempts", got[0].DedupKey, got[1].DedupKey, got[0].Attempts)
		}
		if got[0].Seq != seqOf[a1.ID] || got[1].Seq != seqOf[a2.ID] {
			t.Fatalf("seqs changed: replayed %d, %d; were %d, %d", got[0].Seq, got[1].Seq, seqOf[a1.ID], seqOf[a2.ID])
		}
		testenv.Await(t, "the replayed rows moved to published", func() (any, bool) {
			n := f.CountIn(t, "outbox_published", "true")
			return fmt.Sprint(n, " published"), n == 2
		})
		// Contexts made after the waits above: each bounds its own call.
		c := testenv.Context(t)
		left, err := b.drv.DeadList(c, outbox.DeadFilter{})
		if err != nil || len(left) != 1 || left[0].ID != other.ID {
			t.Fatalf("dead letters left: %v, %v; want only %v", ids(left), err, other.ID)
		}
		if n := f.CountAll(t, "true"); n != 3 {
			t.Fatalf("%d rows, want 3: replay must move rows, not copy them", n)
		}
		if n, err := b.drv.DeadReplay(c, outbox.DeadFilter{Topic: "orders"}); err != nil || n != 0 {
			t.Fatalf("second replay: %d, %v; want 0", n, err)
		}
	})
}

func TestDeadReplayLimitAndState(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		x := newDeadFixture(t, b)
		c := testenv.Context(t)
		mid, err := b.drv.DeadList(c, outbox.DeadFilter{IDs: []outbox.ID{x.mid.ID}})
		if err != nil || len(mid) != 1 {
			t.Fatalf("dead letter %s: %v, %v", x.mid.ID, ids(mid), err)
		}
		n, err := b.drv.DeadReplay(c, outbox.DeadFilter{Topic: "orders", Limit: 1})
		if err != nil || n != 1 {
			t.Fatalf("replay: %d, %v; want 1", n, err)
		}
		where := fmt.Sprintf("id = '%s' AND seq = %d AND dedup_key = '%s' AND attempts = 0 AND next_attempt_at <= now() AND last_error = 'publish timeout after 10s for ack'",
			x.mid.ID, mid[0].Seq, x.mid.ID)
		if x.f.CountIn(t, "outbox", where) != 1 || x.f.CountAll(t, fmt.Sprintf("id = '%s'", x.mid.ID)) != 1 {
			t.Fatal("replayed row is not moved to pending, due, with its seq, dedup key and last error and attempts reset")
		}
		if x.f.CountIn(t, "outbox_dead", fmt.Sprintf("id = '%s'", x.old.ID)) != 1 {
			t.Fatal("the older match was replayed too")
		}
		st, err := b.drv.Status(c)
		if err != nil {
			t.Fatal(err)
		}
		if st.Dead != 2 || st.Pending != 2 || st.Retrying != 1 {
			t.Fatalf("after replay: dead %d pending %d retrying %d; want 2, 2, 1", st.Dead, st.Pending, st.Retrying)
		}
	})
}

func TestDeadPurgeDeletesOnlyMatches(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		x := newDeadFixture(t, b)
		c := testenv.Context(t)
		for _, empty := range []outbox.DeadFilter{{}, {Limit: 5}} {
			if _, err := b.drv.DeadPurge(c, empty); !errors.Is(err, outbox.ErrEmptyDeadFilter) {
				t.Fatalf("purge with %+v: got %v, want ErrEmptyDeadFilter", empty, err)
			}
		}
		if n := x.f.CountIn(t, "outbox_dead", "true"); n != 3 {
			t.Fatalf("refused purge deleted rows: %d dead left", n)
		}
		n, err := b.drv.DeadPurge(c, outbox.DeadFilter{ErrorContains: "timeout"})
		if err != nil || n != 1 {
			t.Fatalf("purge by error: %d, %v; want 1", n, err)
		}
		if x.f.CountAll(t, fmt.Sprintf("id = '%s'", x.mid.ID)) != 0 {
			t.Fatal("matching dead letter still there")
		}
		if x.f.CountIn(t, "outbox", fmt.Sprintf("id = '%s'", x.pending.ID)) != 1 {
			t.Fatal("a pending message with a matching error was deleted")
		}
		if x.f.CountIn(t, "outbox_dedup", fmt.Sprintf("dedup_key = '%s'", x.mid.ID)) != 1 {
			t.Fatal("purge released the dedup key at once")
		}
		n, err = b.drv.DeadPurge(c, outbox.DeadFilter{Key: "k1", Limit: 1})
		if err != nil || n != 1 {
			t.Fatalf("purge with limit: %d, %v; want 1", n, err)
		}
		if x.f.CountIn(t, "outbox_dead", fmt.Sprintf("id = '%s'", x.old.ID)) != 1 {
			t.Fatal("limit 1 purged the older match, want the newest")
		}
		published := msg("orders", "k1")
		b.mustWrite(t, published)
		x.f.MarkPublished(t, published.ID)
		n, err = b.drv.DeadPurgeAll(c)
		if err != nil || n != 1 {
			t.Fatalf("purge all: %d, %v; want 1", n, err)
		}
		if x.f.CountAll(t, "true") != 2 || x.f.CountIn(t, "outbox", "true") != 1 || x.f.CountIn(t, "outbox_published", "true") != 1 {
			t.Fatal("purge all touched a pending or published message")
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
			_, err := drv.SyncLeases(c, outbox.LeaseRequest{RelayID: "r", TTL: time.Minute})
			return err
		},
		"Fetch":           func() error { _, err := drv.Fetch(c, outbox.FetchRequest{RelayID: "r", Limit: 1}); return err },
		"Complete":        func() error { _, err := drv.Complete(c, outbox.Completion{RelayID: "r"}); return err },
		"DeletePublished": func() error { _, err := drv.DeletePublished(c, time.Hour, 1); return err },
		"Status":          func() error { _, err := drv.Status(c); return err },
		"DeadList":        func() error { _, err := drv.DeadList(c, outbox.DeadFilter{}); return err },
		"DeadCount":       func() error { _, err := drv.DeadCount(c, outbox.DeadFilter{}); return err },
		"DeadReplay":      func() error { _, err := drv.DeadReplay(c, outbox.DeadFilter{}); return err },
		"DeadPurge":       func() error { _, err := drv.DeadPurge(c, outbox.DeadFilter{Topic: "t"}); return err },
		"DeadPurgeAll":    func() error { _, err := drv.DeadPurgeAll(c); return err },
	}
	for name, call := range calls {
		if err := call(); err == nil {
			t.Errorf("%s without a *sql.DB: no error", name)
		}
	}
}

func startRelay(t *testing.T, store outbox.Store, pub outbox.Publisher, cfg outbox.RelayConfig) *outbox.Relay {
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
