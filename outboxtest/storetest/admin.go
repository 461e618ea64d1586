package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxtest"
)

// This file is the outboxdriver.Admin part of the suite. It sets its rows up through the Store
// seam, as a relay would (a message dies by a Failure with Dead set), so it holds for any
// store, whatever its tables look like.

func adminOf(o Outbox) outboxdriver.Admin { return o.Store.(outboxdriver.Admin) }

// msg is a message with an ID chosen up front, so the tests can find it again.
func msg(topic, key string) outbox.Message {
	return outbox.Message{ID: outbox.NewID(), Topic: topic, Key: key, Payload: []byte(`{}`)}
}

func idsOf(dls []outboxdriver.DeadLetter) []outbox.ID {
	out := make([]outbox.ID, len(dls))
	for i, dl := range dls {
		out[i] = dl.ID
	}
	return out
}

// fetchByID fetches every message relay can see with leases, by ID.
func fetchByID(t *testing.T, o Outbox, relay string, leases []outboxdriver.Lease) map[outbox.ID]*outbox.Message {
	t.Helper()
	out := map[outbox.ID]*outbox.Message{}
	for _, m := range fetch(t, o, relay, leases, outboxdriver.FetchRequest{}) {
		out[m.ID] = m
	}
	return out
}

// fail records a rejected attempt of each of ms through the Store seam: a retry due
// after delay, or a dead letter when dead is set.
func fail(t *testing.T, o Outbox, relay string, leases []outboxdriver.Lease, errText string, delay time.Duration, dead bool, ms ...*outbox.Message) {
	t.Helper()
	var c outboxdriver.Completion
	for _, m := range ms {
		c.Failed = append(c.Failed, outboxdriver.Failure{Outcome: outboxdriver.Outcome{Seq: m.Seq, Token: tokenOf(t, leases, m.Shard)}, Error: errText, Delay: delay, Dead: dead})
	}
	if refused := complete(t, o, relay, c); len(refused) != 0 {
		t.Fatalf("failures of seqs %v refused", refused)
	}
}

func deadList(t *testing.T, o Outbox, f outboxdriver.DeadFilter) []outboxdriver.DeadLetter {
	t.Helper()
	ctx, cancel := testenv.CallContext()
	defer cancel()
	got, err := adminOf(o).DeadList(ctx, f)
	if err != nil {
		t.Fatalf("DeadList(%v): %v", f, err)
	}
	return got
}

func deadCount(t *testing.T, o Outbox, f outboxdriver.DeadFilter) int {
	t.Helper()
	ctx, cancel := testenv.CallContext()
	defer cancel()
	n, err := adminOf(o).DeadCount(ctx, f)
	if err != nil {
		t.Fatalf("DeadCount(%v): %v", f, err)
	}
	return n
}

// dedupTaken reports whether writing a message with key as its dedup key is refused as a
// duplicate. When it is not, the probe message is written: the test fails anyway.
func dedupTaken(t *testing.T, o Outbox, key string) bool {
	t.Helper()
	m := msg("probe", "probe")
	m.DedupKey = key
	err := o.Write(testenv.Context(t), []outbox.Message{m}, false) // Outbox.Write reports Write's error only when it commits
	if err != nil && !errors.Is(err, outbox.ErrDuplicate) {
		t.Fatalf("write probing dedup key %q: %v", key, err)
	}
	return err != nil
}

// deadFixture is three dead letters, dead-lettered in this order, next to a pending
// message that failed with an error the filters would match and a published message, so
// that a filter leaking into live rows shows. The errors hold %, _ and ! so that a LIKE
// pattern built without escaping matches more.
type deadFixture struct {
	leases           []outboxdriver.Lease // relay "r1"'s, every shard
	old, mid, recent outboxdriver.DeadLetter
	pending          *outbox.Message // orders/k3, backing off for an hour after one attempt
	published        *outbox.Message // orders/k4
	written          outbox.Message  // old as written
}

