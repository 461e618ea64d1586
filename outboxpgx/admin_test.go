package outboxpgx_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxtest"
)

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
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	due1, due2 := msg("orders", "o-1"), msg("orders", "o-2")
	delayed := msg("orders", "o-3")
	delayed.DeliverAt = time.Now().Add(time.Hour)
	retryDue, retryLater := msg("billing", "b-1"), msg("billing", "b-2")
	dead1, dead2 := msg("billing", "b-3"), msg("shipping", "s-1")
	pub1, pub2, pub3 := msg("orders", "o-4"), msg("orders", "o-5"), msg("shipping", "s-2")
	b.Write(t, due1, due2, delayed, retryDue, retryLater, dead1, dead2, pub1, pub2, pub3)

	aged := time.Now() // due1 is an hour old from here on
	b.Exec(t, `UPDATE %[1]s.outbox SET created_at = now() - interval '1 hour' WHERE id = $1`, due1.ID.String())
	b.Exec(t, `UPDATE %[1]s.outbox SET attempts = 1, last_error = 'nack' WHERE id = $1`, retryDue.ID.String())
	b.Exec(t, `UPDATE %[1]s.outbox SET attempts = 2, last_error = 'nack', next_attempt_at = now() + interval '10 minutes' WHERE id = $1`, retryLater.ID.String())
	b.Kill(t, dead1.ID, 3, "nack", time.Minute)
	b.Kill(t, dead2.ID, 3, "nack", time.Minute)
	for _, m := range []outbox.Message{pub1, pub2, pub3} {
		b.MarkPublished(t, m.ID)
	}

	// Two relays: r1 live with ten unexpired leases, r2 expired holding three expired ones.
	b.Exec(t, `INSERT INTO %[1]s.outbox_relays (id, hostname, pid, expires_at) VALUES
		('r1', 'host-a', 11, now() + interval '1 hour'), ('r2', 'host-b', 22, now() - interval '1 minute')`)
	b.Exec(t, `UPDATE %[1]s.outbox_leases SET owner = 'r1', token = shard + 1, expires_at = now() + interval '1 hour' WHERE shard < 10`)
	b.Exec(t, `UPDATE %[1]s.outbox_leases SET owner = 'r2', token = shard + 1, expires_at = now() - interval '1 minute' WHERE shard BETWEEN 10 AND 12`)

	st, err := b.Driver.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// pending: due1, due2, delayed, retryDue, retryLater.
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
	if st.Topics[1].OldestPendingAge < time.Hour {
		t.Fatalf("orders: oldest pending age %v, want at least 1h", st.Topics[1].OldestPendingAge)
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
	if r2.ID != "r2" || r2.Live || r2.Shards != 0 {
		t.Fatalf("relay r2: %+v", r2)
	}
}

func TestStatusEstimatesLargePublishedTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const rows = outboxpgx.PublishedExactBelow + 20_000
	b.Exec(t, `INSERT INTO %[1]s.outbox_published (seq, id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, shard, created_at, attempts)
SELECT i, gen_random_uuid(), 'orders', '', '', '', 'application/json', '\x7b7d', '{}', i::text, 0, now(), 0
FROM generate_series(1, $1::int) i`, rows)
	b.Exec(t, `ANALYZE %[1]s.outbox_published`)
	pending := msg("orders", "p")
	b.Write(t, pending)

	st, err := b.Driver.Status(context.Background())
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

func TestStatusEmptyOutbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st, err := b.Driver.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending != 0 || st.Dead != 0 || st.Published != 0 || st.OldestPendingAge != 0 || st.Shards != 64 {
		t.Fatalf("empty outbox: %+v", st)
	}
	// Empty, not nil, so that JSON shows [] rather than null.
	if st.Topics == nil || st.Relays == nil {
		t.Fatalf("nil slices in %+v", st)
	}
}

// deadFixture writes three dead letters and one pending message that has failed with
// an error that the filters would match, so that a filter leaking into live rows shows.
// The errors are chosen so that an unescaped % or _ in a LIKE pattern matches more.
type deadFixture struct {
	b                *testBundle
	old, mid, recent outbox.Message
	pending          outbox.Message
}

