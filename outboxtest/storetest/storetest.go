// Package storetest is the test suite every outbox store must pass, run against its real
// database. The stores of this module run it in their tests (outboxpgx, outboxsql,
// outboxsqlite, outboxmysql); a new store proves itself the same way:
//
//	func TestStoreConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storetest.Outbox { ... a fresh, migrated outbox ... })
//	}
//
// It drives the outboxdriver.Store seam directly, as a relay does, and then runs relays on
// it: write and rollback visibility, shard leases and their takeover in database time,
// fencing of a relay that lost its lease, per-key order and blocking, retries with
// backoff, dead letters and their replay, dedup keys, and retention; and the operator's
// side, outboxdriver.Admin: status counts, dead-letter filters, replay and purge (admin.go).
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxtest"
)

// Outbox is one fresh, migrated, empty outbox, as a store's test gives it to the suite.
type Outbox struct {
	// Store is the store under test. It must implement outboxdriver.Admin too.
	Store outboxdriver.Store

	// Write writes msgs in one new transaction with the store's write driver, and
	// commits it, or rolls it back when rollback is set. It returns Write's error (a
	// *outbox.DuplicateError leaves the transaction usable: Write commits it anyway).
	Write func(ctx context.Context, msgs []outbox.Message, rollback bool) error

	// WriteSavepoint writes kept in a transaction, then rolledBack inside a savepoint
	// that it rolls back, then commits. Nil skips the savepoint test.
	WriteSavepoint func(ctx context.Context, kept, rolledBack []outbox.Message) error
}

// Run runs the suite as subtests of t. open returns a fresh outbox for each subtest.
func Run(t *testing.T, open func(t *testing.T) Outbox) {
	tests := []struct {
		name string
		fn   func(t *testing.T, o Outbox)
	}{
		{"CommitVisibleRollbackNot", commitVisibleRollbackNot},
		{"SavepointRollback", savepointRollback},
		{"FetchOrderAndLimit", fetchOrderAndLimit},
		{"FetchOnlyHeldShards", fetchOnlyHeldShards},
		{"FetchContinuation", fetchContinuation},
		{"FetchPriority", fetchPriority},
		{"LeasesFairShare", leasesFairShare},
		{"LeasesOfOneFingerprint", leasesOfOneFingerprint},
		{"RelayDestinationStates", relayDestinationStates},
		{"HistoryInPublicationOrder", historyInPublicationOrder},
		{"ReplayJobsRecorded", replayJobsRecorded},
		{"LeaseTakeoverInDatabaseTime", leaseTakeover},
		{"LeaseAdoptionFencesEarlierProcess", leaseAdoption},
		{"FencedComplete", fencedComplete},
		{"RetryBackoffBlocksKey", retryBackoffBlocksKey},
		{"DeliverAtBlocksKey", deliverAtBlocksKey},
		{"DeferredCountsNoAttempt", deferredCountsNoAttempt},
		{"DeadLetterAndReplay", deadLetterAndReplay},
		{"DedupKey", dedupKey},
		{"GeneratedIDsClaimNothing", generatedIDsClaimNothing},
		{"Retention", retention},
		{"RelaysDrainInOrder", relaysDrainInOrder},
		{"AdminStatusCountsEveryState", adminStatusCountsEveryState},
		{"AdminStatusEmptyOutbox", adminStatusEmptyOutbox},
		{"AdminDeadListFilters", adminDeadListFilters},
		{"AdminDeadReplaySameIdentity", adminDeadReplaySameIdentity},
		{"AdminDeadReplayLimitAndState", adminDeadReplayLimitAndState},
		{"AdminDeadPurgeOnlyMatches", adminDeadPurgeOnlyMatches},
		{"AdminDeadFilterValidated", adminDeadFilterValidated},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := open(t)
			if _, ok := o.Store.(outboxdriver.Admin); !ok {
				t.Fatalf("%T does not implement outboxdriver.Admin", o.Store)
			}
			tc.fn(t, o)
		})
	}
}

func msgs(topic string, keys, perKey int) []outbox.Message {
	var out []outbox.Message
	for i := range perKey {
		for k := range keys {
			key := "k" + strconv.Itoa(k)
			out = append(out, outbox.Message{Topic: topic, Key: key, EventType: "e",
				Payload: fmt.Appendf(nil, `{"key":%q,"n":%d}`, key, i)})
		}
	}
	return out
}

func write(t *testing.T, o Outbox, ms []outbox.Message) {
	t.Helper()
	ctx, cancel := testenv.CallContext()
	defer cancel()
	if err := o.Write(ctx, ms, false); err != nil {
		t.Fatalf("write: %v", err)
	}
}

func sync(t *testing.T, o Outbox, relay string, ttl time.Duration, held, release []outboxdriver.Lease) outboxdriver.LeaseState {
	t.Helper()
	ctx, cancel := testenv.CallContext()
	defer cancel()
	st, err := o.Store.SyncLeases(ctx, outboxdriver.LeaseRequest{RelayID: relay, Hostname: "test", PID: 1, TTL: ttl, Held: held, Release: release})
	if err != nil {
		t.Fatalf("SyncLeases(%s): %v", relay, err)
	}
	return st
}

func fetch(t *testing.T, o Outbox, relay string, leases []outboxdriver.Lease, req outboxdriver.FetchRequest) []*outbox.Message {
	t.Helper()
	req.RelayID, req.Leases = relay, leases
	if req.Limit == 0 {
		req.Limit = 10_000
	}
	ctx, cancel := testenv.CallContext() // fetch also serves polls: no context outlives its call
	defer cancel()
	got, err := o.Store.Fetch(ctx, req)
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	return got
}

func complete(t *testing.T, o Outbox, relay string, c outboxdriver.Completion) []int64 {
	t.Helper()
	c.RelayID = relay
	ctx, cancel := testenv.CallContext()
	defer cancel()
	refused, err := o.Store.Complete(ctx, c)
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	return refused
}

// tokenOf returns the token of shard's lease among leases.
func tokenOf(t *testing.T, leases []outboxdriver.Lease, shard int) int64 {
	t.Helper()
	for _, l := range leases {
		if l.Shard == shard {
			return l.Token
		}
	}
	t.Fatalf("no lease on shard %d among %v", shard, leases)
	return 0
}

func published(t *testing.T, o Outbox, leases []outboxdriver.Lease, ms ...*outbox.Message) outboxdriver.Completion {
	var c outboxdriver.Completion
	for _, m := range ms {
		c.Published = append(c.Published, outboxdriver.Outcome{Seq: m.Seq, Token: tokenOf(t, leases, m.Shard)})
	}
	return c
}

func payloads(ms []*outbox.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = string(m.Payload)
	}
	return out
}

func status(t *testing.T, o Outbox) outboxdriver.Status {
	t.Helper()
	ctx, cancel := testenv.CallContext()
	defer cancel()
	st, err := o.Store.(outboxdriver.Admin).Status(ctx)
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	return st
}