func newDeadFixture(t *testing.T, o Outbox) *deadFixture {
	t.Helper()
	old, mid, recent, pending, pub := msg("orders", "k1"), msg("orders", "k2"), msg("billing", "k1"), msg("orders", "k3"), msg("orders", "k4")
	old.DedupKey = "order-k1-placed"
	old.EventType, old.AggregateType, old.ContentType = "order.placed", "order", "text/plain"
	old.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	old.Payload = []byte("plain text")
	write(t, o, []outbox.Message{old, mid, recent, pending, pub})

	f := &deadFixture{written: old}
	f.leases = sync(t, o, "r1", ttl, nil, nil).Held
	got := fetchByID(t, o, "r1", f.leases)
	if len(got) != 5 {
		t.Fatalf("fetched %d messages, want the 5 written", len(got))
	}
	f.pending, f.published = got[pending.ID], got[pub.ID]
	complete(t, o, "r1", published(t, o, f.leases, f.published))
	fail(t, o, "r1", f.leases, "publish timeout 100% full_disk Schema", time.Hour, false, f.pending)
	for i, dead := range []struct {
		m   outbox.Message
		err string
	}{{old, "disk 100% full_disk"}, {mid, "publish timeout after 10s for ack"}, {recent, "Schema mismatch: field x in all/data"}} {
		if i > 0 {
			time.Sleep(5 * time.Millisecond) // the store's clock moves on between dead letters: SQLite's counts milliseconds (time, not work)
		}
		fail(t, o, "r1", f.leases, dead.err, 0, true, got[dead.m.ID])
	}
	all := deadList(t, o, outboxdriver.DeadFilter{})
	if !slices.Equal(idsOf(all), []outbox.ID{recent.ID, mid.ID, old.ID}) {
		t.Fatalf("dead letters %v, want %v newest first", idsOf(all), []outbox.ID{recent.ID, mid.ID, old.ID})
	}
	f.recent, f.mid, f.old = all[0], all[1], all[2]
	if !f.old.DeadAt.Before(f.mid.DeadAt) || !f.mid.DeadAt.Before(f.recent.DeadAt) {
		t.Fatalf("dead_at %v, %v, %v of messages dead-lettered in this order, with time between: want them increasing",
			f.old.DeadAt, f.mid.DeadAt, f.recent.DeadAt)
	}
	return f
}