func newDeadFixture(t *testing.T) *deadFixture {
	t.Helper()
	f := &deadFixture{b: setup(t)}
	f.old, f.mid, f.recent = msg("orders", "k1"), msg("orders", "k2"), msg("billing", "k1")
	f.old.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	f.pending = msg("orders", "k3")
	f.b.Write(t, f.old, f.mid, f.recent, f.pending)
	f.b.Kill(t, f.old.ID, 3, "disk 100% full_disk", 3*time.Hour)
	f.b.Kill(t, f.mid.ID, 3, "publish timeout after 10s for ack", time.Hour)
	f.b.Kill(t, f.recent.ID, 3, "Schema mismatch: field x in all/data", 10*time.Minute)
	f.b.Exec(t, `UPDATE %[1]s.outbox SET attempts = 2, last_error = 'publish timeout 100% full_disk Schema' WHERE id = $1`, f.pending.ID.String())
	return f
}

func TestDeadListFilters(t *testing.T) {
	t.Parallel()
	f := newDeadFixture(t)
	ctx := context.Background()
	now := time.Now()
	cases := []struct {
		name   string
		filter outbox.DeadFilter
		want   []outbox.ID
	}{
		{"all, newest first", outbox.DeadFilter{}, []outbox.ID{f.recent.ID, f.mid.ID, f.old.ID}},
		{"topic", outbox.DeadFilter{Topic: "orders"}, []outbox.ID{f.mid.ID, f.old.ID}},
		{"key", outbox.DeadFilter{Key: "k1"}, []outbox.ID{f.recent.ID, f.old.ID}},
		{"topic and key", outbox.DeadFilter{Topic: "orders", Key: "k1"}, []outbox.ID{f.old.ID}},
		{"ids", outbox.DeadFilter{IDs: []outbox.ID{f.mid.ID, f.pending.ID}}, []outbox.ID{f.mid.ID}},
		{"error, any case", outbox.DeadFilter{ErrorContains: "SCHEMA MISMATCH"}, []outbox.ID{f.recent.ID}},
		{"error with % is literal", outbox.DeadFilter{ErrorContains: "0% f"}, []outbox.ID{f.old.ID}},
		{"error with _ is literal", outbox.DeadFilter{ErrorContains: "l_d"}, []outbox.ID{f.old.ID}},
		{"error % alone", outbox.DeadFilter{ErrorContains: "%"}, []outbox.ID{f.old.ID}},
		{"error ! escape char", outbox.DeadFilter{ErrorContains: "!"}, nil},
		{"since", outbox.DeadFilter{Since: now.Add(-2 * time.Hour)}, []outbox.ID{f.recent.ID, f.mid.ID}},
		{"until", outbox.DeadFilter{Until: now.Add(-2 * time.Hour)}, []outbox.ID{f.old.ID}},
		{"since and until", outbox.DeadFilter{Since: now.Add(-2 * time.Hour), Until: now.Add(-30 * time.Minute)}, []outbox.ID{f.mid.ID}},
		{"limit takes the newest", outbox.DeadFilter{Limit: 2}, []outbox.ID{f.recent.ID, f.mid.ID}},
		{"nothing matches", outbox.DeadFilter{Topic: "nope"}, nil},
	}
	for _, tc := range cases {
		got, err := f.b.Driver.DeadList(ctx, tc.filter)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slices.Equal(ids(got), tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, ids(got), tc.want)
		}
		n, err := f.b.Driver.DeadCount(ctx, tc.filter)
		if err != nil || n != len(tc.want) {
			t.Errorf("%s: DeadCount = %d, %v; want %d", tc.name, n, err, len(tc.want))
		}
	}

	// A dead letter comes back whole.
	got, err := f.b.Driver.DeadList(ctx, outbox.DeadFilter{IDs: []outbox.ID{f.old.ID}})
	if err != nil || len(got) != 1 {
		t.Fatalf("got %v, %v", got, err)
	}
	dl := got[0]
	if dl.Topic != "orders" || dl.Key != "k1" || dl.DedupKey != f.old.ID.String() || dl.Attempts != 3 ||
		dl.LastError != "disk 100% full_disk" || string(dl.Payload) != `{}` || dl.Headers["traceparent"] == "" ||
		dl.ContentType != outbox.ContentTypeJSON || dl.Seq == 0 || dl.CreatedAt.IsZero() {
		t.Fatalf("dead letter not read back whole: %+v", dl)
	}
	if age := time.Since(dl.DeadAt); age < 2*time.Hour || age > 4*time.Hour {
		t.Fatalf("dead_at %v is %v ago, want about 3h", dl.DeadAt, age)
	}

	if _, err := f.b.Driver.DeadList(ctx, outbox.DeadFilter{Limit: -1}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Fatalf("negative limit: got %v, want ErrInvalidConfig", err)
	}
}