// ttl is the lease TTL of relays that must keep their leases for a whole test, however
// slow the machine.
const ttl = 10 * time.Minute

func commitVisibleRollbackNot(t *testing.T, o Outbox) {
	committed := msgs("c", 3, 2)
	write(t, o, committed)
	if err := o.Write(testenv.Context(t), msgs("r", 3, 2), true); err != nil {
		t.Fatalf("write to roll back: %v", err)
	}
	st := sync(t, o, "r1", ttl, nil, nil)
	got := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{})
	if len(got) != len(committed) {
		t.Fatalf("fetched %d messages, want the %d committed: %v", len(got), len(committed), payloads(got))
	}
	for i, m := range got {
		if m.Topic != "c" {
			t.Errorf("a rolled-back message was fetched: %+v", m)
		}
		if m.ID.IsZero() || m.DedupKey == "" || m.CreatedAt.IsZero() || m.ContentType != outbox.ContentTypeJSON {
			t.Errorf("message %d lacks what the store fills: %+v", i, m)
		}
		if m.Shard < 0 || m.Shard >= st.Shards {
			t.Errorf("message %d on shard %d of %d", i, m.Shard, st.Shards)
		}
	}
	if s := status(t, o); s.Pending != int64(len(committed)) {
		t.Errorf("status pending = %d, want %d", s.Pending, len(committed))
	}
}

func savepointRollback(t *testing.T, o Outbox) {
	if o.WriteSavepoint == nil {
		t.Skip("no savepoint writer")
	}
	if err := o.WriteSavepoint(testenv.Context(t), msgs("kept", 2, 1), msgs("gone", 2, 1)); err != nil {
		t.Fatal(err)
	}
	st := sync(t, o, "r1", ttl, nil, nil)
	got := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{})
	if len(got) != 2 || got[0].Topic != "kept" || got[1].Topic != "kept" {
		t.Fatalf("fetched %v, want the two messages outside the rolled-back savepoint", payloads(got))
	}
}

func fetchOrderAndLimit(t *testing.T, o Outbox) {
	in := msgs("t", 5, 4)
	in[3].Headers = map[string]string{"traceparent": "00-abc-def-01", "X-A": "b"}
	in[3].AggregateType = "agg"
	in[3].ContentType = "text/plain"
	in[3].Payload = []byte("plain text")
	write(t, o, in)
	st := sync(t, o, "r1", ttl, nil, nil)
	got := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{})
	if len(got) != len(in) {
		t.Fatalf("fetched %d, want %d", len(got), len(in))
	}
	for i := 1; i < len(got); i++ {
		if got[i].Seq <= got[i-1].Seq {
			t.Fatalf("not in seq order: %d after %d", got[i].Seq, got[i-1].Seq)
		}
	}
	for i, m := range got {
		if string(m.Payload) != string(in[i].Payload) || m.Key != in[i].Key {
			t.Fatalf("message %d: %q key %q, want %q key %q (write order)", i, m.Payload, m.Key, in[i].Payload, in[i].Key)
		}
	}
	m := got[3]
	if m.Headers["traceparent"] != "00-abc-def-01" || m.Headers["X-A"] != "b" || m.AggregateType != "agg" || m.ContentType != "text/plain" || m.EventType != "e" {
		t.Errorf("fields did not round-trip: %+v", m)
	}
	if lim := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{Limit: 7}); len(lim) != 7 || lim[0].Seq != got[0].Seq {
		t.Errorf("Limit 7 fetched %d", len(lim))
	}
	excl := []int64{got[0].Seq, got[1].Seq}
	rest := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{Exclude: excl})
	if len(rest) != len(got)-2 || slices.Contains(excl, rest[0].Seq) {
		t.Errorf("Exclude: fetched %d starting at seq %d", len(rest), rest[0].Seq)
	}
}

func fetchOnlyHeldShards(t *testing.T, o Outbox) {
	write(t, o, msgs("t", 50, 1))
	st := sync(t, o, "r1", ttl, nil, nil)
	all := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{})
	some := all[0].Shard
	var one []outboxdriver.Lease
	for _, l := range st.Held {
		if l.Shard == some {
			one = append(one, l)
		}
	}
	for _, m := range fetch(t, o, "r1", one, outboxdriver.FetchRequest{}) {
		if m.Shard != some {
			t.Fatalf("fetched a message of shard %d with a lease on shard %d only", m.Shard, some)
		}
	}
	if got := fetch(t, o, "other", st.Held, outboxdriver.FetchRequest{}); len(got) != 0 {
		t.Fatalf("a relay fetched %d messages with leases it does not hold", len(got))
	}
}

func fetchContinuation(t *testing.T, o Outbox) {
	write(t, o, msgs("t", 3, 2)) // k0 k1 k2 k0 k1 k2
	st := sync(t, o, "r1", ttl, nil, nil)
	all := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{})
	after := all[2].Seq // the relay holds the first three, one per key
	if got := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{After: after}); len(got) != 0 {
		t.Fatalf("continuation without Keys returned %v: their keys have older pending messages", payloads(got))
	}
	got := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{After: after, Keys: []string{"k1"}, KeySeqs: []int64{all[1].Seq}})
	if len(got) != 1 || got[0].Key != "k1" || got[0].Seq <= after {
		t.Fatalf("continuation with k1 held returned %v, want k1's second message", payloads(got))
	}
	write(t, o, []outbox.Message{{Topic: "t", Key: "fresh", Payload: []byte(`{}`)}})
	got = fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{After: after})
	if len(got) != 1 || got[0].Key != "fresh" {
		t.Fatalf("continuation returned %v, want the new key's message", payloads(got))
	}

	// The relay holds k2's first message, but k2 has another pending message at or below
	// the cursor that the relay does not hold (a transaction that committed after the
	// fetch that set the cursor): k2's newer messages must wait for it.
	write(t, o, []outbox.Message{{Topic: "t", Key: "k2", Payload: []byte(`{"late":true}`)}})
	later := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{})
	cursor := later[len(later)-1].Seq
	write(t, o, []outbox.Message{{Topic: "t", Key: "k2", Payload: []byte(`{"newest":true}`)}})
	k2 := []string{"k2"}
	if got := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{After: cursor, Keys: k2, KeySeqs: []int64{all[2].Seq}}); len(got) != 0 {
		t.Fatalf("continuation returned %v past k2's pending messages the relay does not hold", payloads(got))
	}
	if got := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{After: cursor, Keys: k2, KeySeqs: []int64{cursor}}); len(got) != 1 || string(got[0].Payload) != `{"newest":true}` {
		t.Fatalf("continuation with every older k2 message held returned %v, want the newest", payloads(got))
	}
}