// adminStatusCountsEveryState checks Status on an outbox with messages in every state,
// over three topics, with two relays.
func adminStatusCountsEveryState(t *testing.T, o Outbox) {
	due1, due2, delayed, pub1, pub2 := msg("orders", "o1"), msg("orders", "o2"), msg("orders", "o3"), msg("orders", "o4"), msg("orders", "o5")
	delayed.DeliverAt = time.Now().Add(time.Hour)
	before := time.Now()
	write(t, o, []outbox.Message{due1, due2, delayed, pub1, pub2})
	written := time.Now() // due1 was written between before and written
	retryDue, retryLater, dead1 := msg("billing", "b1"), msg("billing", "b2"), msg("billing", "b3")
	dead2, pub3 := msg("shipping", "s1"), msg("shipping", "s2")
	write(t, o, []outbox.Message{retryDue, retryLater, dead1, dead2, pub3})

	r1 := sync(t, o, "r1", ttl, nil, nil)
	got := fetchByID(t, o, "r1", r1.Held)
	if len(got) != 9 {
		t.Fatalf("fetched %d messages, want the 9 due", len(got))
	}
	complete(t, o, "r1", published(t, o, r1.Held, got[pub1.ID], got[pub2.ID], got[pub3.ID]))
	fail(t, o, "r1", r1.Held, "nack", 0, false, got[retryDue.ID])
	fail(t, o, "r1", r1.Held, "nack", time.Hour, false, got[retryLater.ID])
	fail(t, o, "r1", r1.Held, "nack", 0, true, got[dead1.ID], got[dead2.ID])
	r2 := sync(t, o, "r2", ttl, nil, nil) // live, holding nothing: r1 holds every shard

	asked := time.Now()
	st := status(t, o)
	answered := time.Now()
	// pending: due1, due2, delayed, retryDue, retryLater.
	// Both dead letters came just now: in the last hour.
	type counts struct{ Pending, Due, Retrying, Delayed, Dead, DeadLastHour, Published int64 }
	if c, want := (counts{st.Pending, st.Due, st.Retrying, st.Delayed, st.Dead, st.DeadLastHour, st.Published}), (counts{5, 3, 2, 2, 2, 2, 3}); c != want {
		t.Errorf("counts %+v, want %+v", c, want)
	}
	wantTopics := []outboxdriver.TopicStatus{
		{Topic: "billing", Pending: 2, Due: 1, Retrying: 2, Dead: 1, DeadLastHour: 1},
		{Topic: "orders", Pending: 3, Due: 2, Retrying: 0, Dead: 0},
		{Topic: "shipping", Pending: 0, Due: 0, Retrying: 0, Dead: 1, DeadLastHour: 1},
	}
	if len(st.Topics) != len(wantTopics) {
		t.Fatalf("topics %+v, want billing, orders, shipping", st.Topics)
	}
	ages := map[string]time.Duration{}
	for i, w := range wantTopics {
		g := st.Topics[i]
		ages[g.Topic], g.OldestPendingAge = g.OldestPendingAge, 0
		if g != w {
			t.Errorf("topic %d: %+v, want %+v", i, g, w)
		}
	}
	// Ages are in the store's time, which runs as fast as ours: due1's is at least the
	// time from its write's end to Status's call, at most from its write's start to
	// Status's return (with 5 ms for a clock that counts milliseconds).
	lo, hi := asked.Sub(written)-5*time.Millisecond, answered.Sub(before)+5*time.Millisecond
	if st.OldestPendingAge < lo || st.OldestPendingAge > hi || st.OldestPendingAge != ages["orders"] {
		t.Errorf("oldest pending age %v (orders %v), want orders' and between %v and %v", st.OldestPendingAge, ages["orders"], lo, hi)
	}
	if ages["billing"] < 0 || ages["billing"] > ages["orders"] || ages["shipping"] != 0 {
		t.Errorf("topic ages %v: want billing's within [0, orders'] and 0 for shipping, which has nothing pending", ages)
	}

	if st.Shards != r1.Shards || st.ShardsLeased != r1.Shards {
		t.Errorf("shards %d, %d leased; want %d, all leased", st.Shards, st.ShardsLeased, r1.Shards)
	}
	relays := map[string]outboxdriver.RelayInfo{}
	for _, r := range st.Relays {
		relays[r.ID] = r
	}
	if len(st.Relays) != 2 || len(relays) != 2 {
		t.Fatalf("relays %+v, want r1 and r2", st.Relays)
	}
	if r := relays["r1"]; !r.Live || r.Shards != len(r1.Held) || r.Hostname != "test" || r.PID != 1 || r.StartedAt.IsZero() || r.HeartbeatAt.IsZero() {
		t.Errorf("relay r1: %+v, want live with %d shards, host test, pid 1", r, len(r1.Held))
	}
	if r := relays["r2"]; !r.Live || r.Shards != len(r2.Held) || r.Shards != 0 {
		t.Errorf("relay r2: %+v, want live with no shard", r)
	}
}

// adminStatusEmptyOutbox checks Status and the dead-letter calls on an outbox that
// holds nothing.
func adminStatusEmptyOutbox(t *testing.T, o Outbox) {
	st := status(t, o)
	if st.Pending != 0 || st.Due != 0 || st.Retrying != 0 || st.Delayed != 0 || st.Dead != 0 || st.Published != 0 || st.OldestPendingAge != 0 || st.ShardsLeased != 0 {
		t.Errorf("empty outbox: %+v", st)
	}
	// Empty, not nil, so that JSON shows [] rather than null.
	if st.Topics == nil || len(st.Topics) != 0 || st.Relays == nil || len(st.Relays) != 0 {
		t.Errorf("empty outbox: topics %#v, relays %#v; want both empty and not nil", st.Topics, st.Relays)
	}
	if dls := deadList(t, o, outboxdriver.DeadFilter{}); len(dls) != 0 {
		t.Errorf("DeadList of an empty outbox: %v", idsOf(dls))
	}
	if n := deadCount(t, o, outboxdriver.DeadFilter{}); n != 0 {
		t.Errorf("DeadCount of an empty outbox: %d", n)
	}
	ctx := testenv.Context(t)
	if n, err := adminOf(o).DeadReplay(ctx, outboxdriver.DeadFilter{}); err != nil || n != 0 {
		t.Errorf("DeadReplay of an empty outbox: %d, %v", n, err)
	}
	if n, err := adminOf(o).DeadPurgeAll(ctx); err != nil || n != 0 {
		t.Errorf("DeadPurgeAll of an empty outbox: %d, %v", n, err)
	}
	if l := sync(t, o, "r1", ttl, nil, nil); st.Shards != l.Shards {
		t.Errorf("status of an empty outbox says %d shards, SyncLeases %d", st.Shards, l.Shards)
	}
}