func TestDeadReplayPublishesWithSameIdentity(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	// A broker that rejects everything while broken: with MaxAttempts 1 each message is
	// dead-lettered by the relay itself on its first rejection.
	var broken atomic.Bool
	broken.Store(true)
	pub := &outboxtest.Publisher{Fail: func(m *outbox.Message) error {
		if broken.Load() {
			return errors.New("rejected: schema registry says no")
		}
		return nil
	}}
	a1, a2, other := msg("orders", "a"), msg("orders", "a"), msg("billing", "b")
	a1.DedupKey = "order-a-placed"
	b.Write(t, a1, a2, other)
	startRelay(t, b, pub, outbox.RelayConfig{PollInterval: 50 * time.Millisecond, MaxAttempts: 1})

	testenv.Await(t, "3 dead letters", func() (any, bool) {
		n, err := b.Driver.DeadCount(ctx, outbox.DeadFilter{})
		return fmt.Sprint(n, " dead, err ", err), err == nil && n == 3
	})
	broken.Store(false)
	if n := b.CountIn(t, "outbox", "true"); n != 0 {
		t.Fatalf("%d rows left pending after dead-lettering, want 0: dead letters must move", n)
	}
	before, err := b.Driver.DeadList(ctx, outbox.DeadFilter{Topic: "orders"})
	if err != nil || len(before) != 2 {
		t.Fatalf("dead orders: %v, %v", ids(before), err)
	}
	seqOf := map[outbox.ID]int64{}
	for _, dl := range before {
		if dl.Attempts != 1 || dl.LastError != "rejected: schema registry says no" || dl.DeadAt.IsZero() {
			t.Fatalf("dead letter as the relay wrote it: %+v", dl)
		}
		seqOf[dl.ID] = dl.Seq
	}

	// Replay only the orders: billing stays dead.
	n, err := b.Driver.DeadReplay(ctx, outbox.DeadFilter{Topic: "orders"})
	if err != nil || n != 2 {
		t.Fatalf("replay: %d, %v; want 2", n, err)
	}
	got := pub.Await(t, 2)
	if got[0].ID != a1.ID || got[1].ID != a2.ID {
		t.Fatalf("replayed %v, %v; want %v, %v in write order", got[0].ID, got[1].ID, a1.ID, a2.ID)
	}
	if got[0].DedupKey != "order-a-placed" || got[1].DedupKey != a2.ID.String() {
		t.Fatalf("dedup keys changed: %q, %q", got[0].DedupKey, got[1].DedupKey)
	}
	if got[0].Attempts != 0 {
		t.Fatalf("attempts not reset: %d", got[0].Attempts)
	}
	if got[0].Seq != seqOf[a1.ID] || got[1].Seq != seqOf[a2.ID] {
		t.Fatalf("seqs changed: replayed %d, %d; were %d, %d", got[0].Seq, got[1].Seq, seqOf[a1.ID], seqOf[a2.ID])
	}
	b.awaitCount(t, "outbox_published", "true", 2) // the replayed rows, moved to published
	left, err := b.Driver.DeadList(ctx, outbox.DeadFilter{})
	if err != nil || len(left) != 1 || left[0].ID != other.ID {
		t.Fatalf("dead letters left: %v, %v; want only %v", ids(left), err, other.ID)
	}
	if n := b.CountAll(t, "true"); n != 3 {
		t.Fatalf("%d rows, want 3: replay must move rows, not copy them", n)
	}
	if n := b.CountIn(t, "outbox_dedup", "dedup_key = 'order-a-placed'"); n != 1 {
		t.Fatalf("%d dedup rows for the replayed key, want 1", n)
	}

	// Replaying what no longer matches does nothing.
	if n, err := b.Driver.DeadReplay(ctx, outbox.DeadFilter{Topic: "orders"}); err != nil || n != 0 {
		t.Fatalf("second replay: %d, %v; want 0", n, err)
	}
}