// fetchPriority: a priority fetch returns the messages with a priority, highest first,
// each only behind earlier messages of its key that the relay handled (held up to
// Keys/KeySeqs) or that are due and of its priority: a key of one priority
// comes whole, a message behind an ordinary one, one of another priority or one delayed
// waits. A store that keeps no priorities refuses them at write time with
// outbox.ErrNoPriorities.
func fetchPriority(t *testing.T, o Outbox) {
	pm := func(key, name string, prio int) outbox.Message {
		return outbox.Message{Topic: "t", Key: key, Priority: prio, Payload: []byte(name)}
	}
	in := []outbox.Message{pm("a", "a0", 0), pm("b", "b0", 0), pm("c", "c3", 3), pm("a", "a7", 7), pm("", "none1", 1),
		pm("e", "e0-delayed", 0), pm("e", "e9", 9), pm("g", "g3a", 3), pm("g", "g3b", 3),
		pm("h", "h5", 5), pm("h", "h3", 3), pm("h", "h5b", 5)}
	in[5].DeliverAt = time.Now().Add(time.Hour)
	pf, ok := o.Store.(outboxdriver.PriorityFetcher)
	if !ok {
		ctx, cancel := testenv.CallContext()
		defer cancel()
		if err := o.Write(ctx, in, false); !errors.Is(err, outbox.ErrNoPriorities) {
			t.Fatalf("writing priorities to a store that keeps none: %v, want ErrNoPriorities", err)
		}
		t.Skip("the store keeps no priorities")
	}
	write(t, o, in)
	write(t, o, []outbox.Message{pm("f", "f2", 2)}) // a write of one message
	st := sync(t, o, "r1", ttl, nil, nil)
	seqOrder := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{})
	if want := `["a0" "b0" "c3" "a7" "none1" "g3a" "g3b" "h5" "h3" "h5b" "f2"]`; fmt.Sprintf("%q", payloads(seqOrder)) != want {
		t.Fatalf("Fetch returned %q, want %s: in seq order, whatever the priorities", payloads(seqOrder), want)
	}
	a0 := seqOrder[0].Seq
	// hold is the request of a relay holding, of key, the message seq (as in hand:
	// excluded, and held up to it), with an optional limit.
	hold := func(keys []string, seq int64, limit ...int) outboxdriver.FetchRequest {
		req := outboxdriver.FetchRequest{Exclude: []int64{seq}, Keys: keys, KeySeqs: []int64{seq}}
		if len(limit) > 0 {
			req.Limit = limit[0]
		}
		return req
	}
	byPriority := func(req outboxdriver.FetchRequest) string {
		t.Helper()
		req.RelayID, req.Leases = "r1", st.Held
		if req.Limit == 0 {
			req.Limit = 100
		}
		ctx, cancel := testenv.CallContext()
		defer cancel()
		got, err := pf.FetchPriority(ctx, req)
		if err != nil {
			t.Fatalf("FetchPriority: %v", err)
		}
		for _, m := range got {
			if m.Priority == 0 {
				t.Errorf("FetchPriority returned %s without its priority", m.Payload)
			}
		}
		return fmt.Sprintf("%q", payloads(got))
	}
	for _, c := range []struct {
		what string
		req  outboxdriver.FetchRequest
		want string
	}{
		{"nothing held: a7 waits for a0, e9 for the delayed e0, h3 and h5b for h5", outboxdriver.FetchRequest{},
			`["h5" "c3" "g3a" "g3b" "f2" "none1"]`},
		{"a0 excluded but not held: a7 still waits", outboxdriver.FetchRequest{Exclude: []int64{a0}}, `["h5" "c3" "g3a" "g3b" "f2" "none1"]`},
		{"a held up to a0", hold([]string{"a"}, a0), `["a7" "h5" "c3" "g3a" "g3b" "f2" "none1"]`},
		{"limit", hold([]string{"a"}, a0, 2), `["a7" "h5"]`},
		{"c3 in hand", hold([]string{"c"}, seqOrder[2].Seq), `["h5" "g3a" "g3b" "f2" "none1"]`},
		{"h5 in hand: h5b waits for h3", hold([]string{"h"}, seqOrder[7].Seq), `["c3" "g3a" "g3b" "h3" "f2" "none1"]`},
	} {
		if got := byPriority(c.req); got != c.want {
			t.Errorf("%s: FetchPriority returned %s, want %s", c.what, got, c.want)
		}
	}
	st0 := status(t, o)
	var pending int64
	for _, p := range st0.Priorities {
		pending += p.Pending
	}
	if len(st0.Priorities) == 0 || st0.Priorities[0].Priority != 9 || st0.Priorities[0].Pending != 1 || pending != st0.Pending {
		t.Errorf("status priorities %+v, want priority 9 first with 1 message, %d pending in all", st0.Priorities, st0.Pending)
	}
	if other := sync(t, o, "r2", ttl, nil, nil); len(other.Held) != 0 {
		t.Fatalf("r2 took %d shards while r1 holds them all", len(other.Held))
	}
	ctx, cancel := testenv.CallContext()
	defer cancel()
	if got, err := pf.FetchPriority(ctx, outboxdriver.FetchRequest{RelayID: "r2", Leases: st.Held, Limit: 100}); err != nil || len(got) != 0 {
		t.Fatalf("FetchPriority for a relay holding none of the leases: %q, %v; want nothing", payloads(got), err)
	}
}

func leasesFairShare(t *testing.T, o Outbox) {
	a := sync(t, o, "a", ttl, nil, nil)
	if a.Shards < 2 || len(a.Held) != a.Shards || a.Live != 1 || a.Target != a.Shards {
		t.Fatalf("a lone relay got %+v, want every shard", a)
	}
	b := sync(t, o, "b", ttl, nil, nil)
	if b.Live != 2 || b.Target != (a.Shards+1)/2 || len(b.Held) != 0 {
		t.Fatalf("second relay got %+v, want target half and nothing held while a holds all", b)
	}
	a = sync(t, o, "a", ttl, a.Held, a.Held[:a.Shards/2])
	if len(a.Held) != a.Shards-a.Shards/2 || a.Target != (a.Shards+1)/2 {
		t.Fatalf("after releasing half, a holds %d (target %d)", len(a.Held), a.Target)
	}
	b = sync(t, o, "b", ttl, nil, nil)
	if len(b.Held) != a.Shards/2 {
		t.Fatalf("b holds %d after a released %d", len(b.Held), a.Shards/2)
	}
	for _, l := range b.Held {
		if slices.ContainsFunc(a.Held, func(x outboxdriver.Lease) bool { return x.Shard == l.Shard }) {
			t.Fatalf("shard %d held by both relays", l.Shard)
		}
	}
	// A relay that leaves (TTL 0) gives everything back.
	sync(t, o, "a", 0, nil, a.Held)
	b = sync(t, o, "b", ttl, b.Held, nil)
	if b.Live != 1 || len(b.Held) != b.Shards {
		t.Fatalf("after a left, b holds %d of %d (live %d)", len(b.Held), b.Shards, b.Live)
	}
}