// adminDeadListFilters checks each DeadFilter field of DeadList and DeadCount, alone
// and together, and that a dead letter is read back whole.
func adminDeadListFilters(t *testing.T, o Outbox) {
	f := newDeadFixture(t, o)
	old, mid, recent := f.old.ID, f.mid.ID, f.recent.ID
	east := time.FixedZone("east", 5*3600)
	cases := []struct {
		name   string
		filter outboxdriver.DeadFilter
		want   []outbox.ID
	}{
		{"all, newest first", outboxdriver.DeadFilter{}, []outbox.ID{recent, mid, old}},
		{"topic", outboxdriver.DeadFilter{Topic: "orders"}, []outbox.ID{mid, old}},
		{"key", outboxdriver.DeadFilter{Key: "k1"}, []outbox.ID{recent, old}},
		{"topic and key", outboxdriver.DeadFilter{Topic: "orders", Key: "k1"}, []outbox.ID{old}},
		{"ids, live ones ignored", outboxdriver.DeadFilter{IDs: []outbox.ID{mid, f.pending.ID, f.published.ID}}, []outbox.ID{mid}},
		{"one id", outboxdriver.DeadFilter{IDs: []outbox.ID{recent}}, []outbox.ID{recent}},
		{"error, any case", outboxdriver.DeadFilter{ErrorContains: "SCHEMA MISMATCH"}, []outbox.ID{recent}},
		{"error with % is literal", outboxdriver.DeadFilter{ErrorContains: "0% f"}, []outbox.ID{old}},
		{"error with _ is literal", outboxdriver.DeadFilter{ErrorContains: "l_d"}, []outbox.ID{old}},
		{"error % alone", outboxdriver.DeadFilter{ErrorContains: "%"}, []outbox.ID{old}},
		{"error ! escape char", outboxdriver.DeadFilter{ErrorContains: "!"}, nil},
		{"since, inclusive", outboxdriver.DeadFilter{Since: f.mid.DeadAt}, []outbox.ID{recent, mid}},
		{"until, exclusive", outboxdriver.DeadFilter{Until: f.mid.DeadAt}, []outbox.ID{old}},
		{"since and until, other zones", outboxdriver.DeadFilter{Since: f.old.DeadAt.In(east), Until: f.recent.DeadAt.UTC()}, []outbox.ID{mid, old}},
		{"since and topic", outboxdriver.DeadFilter{Since: f.mid.DeadAt, Topic: "billing"}, []outbox.ID{recent}},
		{"limit takes the newest", outboxdriver.DeadFilter{Limit: 2}, []outbox.ID{recent, mid}},
		{"limit after the filter", outboxdriver.DeadFilter{Topic: "orders", Limit: 1}, []outbox.ID{mid}},
		{"limit above the matches", outboxdriver.DeadFilter{Key: "k1", Limit: 10}, []outbox.ID{recent, old}},
		{"nothing matches", outboxdriver.DeadFilter{Topic: "nope"}, nil},
	}
	for _, tc := range cases {
		if got := idsOf(deadList(t, o, tc.filter)); !slices.Equal(got, tc.want) {
			t.Errorf("%s: DeadList = %v, want %v", tc.name, got, tc.want)
		}
		// At most Limit: what DeadReplay or DeadPurge would act on (the CLI's preview
		// counts on it).
		if n := deadCount(t, o, tc.filter); n != len(tc.want) {
			t.Errorf("%s: DeadCount = %d, want %d", tc.name, n, len(tc.want))
		}
	}

	// A dead letter comes back whole.
	dl, w := f.old, f.written
	if dl.Topic != w.Topic || dl.Key != w.Key || dl.EventType != w.EventType || dl.AggregateType != w.AggregateType ||
		dl.ContentType != w.ContentType || string(dl.Payload) != string(w.Payload) || dl.DedupKey != w.DedupKey ||
		len(dl.Headers) != 1 || dl.Headers["traceparent"] != w.Headers["traceparent"] {
		t.Errorf("dead letter %+v, want what was written: %+v", dl, w)
	}
	if dl.Attempts != 1 || dl.LastError != "disk 100% full_disk" || dl.Seq == 0 || dl.CreatedAt.IsZero() || dl.DeadAt.Before(dl.CreatedAt) {
		t.Errorf("dead letter %+v: want 1 attempt, its error, a seq, and dead at or after it was created", dl)
	}
}