func TestDeadReplayLimitAndState(t *testing.T) {
	t.Parallel()
	f := newDeadFixture(t)
	ctx := context.Background()
	mid, err := f.b.Driver.DeadList(ctx, outbox.DeadFilter{IDs: []outbox.ID{f.mid.ID}})
	if err != nil || len(mid) != 1 {
		t.Fatalf("dead letter %s: %v, %v", f.mid.ID, ids(mid), err)
	}
	// Limit 1 replays the newest match, the one DeadList shows first.
	n, err := f.b.Driver.DeadReplay(ctx, outbox.DeadFilter{Topic: "orders", Limit: 1})
	if err != nil || n != 1 {
		t.Fatalf("replay: %d, %v; want 1", n, err)
	}
	where := fmt.Sprintf("id = '%s' AND seq = %d AND dedup_key = '%s' AND attempts = 0 AND next_attempt_at <= now() AND last_error = 'publish timeout after 10s for ack'",
		f.mid.ID, mid[0].Seq, f.mid.ID)
	if f.b.CountIn(t, "outbox", where) != 1 || f.b.CountAll(t, fmt.Sprintf("id = '%s'", f.mid.ID)) != 1 {
		t.Fatal("replayed row is not moved to pending, due, with its seq, dedup key and last error and attempts reset")
	}
	if f.b.CountIn(t, "outbox_dead", fmt.Sprintf("id = '%s'", f.old.ID)) != 1 {
		t.Fatal("the older match was replayed too")
	}
	st, err := f.b.Driver.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Dead != 2 || st.Pending != 2 || st.Retrying != 1 {
		t.Fatalf("after replay: dead %d pending %d retrying %d; want 2, 2, 1", st.Dead, st.Pending, st.Retrying)
	}
}

func TestDeadPurgeDeletesOnlyMatches(t *testing.T) {
	t.Parallel()
	f := newDeadFixture(t)
	ctx := context.Background()

	for _, empty := range []outbox.DeadFilter{{}, {Limit: 5}} {
		if _, err := f.b.Driver.DeadPurge(ctx, empty); !errors.Is(err, outboxpgx.ErrEmptyDeadFilter) {
			t.Fatalf("purge with %+v: got %v, want ErrEmptyDeadFilter", empty, err)
		}
	}
	if n := f.b.CountIn(t, "outbox_dead", "true"); n != 3 {
		t.Fatalf("refused purge deleted rows: %d dead left", n)
	}

	n, err := f.b.Driver.DeadPurge(ctx, outbox.DeadFilter{ErrorContains: "timeout"})
	if err != nil || n != 1 {
		t.Fatalf("purge by error: %d, %v; want 1", n, err)
	}
	if f.b.CountAll(t, fmt.Sprintf("id = '%s'", f.mid.ID)) != 0 {
		t.Fatal("matching dead letter still there")
	}
	if f.b.CountIn(t, "outbox", fmt.Sprintf("id = '%s'", f.pending.ID)) != 1 {
		t.Fatal("a pending message with a matching error was deleted")
	}
	// The dedup key stays taken: the retention cleanup releases it later.
	if f.b.CountIn(t, "outbox_dedup", fmt.Sprintf("dedup_key = '%s'", f.mid.ID)) != 1 {
		t.Fatal("purge released the dedup key at once")
	}

	n, err = f.b.Driver.DeadPurge(ctx, outbox.DeadFilter{Key: "k1", Limit: 1})
	if err != nil || n != 1 {
		t.Fatalf("purge with limit: %d, %v; want 1", n, err)
	}
	if f.b.CountIn(t, "outbox_dead", fmt.Sprintf("id = '%s'", f.old.ID)) != 1 {
		t.Fatal("limit 1 purged the older match, want the newest")
	}

	published := msg("orders", "k1")
	f.b.Write(t, published)
	f.b.MarkPublished(t, published.ID)
	n, err = f.b.Driver.DeadPurgeAll(ctx)
	if err != nil || n != 1 {
		t.Fatalf("purge all: %d, %v; want 1", n, err)
	}
	if f.b.CountAll(t, "true") != 2 || f.b.CountIn(t, "outbox", "true") != 1 || f.b.CountIn(t, "outbox_published", "true") != 1 {
		t.Fatal("purge all touched a pending or published message")
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
	if _, err := drv.DeadList(ctx, outbox.DeadFilter{}); err == nil {
		t.Fatal("DeadList without a pool: no error")
	}
	if _, err := drv.DeadReplay(ctx, outbox.DeadFilter{}); err == nil {
		t.Fatal("DeadReplay without a pool: no error")
	}
	if _, err := drv.DeadPurgeAll(ctx); err == nil {
		t.Fatal("DeadPurgeAll without a pool: no error")
	}
}