// syncAs is sync for a relay that states a fingerprint.
func syncAs(t *testing.T, o Outbox, relay, fingerprint string, held, release []outboxdriver.Lease) outboxdriver.LeaseState {
	t.Helper()
	ctx, cancel := testenv.CallContext()
	defer cancel()
	st, err := o.Store.SyncLeases(ctx, outboxdriver.LeaseRequest{RelayID: relay, Hostname: "test", PID: 1, TTL: ttl,
		Held: held, Release: release, Fingerprint: fingerprint})
	if err != nil {
		t.Fatalf("SyncLeases(%s): %v", relay, err)
	}
	return st
}

// leasesOfOneFingerprint: relays whose fingerprints differ never share the shards. A
// relay of another fingerprint takes none while the holders live, and takes them all
// once they left; two fingerprints that both hold shards settle on the earlier-sorting.
func leasesOfOneFingerprint(t *testing.T, o Outbox) {
	a := syncAs(t, o, "a", "fp-old", nil, nil)
	if len(a.Held) != a.Shards || len(a.GiveWay) != 0 {
		t.Fatalf("a lone relay got %+v, want every shard", a)
	}
	b := syncAs(t, o, "b", "fp-new", nil, nil)
	if len(b.Held) != 0 || b.Target != 0 || len(b.GiveWay) != 1 || b.GiveWay[0] != (outboxdriver.Peer{ID: "a", Fingerprint: "fp-old", Holds: true}) {
		t.Fatalf("a relay of another fingerprint got %+v, want no shard and GiveWay naming a", b)
	}
	if a = syncAs(t, o, "a", "fp-old", a.Held, nil); len(a.Held) != a.Shards || a.Live != 1 || a.Target != a.Shards {
		t.Fatalf("beside a differing relay, a got %+v, want every shard and live 1 (b does not share)", a)
	}
	st := status(t, o)
	if !slices.ContainsFunc(st.Relays, func(r outboxdriver.RelayInfo) bool { return r.ID == "b" && r.Fingerprint == "fp-new" }) {
		t.Fatalf("status relays %+v lack b's fingerprint", st.Relays)
	}
	if w := strings.Join(st.Warnings(), "\n"); !strings.Contains(w, "relays b take no shards") {
		t.Fatalf("status warnings %q do not name b as waiting", w)
	}
	// A relay stating no fingerprint agrees with both.
	if c := syncAs(t, o, "c", "", nil, nil); len(c.GiveWay) != 0 || c.Live != 3 {
		t.Fatalf("a relay without fingerprint got %+v, want no GiveWay and every relay live", c)
	}
	sync(t, o, "c", 0, nil, nil)

	// a leaves: b takes every shard.
	sync(t, o, "a", 0, nil, a.Held)
	if b = syncAs(t, o, "b", "fp-new", nil, nil); len(b.Held) != b.Shards || len(b.GiveWay) != 0 {
		t.Fatalf("once a left, b got %+v, want every shard", b)
	}

	// d holds half the shards under no fingerprint, then states one that sorts before
	// b's: both hold shards, and b gives way.
	syncAs(t, o, "d", "", nil, nil)
	half := b.Held[:b.Shards/2]
	b = syncAs(t, o, "b", "fp-new", b.Held[b.Shards/2:], half)
	d := syncAs(t, o, "d", "", nil, nil)
	if len(d.Held) != len(half) {
		t.Fatalf("d took %d shards, want the %d b released", len(d.Held), len(half))
	}
	if d = syncAs(t, o, "d", "fp-a", d.Held, nil); len(d.GiveWay) != 0 || d.Target != d.Shards {
		t.Fatalf("d, whose fingerprint sorts first, got %+v, want to keep its shards and a target of all", d)
	}
	if b = syncAs(t, o, "b", "fp-new", b.Held, nil); b.Target != 0 || len(b.GiveWay) != 1 || b.GiveWay[0].ID != "d" || len(b.Held) == 0 {
		t.Fatalf("b, whose fingerprint sorts after d's, got %+v, want target 0 and GiveWay naming d (its leases held until it drains them)", b)
	}
}

// relayDestinationStates: the states of a relay's destinations, given with its lease
// rounds, are what Status shows of it, the latest round's.
func relayDestinationStates(t *testing.T, o Outbox) {
	since := time.Date(2030, 1, 2, 3, 4, 5, 600_000_000, time.UTC)
	round := func(ds []outboxdriver.DestinationState) {
		t.Helper()
		ctx, cancel := testenv.CallContext()
		defer cancel()
		if _, err := o.Store.SyncLeases(ctx, outboxdriver.LeaseRequest{RelayID: "a", Hostname: "test", PID: 1, TTL: ttl,
			Fingerprint: "fp", Destinations: ds}); err != nil {
			t.Fatal(err)
		}
	}
	shown := func() []outboxdriver.DestinationState {
		t.Helper()
		for _, r := range status(t, o).Relays {
			if r.ID == "a" {
				return r.Destinations
			}
		}
		t.Fatal("relay a not in status")
		return nil
	}
	round([]outboxdriver.DestinationState{{Name: "default", Up: true, Since: since}, {Name: "audit", Since: since.Add(time.Minute)}})
	got := shown()
	if len(got) != 2 || got[0].Name != "default" || !got[0].Up || !got[0].Since.Equal(since) ||
		got[1].Name != "audit" || got[1].Up || !got[1].Since.Equal(since.Add(time.Minute)) {
		t.Fatalf("status shows destinations %+v", got)
	}
	round([]outboxdriver.DestinationState{{Name: "default", Up: true, Since: since}, {Name: "audit", Up: true, Since: since.Add(time.Hour)}})
	if got := shown(); len(got) != 2 || !got[1].Up || !got[1].Since.Equal(since.Add(time.Hour)) {
		t.Fatalf("after the next round status shows %+v", got)
	}
	round(nil)
	if got := shown(); len(got) != 0 {
		t.Fatalf("a round without destinations left %+v", got)
	}
}