// adminDeadReplaySameIdentity dead-letters messages through the Store seam, replays
// some, and runs a relay: it publishes them with the identity they were written with.
func adminDeadReplaySameIdentity(t *testing.T, o Outbox) {
	const rejection = `rejected: schema registry says "no" {at, \ all}`
	a1, a2, other := msg("orders", "a"), msg("orders", "a"), msg("billing", "b")
	a1.DedupKey = "order-a-placed"
	a2.Payload = []byte(`{"n":2}`)
	write(t, o, []outbox.Message{a1, a2, other})
	st := sync(t, o, "r1", ttl, nil, nil)
	got := fetchByID(t, o, "r1", st.Held)
	fail(t, o, "r1", st.Held, rejection, 0, true, got[a1.ID], got[a2.ID], got[other.ID])
	if s := status(t, o); s.Pending != 0 || s.Dead != 3 {
		t.Fatalf("after dead-lettering all three: %d pending, %d dead; want 0, 3 (dead letters move)", s.Pending, s.Dead)
	}
	for _, dl := range deadList(t, o, outboxdriver.DeadFilter{}) {
		if dl.Attempts != 1 || dl.LastError != rejection || dl.DeadAt.IsZero() || dl.Seq != got[dl.ID].Seq {
			t.Errorf("dead letter %+v: want 1 attempt, the error, a dead time, and seq %d", dl, got[dl.ID].Seq)
		}
	}
	sync(t, o, "r1", 0, nil, st.Held) // r1 leaves: the relay below takes every shard

	ctx := testenv.Context(t)
	if n, err := adminOf(o).DeadReplay(ctx, outboxdriver.DeadFilter{Topic: "orders"}); err != nil || n != 2 {
		t.Fatalf("DeadReplay of the orders: %d, %v; want 2", n, err)
	}
	pub := &outboxtest.Publisher{}
	r, err := outbox.NewRelay(o.Store, pub, outbox.RelayConfig{ID: "replayed", PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(testenv.Context(t)) }) // on a failure below; stopping twice is safe
	sent := pub.Await(t, 2)
	for i, w := range []outbox.Message{a1, a2} {
		m := sent[i]
		if m.ID != w.ID || m.DedupKey != got[w.ID].DedupKey || m.Seq != got[w.ID].Seq || m.Attempts != 0 || string(m.Payload) != string(w.Payload) {
			t.Errorf("published %d: id %v dedup key %q seq %d attempts %d payload %s; want %v %q %d 0 %s (written order, same identity)",
				i, m.ID, m.DedupKey, m.Seq, m.Attempts, m.Payload, w.ID, got[w.ID].DedupKey, got[w.ID].Seq, w.Payload)
		}
	}
	testenv.Await(t, "the replayed messages recorded as published", func() (any, bool) {
		s := status(t, o)
		return fmt.Sprintf("%d pending, %d dead, %d published", s.Pending, s.Dead, s.Published), s.Pending == 0 && s.Published == 2
	})
	if err := r.Stop(testenv.Context(t)); err != nil {
		t.Errorf("stop relay: %v", err)
	}
	if s := status(t, o); s.Pending != 0 || s.Dead != 1 || s.Published != 2 {
		t.Errorf("status %+v, want 0 pending, 1 dead, 2 published: replay moves rows, it does not copy them", s)
	}
	if left := idsOf(deadList(t, o, outboxdriver.DeadFilter{})); !slices.Equal(left, []outbox.ID{other.ID}) {
		t.Errorf("dead letters left %v, want only %v", left, other.ID)
	}
	if n, err := adminOf(o).DeadReplay(testenv.Context(t), outboxdriver.DeadFilter{Topic: "orders"}); err != nil || n != 0 {
		t.Errorf("second DeadReplay of the orders: %d, %v; want 0", n, err)
	}
	if !dedupTaken(t, o, "order-a-placed") {
		t.Error("the replayed message's dedup key is free again: a replay must keep it")
	}
	if pub.Attempts() != 2 {
		t.Errorf("%d publish attempts, want the 2 replayed messages once each", pub.Attempts())
	}
}