// historyInPublicationOrder (a store that reads its history, outboxdriver.HistoryReader):
// the published messages a filter selects, in the order of publication, the limit's
// extra row saying a span holds more, and the count.
func historyInPublicationOrder(t *testing.T, o Outbox) {
	h, ok := o.Store.(outboxdriver.HistoryReader)
	if !ok {
		t.Skipf("%T reads no history", o.Store)
	}
	ctx, cancel := testenv.CallContext()
	defer cancel()
	start := time.Now().Add(-time.Minute)
	var ms []outbox.Message
	for i, topic := range []string{"orders.placed", "orders.paid", "billing", "orders_x"} {
		for k := range 3 {
			ms = append(ms, outbox.Message{Topic: topic, Key: fmt.Sprintf("k%d", k), AggregateType: []string{"order", "invoice"}[k%2],
				Payload: fmt.Appendf(nil, `{"n":%d}`, i*3+k)})
		}
	}
	write(t, o, ms)
	a := sync(t, o, "a", ttl, nil, nil)
	got := fetch(t, o, "a", a.Held, outboxdriver.FetchRequest{})
	if len(got) != len(ms) {
		t.Fatalf("fetched %d of %d", len(got), len(ms))
	}
	// Published in two rounds: the later seqs first.
	complete(t, o, "a", published(t, o, a.Held, got[6:]...))
	time.Sleep(2 * time.Millisecond) // two publication times (the stores keep microseconds): time, not work
	complete(t, o, "a", published(t, o, a.Held, got[:6]...))
	end := time.Now().Add(time.Minute)

	all, err := h.History(ctx, outboxdriver.HistoryFilter{Since: start, Until: end}, start, end, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(ms) {
		t.Fatalf("history holds %d messages, want %d", len(all), len(ms))
	}
	for i := 1; i < len(all); i++ {
		p, q := all[i-1], all[i]
		if q.PublishedAt.Before(p.PublishedAt) || q.PublishedAt.Equal(p.PublishedAt) && q.Seq < p.Seq {
			t.Fatalf("history out of publication order at %d: %d at %v after %d at %v", i, q.Seq, q.PublishedAt, p.Seq, p.PublishedAt)
		}
		if q.ID.IsZero() || len(q.Payload) == 0 || q.Topic == "" {
			t.Fatalf("history row %d incomplete: %+v", i, q.Message)
		}
	}
	if !all[0].PublishedAt.Equal(all[5].PublishedAt) || all[0].Seq != got[6].Seq {
		t.Errorf("the first round's messages do not come first: %d at %v", all[0].Seq, all[0].PublishedAt)
	}
	for _, tc := range []struct {
		f    outboxdriver.HistoryFilter
		want int
	}{
		{outboxdriver.HistoryFilter{Topic: "orders.*"}, 6},
		{outboxdriver.HistoryFilter{Topic: "orders?x"}, 3}, // ? is one character; _ in the topic is no wildcard
		{outboxdriver.HistoryFilter{Topic: "orders_*"}, 3},
		{outboxdriver.HistoryFilter{Topic: "billing", Key: "k1"}, 1},
		{outboxdriver.HistoryFilter{AggregateType: "invoice"}, 4},
	} {
		tc.f.Since, tc.f.Until = start, end
		rows, err := h.History(ctx, tc.f, start, end, 100)
		n, first, cerr := h.CountHistory(ctx, tc.f)
		if err != nil || cerr != nil || len(rows) != tc.want || n != int64(tc.want) || first.IsZero() {
			t.Errorf("%+v: %d rows (%v), count %d first %v (%v); want %d", tc.f, len(rows), err, n, first, cerr, tc.want)
		}
	}
	// limit+1 rows say the span holds more.
	if rows, err := h.History(ctx, outboxdriver.HistoryFilter{Since: start, Until: end}, start, end, 4); err != nil || len(rows) != 5 {
		t.Errorf("limit 4: %d rows, %v; want 5", len(rows), err)
	}
	if n, _, err := h.CountHistory(ctx, outboxdriver.HistoryFilter{Since: end, Until: end.Add(time.Hour)}); err != nil || n != 0 {
		t.Errorf("count of an empty range: %d, %v", n, err)
	}
}

// replayJobsRecorded (a store that records replay jobs, outboxdriver.ReplayJobs): a job
// saved is read back as saved, updated in place, listed, and an unknown name is
// ErrNoReplay.
func replayJobsRecorded(t *testing.T, o Outbox) {
	jobs, ok := o.Store.(outboxdriver.ReplayJobs)
	if !ok {
		t.Skipf("%T records no replay jobs", o.Store)
	}
	ctx, cancel := testenv.CallContext()
	defer cancel()
	since := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	j := outboxdriver.ReplayJob{Name: "backfill", Destination: "audit", State: outboxdriver.ReplayRunning, Total: 10, Sent: 4,
		Cursor: since.Add(time.Hour), Filter: outboxdriver.HistoryFilter{Since: since, Until: since.Add(24 * time.Hour), Topic: "orders.*", Key: "k"}}
	if err := jobs.SaveReplay(ctx, j); err != nil {
		t.Fatal(err)
	}
	j.State, j.Sent, j.Failed, j.Error = outboxdriver.ReplayFailed, 7, 1, "destination down"
	if err := jobs.SaveReplay(ctx, j); err != nil {
		t.Fatal(err)
	}
	got, err := jobs.Replay(ctx, "backfill")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != j.State || got.Sent != 7 || got.Failed != 1 || got.Error != j.Error || !got.Cursor.Equal(j.Cursor) ||
		!got.Filter.Since.Equal(since) || got.Filter.Topic != "orders.*" || got.Destination != "audit" || got.StartedAt.IsZero() {
		t.Errorf("read back %+v, want %+v", got, j)
	}
	if all, err := jobs.Replays(ctx); err != nil || len(all) != 1 || all[0].Name != "backfill" {
		t.Errorf("Replays: %+v, %v", all, err)
	}
	if _, err := jobs.Replay(ctx, "nope"); !errors.Is(err, outboxdriver.ErrNoReplay) {
		t.Errorf("unknown replay: %v, want ErrNoReplay", err)
	}
}

func leaseTakeover(t *testing.T, o Outbox) {
	// a's first leases last long enough that b surely finds them live, however slow the
	// machine; a then renews them with a short TTL and stops renewing.
	a := sync(t, o, "a", ttl, nil, nil)
	b := sync(t, o, "b", ttl, nil, nil)
	if len(b.Held) != 0 {
		t.Fatalf("b took %d shards from a live relay", len(b.Held))
	}
	short := 1500 * time.Millisecond
	if a = sync(t, o, "a", short, a.Held, nil); len(a.Held) != a.Shards {
		t.Fatalf("a renewed %d of its %d leases", len(a.Held), a.Shards)
	}
	time.Sleep(short + 500*time.Millisecond) // a stops renewing: its leases and heartbeat expire (time, not work)
	b = sync(t, o, "b", ttl, nil, nil)
	if len(b.Held) != b.Shards || b.Live != 1 {
		t.Fatalf("after a's leases expired, b holds %d of %d (live %d)", len(b.Held), b.Shards, b.Live)
	}
	for _, l := range b.Held {
		if l.Token <= tokenOf(t, a.Held, l.Shard) {
			t.Fatalf("shard %d taken over with token %d, not above a's %d", l.Shard, l.Token, tokenOf(t, a.Held, l.Shard))
		}
	}
	if again := sync(t, o, "a", short, a.Held, nil); len(again.Held) != 0 {
		t.Fatalf("a renewed %d leases that b owns now", len(again.Held))
	}
}

// leaseAdoption restarts relay "a" under the same ID: the new process adopts the leases
// at once (no wait for their expiry) under new tokens, which fence the earlier process.
func leaseAdoption(t *testing.T, o Outbox) {
	write(t, o, msgs("t", 4, 1))
	old := sync(t, o, "a", ttl, nil, nil)
	got := fetch(t, o, "a", old.Held, outboxdriver.FetchRequest{})
	if len(got) != 4 {
		t.Fatalf("fetched %d, want 4", len(got))
	}
	syncAdopt := func(relay string, held []outboxdriver.Lease, adopt bool) outboxdriver.LeaseState {
		t.Helper()
		ctx, cancel := testenv.CallContext()
		defer cancel()
		st, err := o.Store.SyncLeases(ctx, outboxdriver.LeaseRequest{RelayID: relay, Hostname: "test", PID: 2, TTL: ttl, Held: held, Adopt: adopt})
		if err != nil {
			t.Fatalf("SyncLeases(%s): %v", relay, err)
		}
		return st
	}
	// Another relay's first round adopts nothing of a's, which are live.
	if b := syncAdopt("b", nil, true); len(b.Held) != 0 {
		t.Fatalf("b adopted %d of a's shards", len(b.Held))
	}
	// Without Adopt, a process of the same ID does not learn the leases it did not present.
	if st := syncAdopt("a", nil, false); len(st.Held) != 0 {
		t.Fatalf("a round without Adopt returned %d leases it did not present", len(st.Held))
	}
	next := syncAdopt("a", nil, true)
	if len(next.Held) != len(old.Held) {
		t.Fatalf("the restarted a adopted %d of its %d shards", len(next.Held), len(old.Held))
	}
	for _, l := range next.Held {
		if l.Token == tokenOf(t, old.Held, l.Shard) {
			t.Fatalf("shard %d adopted under the earlier process's token %d", l.Shard, l.Token)
		}
	}
	// The earlier process, paused until now, renews and records: refused.
	if st := syncAdopt("a", old.Held, false); len(st.Held) != 0 {
		t.Fatalf("the earlier process renewed %d leases after they were adopted", len(st.Held))
	}
	if refused := complete(t, o, "a", published(t, o, old.Held, got[0])); len(refused) != 1 {
		t.Fatalf("the earlier process's outcome under its old token: refused %v, want it refused", refused)
	}
	// The new process publishes everything under its tokens.
	again := fetch(t, o, "a", next.Held, outboxdriver.FetchRequest{})
	if len(again) != 4 {
		t.Fatalf("the new process fetched %d, want 4", len(again))
	}
	if refused := complete(t, o, "a", published(t, o, next.Held, again...)); len(refused) != 0 {
		t.Fatalf("the new process's outcomes refused: %v", refused)
	}
}

func fencedComplete(t *testing.T, o Outbox) {
	write(t, o, msgs("t", 4, 1))
	a := sync(t, o, "a", ttl, nil, nil)
	got := fetch(t, o, "a", a.Held, outboxdriver.FetchRequest{})
	// a renews with a short TTL, then pauses past it.
	short := 1500 * time.Millisecond
	a = sync(t, o, "a", short, a.Held, nil)
	time.Sleep(short + 500*time.Millisecond) // time, not work
	b := sync(t, o, "b", ttl, nil, nil)
	// a, paused past its lease, comes back and records its outcomes: refused.
	c := published(t, o, a.Held, got[0], got[1])
	c.Failed = []outboxdriver.Failure{{Outcome: outboxdriver.Outcome{Seq: got[2].Seq, Token: tokenOf(t, a.Held, got[2].Shard)}, Error: "late", Delay: time.Hour}}
	refused := complete(t, o, "a", c)
	slices.Sort(refused)
	want := []int64{got[0].Seq, got[1].Seq, got[2].Seq}
	if !slices.Equal(refused, want) {
		t.Fatalf("a's late outcomes: refused %v, want %v", refused, want)
	}
	again := fetch(t, o, "b", b.Held, outboxdriver.FetchRequest{})
	if len(again) != 4 || again[2].Attempts != 0 {
		t.Fatalf("after the refused outcomes b fetched %d (attempts of the third %d), want all 4 untouched", len(again), again[2].Attempts)
	}
	if refused := complete(t, o, "b", published(t, o, b.Held, again...)); len(refused) != 0 {
		t.Fatalf("b's outcomes refused: %v", refused)
	}
	if rest := fetch(t, o, "b", b.Held, outboxdriver.FetchRequest{}); len(rest) != 0 {
		t.Fatalf("%d messages still pending after b published them", len(rest))
	}
	if s := status(t, o); s.Pending != 0 || s.Published != 4 {
		t.Fatalf("status %+v, want 0 pending and 4 published", s)
	}
}

// retryBackoffBlocksKey fails the first message of two keys: k0's with a backoff no test
// outlasts, to see it block its key, and k1's with a short one, to see its key flow again
// once it is over. (A short backoff alone would make the first check race the machine.)
// deferredCountsNoAttempt records a message whose destination was unavailable: its key
// is held back like a retry's, its error kept, and no attempt counted.
func deferredCountsNoAttempt(t *testing.T, o Outbox) {
	write(t, o, msgs("t", 2, 2)) // k0 k1 k0 k1
	st := sync(t, o, "r1", ttl, nil, nil)
	got := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{})
	k0 := got[0]
	f := outboxdriver.Failure{Outcome: outboxdriver.Outcome{Seq: k0.Seq, Token: tokenOf(t, st.Held, k0.Shard)},
		Error: "destination down", Delay: time.Second, Deferred: true}
	if refused := complete(t, o, "r1", outboxdriver.Completion{Failed: []outboxdriver.Failure{f}}); len(refused) != 0 {
		t.Fatalf("refused %v", refused)
	}
	for _, m := range fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{}) {
		if m.Key == "k0" {
			t.Fatalf("key k0 fetched (%q) while its first message is deferred", m.Payload)
		}
	}
	if s := status(t, o); s.Retrying != 0 || s.Delayed != 1 {
		t.Errorf("status %+v, want 1 delayed and none retrying (no attempt counted)", s)
	}
	var later []*outbox.Message
	testenv.Await(t, "k0's deferred message to come due after 1 s", func() (any, bool) {
		later = fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{})
		return payloads(later), len(later) == 4
	})
	if later[0].Seq != k0.Seq || later[0].Attempts != 0 || later[0].LastError != "destination down" {
		t.Fatalf("after the delay: first %+v; want k0's message first, 0 attempts, its error", later[0])
	}
}

func retryBackoffBlocksKey(t *testing.T, o Outbox) {
	write(t, o, msgs("t", 3, 2)) // k0 k1 k2 k0 k1 k2
	st := sync(t, o, "r1", ttl, nil, nil)
	got := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{})
	k0, k1 := got[0], got[1]
	failure := func(m *outbox.Message, delay time.Duration) outboxdriver.Failure {
		return outboxdriver.Failure{Outcome: outboxdriver.Outcome{Seq: m.Seq, Token: tokenOf(t, st.Held, m.Shard)}, Error: "broker said no", Delay: delay}
	}
	failed := []outboxdriver.Failure{failure(k0, time.Hour), failure(k1, time.Second)}
	if refused := complete(t, o, "r1", outboxdriver.Completion{Failed: failed}); len(refused) != 0 {
		t.Fatalf("refused %v", refused)
	}
	now := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{})
	var k2 int
	for _, m := range now {
		switch m.Key {
		case "k0":
			t.Fatalf("key k0 fetched (%q) while its first message backs off", m.Payload)
		case "k2":
			k2++
		}
	}
	if k2 != 2 {
		t.Fatalf("fetched %v, want k2's two messages", payloads(now))
	}
	if s := status(t, o); s.Retrying != 2 || s.Delayed < 1 {
		t.Errorf("status %+v, want 2 retrying and at least 1 delayed", s)
	}
	var later []*outbox.Message
	testenv.Await(t, "k1's first message to come due after its 1 s backoff", func() (any, bool) {
		later = fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{})
		return payloads(later), len(later) == 4
	})
	if later[0].Seq != k1.Seq || later[0].Attempts != 1 || later[0].LastError != "broker said no" {
		t.Fatalf("after the backoff: first %+v; want k1's message first with 1 attempt and its error", later[0])
	}
	for _, m := range later {
		if m.Key == "k0" {
			t.Fatalf("key k0 fetched (%q) while its first message backs off", m.Payload)
		}
	}
}