// adminDeadReplayLimitAndState replays the newest match only, and checks the state it
// leaves: pending, due at once, attempts reset, seq, dedup key and last error kept.
func adminDeadReplayLimitAndState(t *testing.T, o Outbox) {
	f := newDeadFixture(t, o)
	ctx := testenv.Context(t)
	if n, err := adminOf(o).DeadReplay(ctx, outboxdriver.DeadFilter{IDs: []outbox.ID{f.pending.ID, f.published.ID}}); err != nil || n != 0 {
		t.Errorf("DeadReplay of a pending and a published message: %d, %v; want 0", n, err)
	}
	if n, err := adminOf(o).DeadReplay(ctx, outboxdriver.DeadFilter{Topic: "orders", Limit: 1}); err != nil || n != 1 {
		t.Fatalf("DeadReplay of the newest order: %d, %v; want 1", n, err)
	}
	if left := idsOf(deadList(t, o, outboxdriver.DeadFilter{})); !slices.Equal(left, []outbox.ID{f.recent.ID, f.old.ID}) {
		t.Errorf("dead letters left %v, want %v: limit 1 replays the newest match", left, []outbox.ID{f.recent.ID, f.old.ID})
	}
	got := fetch(t, o, "r1", f.leases, outboxdriver.FetchRequest{})
	if len(got) != 1 || got[0].ID != f.mid.ID {
		t.Fatalf("fetched %d messages (%v), want only the replayed one, due at once", len(got), payloads(got))
	}
	m := got[0]
	if m.Seq != f.mid.Seq || m.DedupKey != f.mid.DedupKey || m.Attempts != 0 || m.LastError != f.mid.LastError || m.Topic != "orders" || m.Key != "k2" {
		t.Errorf("replayed message %+v: want seq %d, dedup key %q, 0 attempts, last error %q kept", m, f.mid.Seq, f.mid.DedupKey, f.mid.LastError)
	}
	if s := status(t, o); s.Dead != 2 || s.Pending != 2 || s.Due != 1 || s.Retrying != 1 {
		t.Errorf("after replay: dead %d pending %d due %d retrying %d; want 2, 2, 1, 1", s.Dead, s.Pending, s.Due, s.Retrying)
	}
}