// deliverAtBlocksKey delays the first message of two keys: k0's past the test's end, to
// see it block its key, and k1's by a second, to see its key flow once it is due.
func deliverAtBlocksKey(t *testing.T, o Outbox) {
	in := msgs("t", 3, 2) // k0 k1 k2 k0 k1 k2
	in[0].DeliverAt = time.Now().Add(time.Hour)
	in[1].DeliverAt = time.Now().Add(time.Second)
	write(t, o, in)
	st := sync(t, o, "r1", ttl, nil, nil)
	got := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{})
	var k2 int
	for _, m := range got {
		switch m.Key {
		case "k0":
			t.Fatalf("fetched %v: k0's messages while its first waits for DeliverAt", payloads(got))
		case "k2":
			k2++
		}
	}
	if k2 != 2 {
		t.Fatalf("fetched %v, want k2's two messages", payloads(got))
	}
	testenv.Await(t, "k1's first message to come due", func() (any, bool) {
		got = fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{})
		return payloads(got), len(got) == 4
	})
	var keys []string
	for _, m := range got {
		keys = append(keys, m.Key)
	}
	if !slices.Equal(keys, []string{"k1", "k2", "k1", "k2"}) {
		t.Fatalf("after k1's DeliverAt: fetched keys %v, want k1 k2 k1 k2", keys)
	}
}

func deadLetterAndReplay(t *testing.T, o Outbox) {
	write(t, o, msgs("poison", 1, 2))
	st := sync(t, o, "r1", ttl, nil, nil)
	got := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{})
	first := got[0]
	dead := outboxdriver.Failure{Outcome: outboxdriver.Outcome{Seq: first.Seq, Token: tokenOf(t, st.Held, first.Shard)}, Error: "schema mismatch", Dead: true}
	complete(t, o, "r1", outboxdriver.Completion{Failed: []outboxdriver.Failure{dead}})
	rest := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{})
	if len(rest) != 1 || rest[0].Seq == first.Seq {
		t.Fatalf("after dead-lettering the first, fetched %v, want the key's second (a dead letter does not block its key)", payloads(rest))
	}
	admin := o.Store.(outboxdriver.Admin)
	ctx := testenv.Context(t)
	list, err := admin.DeadList(ctx, outboxdriver.DeadFilter{Topic: "poison", ErrorContains: "SCHEMA"})
	if err != nil || len(list) != 1 || list[0].ID != first.ID || list[0].LastError != "schema mismatch" || list[0].DeadAt.IsZero() {
		t.Fatalf("DeadList = %+v, %v; want the dead letter with its error", list, err)
	}
	if n, err := admin.DeadCount(ctx, outboxdriver.DeadFilter{Key: first.Key}); err != nil || n != 1 {
		t.Fatalf("DeadCount = %d, %v", n, err)
	}
	if n, err := admin.DeadList(ctx, outboxdriver.DeadFilter{Topic: "other"}); err != nil || len(n) != 0 {
		t.Fatalf("DeadList of another topic = %v, %v", n, err)
	}
	if _, err := admin.DeadPurge(ctx, outboxdriver.DeadFilter{}); !errors.Is(err, outboxdriver.ErrEmptyDeadFilter) {
		t.Fatalf("DeadPurge with an empty filter = %v, want ErrEmptyDeadFilter", err)
	}
	if s := status(t, o); s.Dead != 1 {
		t.Errorf("status dead = %d", s.Dead)
	}
	if n, err := admin.DeadReplay(ctx, outboxdriver.DeadFilter{IDs: []outbox.ID{first.ID}}); err != nil || n != 1 {
		t.Fatalf("DeadReplay = %d, %v", n, err)
	}
	again := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{Exclude: []int64{rest[0].Seq}})
	if len(again) != 1 || again[0].ID != first.ID || again[0].DedupKey != first.DedupKey || again[0].Attempts != 0 {
		t.Fatalf("after replay fetched %+v, want the original message with its id and no attempts", again)
	}
	// Dead again, then purged.
	dead.Token = tokenOf(t, st.Held, first.Shard)
	complete(t, o, "r1", outboxdriver.Completion{Failed: []outboxdriver.Failure{dead}})
	if n, err := admin.DeadPurge(ctx, outboxdriver.DeadFilter{Topic: "poison"}); err != nil || n != 1 {
		t.Fatalf("DeadPurge = %d, %v", n, err)
	}
	if n, err := admin.DeadCount(ctx, outboxdriver.DeadFilter{}); err != nil || n != 0 {
		t.Fatalf("DeadCount after purge = %d, %v", n, err)
	}
}

func dedupKey(t *testing.T, o Outbox) {
	write(t, o, []outbox.Message{{Topic: "t", Key: "a", DedupKey: "order-1-placed", Payload: []byte(`{"v":1}`)}})
	err := o.Write(testenv.Context(t), []outbox.Message{
		{Topic: "t", Key: "a", DedupKey: "order-1-placed", Payload: []byte(`{"v":2}`)},
		{Topic: "t", Key: "b", DedupKey: "order-2-placed", Payload: []byte(`{"v":3}`)},
	}, false)
	var de *outbox.DuplicateError
	if !errors.As(err, &de) || !errors.Is(err, outbox.ErrDuplicate) || !slices.Equal(de.DedupKeys, []string{"order-1-placed"}) {
		t.Fatalf("second write with a taken dedup key: %v, want a *DuplicateError naming it", err)
	}
	st := sync(t, o, "r1", ttl, nil, nil)
	got := payloads(fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{}))
	if !slices.Equal(got, []string{`{"v":1}`, `{"v":3}`}) {
		t.Fatalf("fetched %v, want the first write and the non-duplicate of the second", got)
	}
}

// generatedIDsClaimNothing writes messages given neither an id nor a dedup key beside
// messages with dedup keys, alone and in one call: each is stored with its new id as its
// dedup key and is never skipped, the keyed ones are deduplicated as ever, and call
// order holds. The generated ids were not claimed: a later message whose dedup key is
// one of them is written (a claim would have refused it).
func generatedIDsClaimNothing(t *testing.T, o Outbox) {
	write(t, o, []outbox.Message{{Topic: "t", Key: "a", Payload: []byte(`{"v":0}`)}})
	err := o.Write(testenv.Context(t), []outbox.Message{
		{Topic: "t", Key: "a", Payload: []byte(`{"v":1}`)},
		{Topic: "t", Key: "a", DedupKey: "k", Payload: []byte(`{"v":2}`)},
		{Topic: "t", Key: "a", Payload: []byte(`{"v":3}`)},
		{Topic: "t", Key: "a", DedupKey: "k", Payload: []byte(`{"v":4}`)},
		{Topic: "t", Key: "a", Payload: []byte(`{"v":5}`)},
	}, false)
	var de *outbox.DuplicateError
	if !errors.As(err, &de) || !slices.Equal(de.DedupKeys, []string{"k"}) {
		t.Fatalf("a call of generated ids and a repeated dedup key: %v, want a *DuplicateError naming k only", err)
	}
	st := sync(t, o, "r1", ttl, nil, nil)
	got := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{})
	if p := payloads(got); !slices.Equal(p, []string{`{"v":0}`, `{"v":1}`, `{"v":2}`, `{"v":3}`, `{"v":5}`}) {
		t.Fatalf("fetched %v, want every message but the duplicate, in call order", p)
	}
	seen := map[outbox.ID]bool{}
	for _, m := range got {
		if seen[m.ID] || m.ID.IsZero() {
			t.Fatalf("id %s generated twice or not at all", m.ID)
		}
		seen[m.ID] = true
		if want := m.ID.String(); string(m.Payload) != `{"v":2}` && m.DedupKey != want {
			t.Errorf("message %s has dedup key %q, want its id", m.Payload, m.DedupKey)
		}
	}
	write(t, o, []outbox.Message{{Topic: "t", Key: "b", DedupKey: got[0].ID.String(), Payload: []byte(`{"v":6}`)}})
	write(t, o, []outbox.Message{{Topic: "t", Key: "b", DedupKey: got[1].ID.String(), Payload: []byte(`{"v":7}`)}})
}

func retention(t *testing.T, o Outbox) {
	write(t, o, msgs("t", 10, 1))
	st := sync(t, o, "r1", ttl, nil, nil)
	got := fetch(t, o, "r1", st.Held, outboxdriver.FetchRequest{})
	complete(t, o, "r1", published(t, o, st.Held, got...))
	ctx := testenv.Context(t)
	if n, err := o.Store.DeletePublished(ctx, time.Hour, 100); err != nil || n != 0 {
		t.Fatalf("DeletePublished of rows younger than the retention = %d, %v", n, err)
	}
	time.Sleep(1100 * time.Millisecond) // the rows grow older than the 1 s retention below: time, not work
	total := 0
	for range 20 {
		n, err := o.Store.DeletePublished(ctx, time.Second, 3)
		if err != nil {
			t.Fatal(err)
		}
		if n > 3+10 { // dedup bookkeeping may count too, but a batch stays bounded
			t.Fatalf("one DeletePublished call deleted %d rows with limit 3", n)
		}
		if n == 0 {
			break
		}
		total += n
	}
	if s := status(t, o); s.Published != 0 || total < 10 {
		t.Fatalf("after retention: %d published left, %d rows deleted", s.Published, total)
	}
	// The dedup keys of deleted messages are free again.
	again := got[0]
	if err := o.Write(ctx, []outbox.Message{{Topic: "t", Key: "x", DedupKey: again.DedupKey, Payload: []byte(`{}`)}}, false); err != nil {
		t.Fatalf("dedup key of a message past retention is still taken: %v", err)
	}
}

// relaysDrainInOrder runs two relays on the store until they drained a backlog whose
// messages of every fifth key are rejected twice first.
func relaysDrainInOrder(t *testing.T, o Outbox) {
	const keys, perKey = 40, 25
	write(t, o, msgs("t", keys, perKey))
	rejects := map[string]int{}
	pub := &outboxtest.Publisher{}
	mu := make(chan struct{}, 1)
	pub.Fail = func(m *outbox.Message) error {
		mu <- struct{}{}
		defer func() { <-mu }()
		if n, _ := strconv.Atoi(m.Key[1:]); n%5 == 0 && rejects[m.ID.String()] < 2 {
			rejects[m.ID.String()]++
			return errors.New("rejected for the test")
		}
		return nil
	}
	cfg := outbox.RelayConfig{RetryMinDelay: 10 * time.Millisecond, RetryMaxDelay: 50 * time.Millisecond, PollInterval: 20 * time.Millisecond, BatchSize: 100}
	var relays []*outbox.Relay
	for i := range 2 {
		c := cfg
		c.ID = "drain-" + strconv.Itoa(i)
		r, err := outbox.NewRelay(o.Store, pub, c)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Stop(testenv.Context(t)) }) // on a failure below; stopping twice is safe
		relays = append(relays, r)
	}
	got := pub.Await(t, keys*perKey)
	for _, r := range relays {
		if err := r.Stop(testenv.Context(t)); err != nil {
			t.Errorf("stop %s: %v", r.ID(), err)
		}
	}
	last := map[string]int{}
	seen := map[outbox.ID]bool{}
	for _, m := range got {
		if seen[m.ID] {
			t.Errorf("published twice: %s", m.ID)
		}
		seen[m.ID] = true
		var body struct{ N int }
		if err := json.Unmarshal(m.Payload, &body); err != nil {
			t.Fatalf("payload %q: %v", m.Payload, err)
		}
		n := body.N
		if prev, ok := last[m.Key]; ok && n != prev+1 {
			t.Fatalf("key %s: message %d published after %d", m.Key, n, prev)
		}
		last[m.Key] = n
	}
	if s := status(t, o); s.Pending != 0 || s.Dead != 0 {
		t.Fatalf("after the drain: %+v", s)
	}
}