// adminDeadPurgeOnlyMatches purges by filter, then all: only the matches go, never a
// live message, and a purged message's dedup key stays taken.
func adminDeadPurgeOnlyMatches(t *testing.T, o Outbox) {
	f := newDeadFixture(t, o)
	a := adminOf(o)
	ctx := testenv.Context(t)
	for _, empty := range []outboxdriver.DeadFilter{{}, {Limit: 5}} {
		if n, err := a.DeadPurge(ctx, empty); !errors.Is(err, outboxdriver.ErrEmptyDeadFilter) || n != 0 {
			t.Errorf("DeadPurge(%+v) = %d, %v; want ErrEmptyDeadFilter", empty, n, err)
		}
	}
	if n := deadCount(t, o, outboxdriver.DeadFilter{}); n != 3 {
		t.Fatalf("%d dead letters after refused purges, want 3", n)
	}
	if n, err := a.DeadPurge(ctx, outboxdriver.DeadFilter{Topic: "orders", Limit: 1}); err != nil || n != 1 {
		t.Fatalf("DeadPurge of the newest order: %d, %v; want 1", n, err)
	}
	if left := idsOf(deadList(t, o, outboxdriver.DeadFilter{})); !slices.Equal(left, []outbox.ID{f.recent.ID, f.old.ID}) {
		t.Errorf("after purging the newest order, dead letters %v; want %v", left, []outbox.ID{f.recent.ID, f.old.ID})
	}
	if n, err := a.DeadPurge(ctx, outboxdriver.DeadFilter{ErrorContains: "full_disk"}); err != nil || n != 1 {
		t.Fatalf("DeadPurge by error: %d, %v; want 1", n, err)
	}
	if left := idsOf(deadList(t, o, outboxdriver.DeadFilter{})); !slices.Equal(left, []outbox.ID{f.recent.ID}) {
		t.Errorf("after purging by error, dead letters %v; want %v", left, []outbox.ID{f.recent.ID})
	}
	if s := status(t, o); s.Pending != 1 || s.Retrying != 1 || s.Published != 1 {
		t.Errorf("status %+v: want the pending message whose error matched, and the published one, untouched", s)
	}
	// The retention cleanup releases a purged message's dedup key later, not the purge.
	if !dedupTaken(t, o, f.old.DedupKey) || !dedupTaken(t, o, f.mid.DedupKey) {
		t.Error("a purge released a dedup key at once")
	}
	if n, err := a.DeadPurgeAll(ctx); err != nil || n != 1 {
		t.Fatalf("DeadPurgeAll: %d, %v; want 1", n, err)
	}
	if s := status(t, o); s.Dead != 0 || s.Pending != 1 || s.Published != 1 {
		t.Errorf("after DeadPurgeAll: %+v; want 0 dead and the live messages untouched", s)
	}
	if n, err := a.DeadPurgeAll(ctx); err != nil || n != 0 {
		t.Errorf("second DeadPurgeAll: %d, %v; want 0", n, err)
	}
}

// adminDeadFilterValidated checks that every dead-letter call refuses an invalid filter
// with DeadFilter.Validate's error, naming the field, before it changes anything.
func adminDeadFilterValidated(t *testing.T, o Outbox) {
	m := msg("t", "k")
	write(t, o, []outbox.Message{m})
	st := sync(t, o, "r1", ttl, nil, nil)
	fail(t, o, "r1", st.Held, "no", 0, true, fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{})...)
	now := time.Now()
	filters := []struct {
		field string
		f     outboxdriver.DeadFilter
	}{
		{"DeadFilter.Limit", outboxdriver.DeadFilter{Topic: "t", Limit: -1}},
		{"DeadFilter.Topic", outboxdriver.DeadFilter{Topic: "t\x00"}},
		{"DeadFilter.Key", outboxdriver.DeadFilter{Key: "k\xff"}},
		{"DeadFilter.ErrorContains", outboxdriver.DeadFilter{ErrorContains: "no\x00"}},
		{"DeadFilter.Since", outboxdriver.DeadFilter{Topic: "t", Since: now, Until: now.Add(-time.Hour)}},
	}
	a := adminOf(o)
	calls := []struct {
		name string
		call func(outboxdriver.DeadFilter) error
	}{
		{"DeadList", func(f outboxdriver.DeadFilter) error { _, err := a.DeadList(testenv.Context(t), f); return err }},
		{"DeadCount", func(f outboxdriver.DeadFilter) error { _, err := a.DeadCount(testenv.Context(t), f); return err }},
		{"DeadReplay", func(f outboxdriver.DeadFilter) error { _, err := a.DeadReplay(testenv.Context(t), f); return err }},
		{"DeadPurge", func(f outboxdriver.DeadFilter) error { _, err := a.DeadPurge(testenv.Context(t), f); return err }},
	}
	for _, c := range calls {
		for _, tc := range filters {
			err := c.call(tc.f)
			var ce *outbox.ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field || !errors.Is(err, outbox.ErrInvalidConfig) {
				t.Errorf("%s(%+v) = %v; want a *ConfigError naming %s", c.name, tc.f, err, tc.field)
			}
		}
	}
	if dls := deadList(t, o, outboxdriver.DeadFilter{}); len(dls) != 1 || dls[0].ID != m.ID {
		t.Errorf("dead letters %v after invalid filters, want %v untouched", idsOf(dls), m.ID)
	}
}
