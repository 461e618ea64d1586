package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxtest"
)

// The relay's behaviour on the in-memory store (outboxtest.Store): no database server,
// and each test runs in a testing/synctest bubble, whose clock is the store's and the
// relays'. Lease TTLs, backoffs and outages take no wall-clock time, and what happens
// when is decided by the test, not by how fast the machine is. Every test ends with the
// same history check (memBundle.checkHistory): each committed message published, nothing
// else, each key's first deliveries in write order.

// memBundle is a store, a writer on it, and the ledger of what was written.
type memBundle struct {
	store  *outboxtest.Store
	w      *outbox.Writer[*outboxtest.Tx]
	ledger memLedger
	topic  func(key string) string // the topic of a key's messages; nil: "t"
}

// setupMem returns an empty store on time.Now: call it inside the bubble, so the store's
// clock is the bubble's.
func setupMem(t *testing.T) *memBundle {
	t.Helper()
	store := outboxtest.NewStore(outboxtest.StoreConfig{})
	w, err := outbox.NewWriter(store, outbox.WriterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return &memBundle{store: store, w: w, ledger: memLedger{
		next: map[string]int{}, committed: map[memEvent]bool{}, rolledBack: map[memEvent]bool{},
	}}
}

// memEvent names a message: the n-th message written of its key (rolled-back ones
// count), which is also its payload, "key#n".
type memEvent struct {
	Key string
	N   int
}

func (e memEvent) String() string { return e.Key + "#" + strconv.Itoa(e.N) }

// memEventOf reads m's event from its payload; false if m is no message of the ledger's,
// or its payload names another key.
func memEventOf(m *outbox.Message) (memEvent, bool) {
	key, n, ok := strings.Cut(string(m.Payload), "#")
	i, err := strconv.Atoi(n)
	if !ok || err != nil || key != m.Key {
		return memEvent{}, false
	}
	return memEvent{key, i}, true
}

// memLedger is what was written: the next n of each key, and which events committed
// and which rolled back. A key's messages must be written by one goroutine at a time (an
// application holding the aggregate's lock), so that its n follow its seqs.
type memLedger struct {
	mu         sync.Mutex
	next       map[string]int
	committed  map[memEvent]bool
	rolledBack map[memEvent]bool
}

// memTx is an open transaction and the events written in it.
type memTx struct {
	tx     *outboxtest.Tx
	events []memEvent
}

// begin writes one message of each key in a new transaction, and leaves it open.
func (b *memBundle) begin(keys ...string) (*memTx, error) {
	mt := &memTx{tx: b.store.Begin()}
	msgs := make([]outbox.Message, len(keys))
	b.ledger.mu.Lock()
	for i, k := range keys {
		ev := memEvent{k, b.ledger.next[k]}
		b.ledger.next[k]++
		mt.events = append(mt.events, ev)
		msgs[i] = outbox.Message{Topic: "t", Key: k, Payload: []byte(ev.String())}
		if b.topic != nil {
			msgs[i].Topic = b.topic(k)
		}
	}
	b.ledger.mu.Unlock()
	if err := b.w.Write(context.Background(), mt.tx, msgs...); err != nil {
		_ = mt.tx.Rollback()
		return nil, fmt.Errorf("write %v: %w", mt.events, err)
	}
	return mt, nil
}

// end commits mt, or rolls it back, and notes which in the ledger.
func (b *memBundle) end(mt *memTx, commit bool) error {
	end := mt.tx.Rollback
	if commit {
		end = mt.tx.Commit
	}
	if err := end(); err != nil {
		return fmt.Errorf("end the transaction of %v: %w", mt.events, err)
	}
	b.ledger.mu.Lock()
	defer b.ledger.mu.Unlock()
	for _, ev := range mt.events {
		if commit {
			b.ledger.committed[ev] = true
		} else {
			b.ledger.rolledBack[ev] = true
		}
	}
	return nil
}

// write writes one message of each key in one transaction and commits it, or rolls it
// back. It returns what failed: for writer goroutines, which must not call t.Fatal.
func (b *memBundle) write(rollback bool, keys ...string) error {
	mt, err := b.begin(keys...)
	if err != nil {
		return err
	}
	return b.end(mt, !rollback)
}

func (b *memBundle) mustWrite(t *testing.T, keys ...string) {
	t.Helper()
	if err := b.write(false, keys...); err != nil {
		t.Fatal(err)
	}
}

// writeRounds commits rounds transactions, each with one message of every key.
func (b *memBundle) writeRounds(t *testing.T, rounds int, keys []string) {
	t.Helper()
	for range rounds {
		b.mustWrite(t, keys...)
	}
}

func memKeys(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
	}
	return keys
}

// relay starts a relay on b's store.
func (b *memBundle) relay(t *testing.T, pub outbox.Publisher, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	return b.relayOn(t, context.Background(), b.store, pub, cfg)
}

// relayOn starts a relay on store (b's, or a wrapper of it) with ctx, and stops it when
// the test ends (stopping twice is safe). Its errors are logged to the test's output.
func (b *memBundle) relayOn(t *testing.T, ctx context.Context, store outboxdriver.Store, pub outbox.Publisher, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
	}
	r, err := outbox.NewRelay(store, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := testenv.CallContext()
		defer cancel()
		_ = r.Stop(sctx)
	})
	return r
}

func (b *memBundle) status(t *testing.T) outboxdriver.Status {
	t.Helper()
	st, err := b.store.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// awaitPublished waits until every message committed so far, but those of dead, was
// confirmed by pub and no message is pending in the store. It fails the test when that
// stops moving for testenv.Stall() (on the bubble's clock).
func (b *memBundle) awaitPublished(t *testing.T, pub *outboxtest.Publisher, dead ...memEvent) {
	t.Helper()
	b.ledger.mu.Lock()
	want := map[memEvent]bool{}
	for ev := range b.ledger.committed {
		if !slices.Contains(dead, ev) {
			want[ev] = true
		}
	}
	b.ledger.mu.Unlock()
	testenv.Await(t, "every committed message published and recorded", func() (any, bool) {
		seen := map[memEvent]bool{}
		got := pub.Messages()
		for i := range got {
			if ev, ok := memEventOf(&got[i]); ok && want[ev] {
				seen[ev] = true
			}
		}
		pending := b.status(t).Pending
		return fmt.Sprintf("%d of %d published, %d pending", len(seen), len(want), pending), len(seen) == len(want) && pending == 0
	})
}

// checkHistory compares what the broker confirmed (got, in confirmation order) with the
// ledger: every committed message published but those in dead, no message published that
// was rolled back, dead-lettered or never written, and each key's first deliveries in
// the order its messages were written. A message published again is no error here: it
// returns how many such duplicates there were, for the test to bound.
func (b *memBundle) checkHistory(t *testing.T, got []outbox.Message, dead ...memEvent) (dups int) {
	t.Helper()
	b.ledger.mu.Lock()
	defer b.ledger.mu.Unlock()
	var lost, phantom, rolledBack, published, order []string
	delivered := map[memEvent]bool{}
	last := map[string]int{}
	for i := range got {
		ev, ok := memEventOf(&got[i])
		switch {
		case !ok:
			phantom = append(phantom, fmt.Sprintf("%s:%q", got[i].Key, got[i].Payload))
			continue
		case b.ledger.rolledBack[ev]:
			rolledBack = append(rolledBack, ev.String())
		case !b.ledger.committed[ev]:
			phantom = append(phantom, ev.String())
		case slices.Contains(dead, ev):
			published = append(published, ev.String())
		}
		if delivered[ev] {
			dups++
			continue
		}
		delivered[ev] = true
		if n, ok := last[ev.Key]; ok && ev.N < n {
			order = append(order, fmt.Sprintf("%s after %s#%d", ev, ev.Key, n))
		}
		last[ev.Key] = ev.N
	}
	for ev := range b.ledger.committed {
		if !delivered[ev] && !slices.Contains(dead, ev) {
			lost = append(lost, ev.String())
		}
	}
	t.Logf("history: confirmed=%d distinct=%d committed=%d rolled_back=%d lost=%d phantom=%d published_rolled_back=%d published_dead=%d order=%d dup=%d",
		len(got), len(delivered), len(b.ledger.committed), len(b.ledger.rolledBack), len(lost), len(phantom), len(rolledBack), len(published), len(order), dups)
	for _, c := range []struct {
		what string
		evs  []string
	}{
		{"committed, never published (lost)", lost},
		{"published, never committed (phantom)", phantom},
		{"published, rolled back", rolledBack},
		{"published, dead-lettered", published},
		{"per-key order violations (first deliveries)", order},
	} {
		if len(c.evs) > 0 {
			slices.Sort(c.evs)
			t.Errorf("%s: %d: %v", c.what, len(c.evs), c.evs[:min(len(c.evs), 10)])
		}
	}
	return dups
}

// holdsShards is a check for testenv.Await: r holds n shards.
func holdsShards(r *outbox.Relay, n int64) func() (any, bool) {
	return func() (any, bool) {
		held := r.Stats().Shards
		return fmt.Sprintf("%s holds %d shards", r.ID(), held), held == n
	}
}

// gatedPublisher publishes through pub, but holds every batch with a message that hold
// matches until open is called, as a broker call that hangs (or until the publish's
// context ends). holding is closed when the first batch is held.
type gatedPublisher struct {
	pub     outbox.Publisher
	hold    func(*outbox.Message) bool
	holding chan struct{}
	release chan struct{}
	open    func()

	mu   sync.Mutex
	held []int64 // the seqs of the held batches' messages
}

func newGatedPublisher(pub outbox.Publisher, hold func(*outbox.Message) bool) *gatedPublisher {
	g := &gatedPublisher{pub: pub, hold: hold, holding: make(chan struct{}), release: make(chan struct{})}
	g.open = sync.OnceFunc(func() { close(g.release) })
	return g
}

func (g *gatedPublisher) Publish(ctx context.Context, batch []*outbox.Message) []error {
	if g.holds(batch) {
		select {
		case <-g.release:
		case <-ctx.Done():
		}
	}
	return g.pub.Publish(ctx, batch)
}

func (g *gatedPublisher) holds(batch []*outbox.Message) bool {
	select {
	case <-g.release:
		return false
	default:
	}
	if !slices.ContainsFunc(batch, g.hold) {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held == nil {
		close(g.holding)
	}
	for _, m := range batch {
		g.held = append(g.held, m.Seq)
	}
	return true
}

// heldSeqs returns the seqs of the messages held so far.
func (g *gatedPublisher) heldSeqs() []int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.held)
}

// slowPublisher publishes through pub after delay on the bubble's clock: a broker whose
// confirmations take time, so that a relay has publishes in flight and a backlog.
type slowPublisher struct {
	pub   outbox.Publisher
	delay time.Duration
}

func (p slowPublisher) Publish(ctx context.Context, batch []*outbox.Message) []error {
	select {
	case <-time.After(p.delay):
	case <-ctx.Done():
	}
	return p.pub.Publish(ctx, batch)
}

// cutStore is one relay's way to the store. While cut is set its lease calls fail, as
// for a relay cut off from the lease table (or frozen) past its leases' expiry; its
// fetches and outcome records go through. It keeps the seqs whose outcomes the store
// refused.
type cutStore struct {
	outboxdriver.Store
	cut atomic.Bool

	mu      sync.Mutex
	refused []int64
}

func (s *cutStore) SyncLeases(ctx context.Context, req outboxdriver.LeaseRequest) (outboxdriver.LeaseState, error) {
	if s.cut.Load() {
		return outboxdriver.LeaseState{}, errors.New("test: the lease table is unreachable")
	}
	return s.Store.SyncLeases(ctx, req)
}

func (s *cutStore) Complete(ctx context.Context, c outboxdriver.Completion) ([]int64, error) {
	refused, err := s.Store.Complete(ctx, c)
	s.mu.Lock()
	s.refused = append(s.refused, refused...)
	s.mu.Unlock()
	return refused, err
}

func (s *cutStore) refusedSeqs() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.refused)
}

// TestMemRelayLeaseLostMidPublishFenced: relay A sends a batch that the broker holds
// (the call hangs), and A's lease renewals fail meanwhile, so its leases expire on the
// store's clock and B takes every shard over. B sends the same messages, and its call is
// held too, so they are still pending when A's broker confirms them: A's outcomes must be
// refused by the store (fenced by the lease token), not recorded. Once B's call goes
// through, everything is published; the only duplicates are A's held batch, and each
// key's first deliveries keep their order.
func TestMemRelayLeaseLostMidPublishFenced(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupMem(t)
		pub := &outboxtest.Publisher{}
		trigger := memEvent{"k0", 2}
		gateA := newGatedPublisher(pub, func(m *outbox.Message) bool { ev, _ := memEventOf(m); return ev == trigger })
		storeA := &cutStore{Store: b.store}
		cfg := outbox.RelayConfig{LeaseTTL: 3 * time.Second, MaxInFlight: 10, PublishBatchSize: 5, PublishTimeout: time.Hour}
		cfgA := cfg
		cfgA.ID = "a"
		a := b.relayOn(t, context.Background(), storeA, gateA, cfgA)
		t.Cleanup(gateA.open) // before A's Stop, on a failure too
		testenv.Await(t, "A to hold every shard", holdsShards(a, 64))
		b.writeRounds(t, 6, memKeys("k", 10))

		testenv.AwaitChan(t, "A to send "+trigger.String(), gateA.holding, func() any { return len(pub.Messages()) })
		synctest.Wait() // A has published and recorded all it can besides the held batch
		heldA := gateA.heldSeqs()
		storeA.cut.Store(true)
		recordedByA := a.Stats().Published

		held := map[int64]bool{}
		for _, s := range heldA {
			held[s] = true
		}
		gateB := newGatedPublisher(pub, func(m *outbox.Message) bool { return held[m.Seq] })
		cfgB := cfg
		cfgB.ID = "b"
		bRelay := b.relay(t, gateB, cfgB)
		t.Cleanup(gateB.open)
		testenv.Await(t, "B to take A's shards over once A's leases expire", holdsShards(bRelay, 64))
		testenv.AwaitChan(t, "B to send A's held messages", gateB.holding, func() any { return len(pub.Messages()) })

		gateA.open() // the broker confirms A's batch: A's outcomes come after its leases
		testenv.Await(t, "A's late outcomes handled", func() (any, bool) {
			s := a.Stats()
			handled := s.Refused + s.Published - recordedByA
			return fmt.Sprintf("%d refused, %d recorded", s.Refused, s.Published-recordedByA), handled >= int64(len(heldA))
		})
		if s := a.Stats(); s.Refused != int64(len(heldA)) || s.Published != recordedByA {
			t.Errorf("A after its held batch of %d: %+v; want them all refused and no more recorded than the %d before", len(heldA), s, recordedByA)
		}
		refused := storeA.refusedSeqs()
		for _, s := range heldA {
			if !slices.Contains(refused, s) {
				t.Errorf("seq %d of A's held batch not refused by the store (refused: %v)", s, refused)
			}
		}

		storeA.cut.Store(false)
		gateB.open()
		b.awaitPublished(t, pub)
		if dups := b.checkHistory(t, pub.Messages()); dups != len(heldA) {
			t.Errorf("%d duplicates; want exactly A's held batch (%d) sent again by B", dups, len(heldA))
		}
		if st := b.status(t); st.Published != int64(len(b.ledger.committed)) || st.Dead != 0 {
			t.Errorf("store after the drain: %d published, %d dead; want each of the %d committed once, none dead", st.Published, st.Dead, len(b.ledger.committed))
		}
	})
}

// TestMemRelayTakeoverAfterHardStop: relays A and B share the shards; A is killed (its
// context cancelled: in-flight work abandoned, leases not given back) with a backlog
// left. B takes A's shards once their leases expire on the store's clock, within
// LeaseTTL plus one renewal interval and not before the TTL less one, and publishes the
// rest, writes made after the kill included.
func TestMemRelayTakeoverAfterHardStop(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupMem(t)
		pub := &outboxtest.Publisher{}
		slow := slowPublisher{pub: pub, delay: 20 * time.Millisecond}
		const ttl, renew = 3 * time.Second, time.Second // renew: min(ttl/3, 1s)
		cfg := outbox.RelayConfig{LeaseTTL: ttl, MaxInFlight: 20, PublishBatchSize: 5}
		ctxA, killA := context.WithCancel(context.Background())
		t.Cleanup(killA)
		cfgA := cfg
		cfgA.ID = "a"
		a := b.relayOn(t, ctxA, b.store, slow, cfgA)
		cfgB := cfg
		cfgB.ID = "b"
		bRelay := b.relay(t, slow, cfgB)
		testenv.Await(t, "the relays to share the shards", func() (any, bool) {
			sa, sb := a.Stats().Shards, bRelay.Stats().Shards
			return fmt.Sprintf("A %d, B %d", sa, sb), sa+sb == 64 && sa > 0 && sb > 0
		})

		keys := memKeys("k", 40)
		for i := range 10 {
			b.mustWrite(t, keys...)
			if err := b.write(true, keys[i]); err != nil {
				t.Fatal(err)
			}
		}
		testenv.Await(t, "A to publish part of the load", func() (any, bool) {
			n := a.Stats().Published
			return fmt.Sprintf("A published %d", n), n >= 50
		})
		killed := time.Now()
		killA()
		testenv.AwaitChan(t, "A to stop once killed", a.Stopped(), func() any { return "A running" })
		b.writeRounds(t, 3, keys) // on A's shards too: B publishes them once it holds them

		testenv.Await(t, "B to take A's shards over", holdsShards(bRelay, 64))
		took := time.Since(killed)
		if took < ttl-renew || took > ttl+renew+500*time.Millisecond {
			t.Errorf("B took A's shards %v after the kill; want between %v and %v (LeaseTTL %v, renewals every %v)",
				took, ttl-renew, ttl+renew, ttl, renew)
		}
		b.awaitPublished(t, pub)
		dups := b.checkHistory(t, pub.Messages())
		t.Logf("A: %+v, B: %+v, takeover after %v", a.Stats(), bRelay.Stats(), took)
		if dups > cfg.MaxInFlight {
			t.Errorf("%d duplicates, more than A's MaxInFlight (%d)", dups, cfg.MaxInFlight)
		}
	})
}

// TestMemRelayOutageRecovers: the broker goes down after 30 confirmations and stays down
// for ten pauses of the relay while writers go on committing: nothing is recorded
// published meanwhile, no attempt is counted and nothing dead-lettered (MaxAttempts is 2,
// so two counted outages would), and after the broker is back everything is published
// once, in each key's order.
func TestMemRelayOutageRecovers(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupMem(t)
		const downAfter = 30
		var down atomic.Bool
		confirmed := 0 // the Publisher calls Fail under its lock
		pub := &outboxtest.Publisher{Fail: func(*outbox.Message) error {
			if down.Load() {
				return outbox.Outage(errors.New("test: connection refused"))
			}
			if confirmed++; confirmed == downAfter {
				down.Store(true)
			}
			return nil
		}}
		keys := memKeys("k", 10)
		b.writeRounds(t, 10, keys)
		if err := b.write(true, keys...); err != nil {
			t.Fatal(err)
		}
		r := b.relay(t, pub, outbox.RelayConfig{ID: "r", MaxAttempts: 2, MaxInFlight: 10, PublishBatchSize: 5})
		// (A relay that took the outage for confirmations would never pause: the check
		// below tells it.)
		testenv.Await(t, "the relay to pause for the outage ten times", func() (any, bool) {
			n, recorded := r.Stats().Outages, r.Stats().Published
			return fmt.Sprintf("%d pauses, %d recorded published", n, recorded), n >= 10 || recorded > downAfter
		})
		b.writeRounds(t, 2, keys)
		testenv.Await(t, "another pause, with the new messages fetched", func() (any, bool) {
			n, recorded := r.Stats().Outages, r.Stats().Published
			return fmt.Sprintf("%d pauses, %d recorded published", n, recorded), n >= 12 || recorded > downAfter
		})
		st := b.status(t)
		if n := len(pub.Messages()); n != downAfter || st.Published != downAfter {
			t.Errorf("during the outage: %d confirmed, %d recorded published; want %d and %d", n, st.Published, downAfter, downAfter)
		}
		if st.Retrying != 0 || st.Dead != 0 {
			t.Errorf("during the outage: %d messages with an attempt counted, %d dead; want none", st.Retrying, st.Dead)
		}

		down.Store(false)
		b.awaitPublished(t, pub)
		got := pub.Messages()
		if dups := b.checkHistory(t, got); dups != 0 {
			t.Errorf("%d duplicates; an outage confirms nothing, so nothing is sent twice", dups)
		}
		for _, m := range got {
			if m.Attempts != 0 {
				t.Errorf("%s published with %d attempts counted; outages count none", m.Payload, m.Attempts)
			}
		}
		if s := r.Stats(); s.Rejected != 0 || s.DeadLettered != 0 {
			t.Errorf("relay stats %+v; want no rejection and no dead letter", s)
		}
		if st := b.status(t); st.Dead != 0 {
			t.Errorf("%d dead letters after an outage", st.Dead)
		}
	})
}

// TestMemRelayPoisonDeadLettered: the broker always rejects bad#0. It is tried
// MaxAttempts times with backoff and dead-lettered, with its attempts and the broker's
// error; its key's later messages are sent only after its last attempt, and then
// published. Other keys are not held back while it retries: messages written after its
// first rejection are published before its second attempt.
func TestMemRelayPoisonDeadLettered(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupMem(t)
		const maxAttempts = 3
		poison := memEvent{"bad", 0}
		var mu sync.Mutex
		tries := 0                     // attempts of the poison
		triesWhenSent := map[int]int{} // bad#n (n > 0) -> tries when it was first sent
		pub := &outboxtest.Publisher{Fail: func(m *outbox.Message) error {
			ev, _ := memEventOf(m)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case ev == poison:
				tries++
				return errors.New("test: broker rejects this message")
			case ev.Key == poison.Key:
				if _, ok := triesWhenSent[ev.N]; !ok {
					triesWhenSent[ev.N] = tries
				}
			}
			return nil
		}}
		poisonTries := func() int { mu.Lock(); defer mu.Unlock(); return tries }

		b.mustWrite(t, "bad")
		b.writeRounds(t, 2, memKeys("good", 20))
		b.mustWrite(t, "bad", "good0")
		b.mustWrite(t, "bad")
		r := b.relay(t, pub, outbox.RelayConfig{ID: "r", MaxAttempts: maxAttempts, PollInterval: 100 * time.Millisecond,
			RetryMinDelay: time.Second, RetryMaxDelay: 4 * time.Second})
		testenv.Await(t, "the good messages published and the poison rejected once", func() (any, bool) {
			n, tried := len(pub.Messages()), poisonTries()
			return fmt.Sprintf("%d published, poison tried %d times", n, tried), n >= 41 && tried >= 1
		})
		// The poison backs off for at least RetryMinDelay: messages written now go first.
		b.writeRounds(t, 1, memKeys("later", 20))
		pub.Await(t, 61)
		if tried, st := poisonTries(), b.status(t); tried != 1 || st.Dead != 0 {
			t.Errorf("when the messages written after its first rejection were published, the poison was tried %d times and %d messages were dead; want 1 and none (other keys waited for it)",
				tried, st.Dead)
		}

		testenv.Await(t, "the poison dead-lettered", func() (any, bool) {
			st := b.status(t)
			return fmt.Sprintf("%d dead, poison tried %d times", st.Dead, poisonTries()), st.Dead == 1
		})
		b.awaitPublished(t, pub, poison)
		if dups := b.checkHistory(t, pub.Messages(), poison); dups != 0 {
			t.Errorf("%d duplicates", dups)
		}
		mu.Lock()
		for n := 1; n <= 2; n++ {
			if got := triesWhenSent[n]; got != maxAttempts {
				t.Errorf("bad#%d sent after %d attempts of the poison; want after its last (%d)", n, got, maxAttempts)
			}
		}
		mu.Unlock()
		dead, err := b.store.DeadList(context.Background(), outboxdriver.DeadFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(dead) != 1 || string(dead[0].Payload) != poison.String() || dead[0].Attempts != maxAttempts ||
			!strings.Contains(dead[0].LastError, "broker rejects this message") {
			t.Errorf("dead letters %+v; want the poison alone, with %d attempts and the broker's error", dead, maxAttempts)
		}
		if s := r.Stats(); s.DeadLettered != 1 || s.Rejected != maxAttempts-1 {
			t.Errorf("relay stats %+v; want 1 dead-lettered and %d rejected", s, maxAttempts-1)
		}
	})
}

// TestMemRelayStopDrainsInFlight: Stop is called while a publish of relay A hangs at the
// broker and A has a backlog; Stop does not return until that publish is confirmed and
// recorded, and A's leases are given back, so that B, started after, takes every shard
// at once (not after the lease TTL) and publishes the backlog and what was written
// since. A graceful stop leaves nothing confirmed unrecorded: no duplicate.
func TestMemRelayStopDrainsInFlight(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupMem(t)
		pub := &outboxtest.Publisher{}
		trigger := memEvent{"k0", 2}
		gate := newGatedPublisher(slowPublisher{pub: pub, delay: 50 * time.Millisecond},
			func(m *outbox.Message) bool { ev, _ := memEventOf(m); return ev == trigger })
		keys := memKeys("k", 30)
		b.writeRounds(t, 8, keys)
		if err := b.write(true, keys[:5]...); err != nil {
			t.Fatal(err)
		}
		const ttl = time.Minute
		a := b.relay(t, gate, outbox.RelayConfig{ID: "a", LeaseTTL: ttl, MaxInFlight: 8, PublishBatchSize: 4})
		t.Cleanup(gate.open)
		testenv.AwaitChan(t, "A to send "+trigger.String(), gate.holding, func() any { return len(pub.Messages()) })

		stopped := make(chan error, 1)
		go func() {
			ctx, cancel := testenv.CallContext()
			defer cancel()
			stopped <- a.Stop(ctx)
		}()
		synctest.Wait() // everything that can happen without the held batch has happened
		select {
		case err := <-stopped:
			t.Fatalf("Stop returned (%v) while a publish hung at the broker", err)
		default:
		}
		gate.open()
		if err := testenv.AwaitRecv(t, "A's Stop", stopped); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		stoppedAt := time.Now()

		confirmed := map[int64]bool{}
		for _, m := range pub.Messages() {
			confirmed[m.Seq] = true
		}
		for _, s := range gate.heldSeqs() {
			if !confirmed[s] {
				t.Errorf("seq %d, held at the broker when Stop was called, was not confirmed before Stop returned", s)
			}
		}
		st := b.status(t)
		if st.Published != int64(len(confirmed)) {
			t.Errorf("after Stop: %d messages confirmed by the broker, %d recorded published; want all recorded", len(confirmed), st.Published)
		}
		if st.Pending == 0 || st.ShardsLeased != 0 || slices.ContainsFunc(st.Relays, func(r outboxdriver.RelayInfo) bool { return r.Live }) {
			t.Errorf("after Stop: %d pending, %d shards leased, relays %+v; want a backlog, no lease and no live relay", st.Pending, st.ShardsLeased, st.Relays)
		}
		t.Logf("A stopped with %d pending: %+v", st.Pending, a.Stats())

		b.writeRounds(t, 2, keys)
		bRelay := b.relay(t, pub, outbox.RelayConfig{ID: "b", LeaseTTL: ttl})
		testenv.Await(t, "B to take every shard", holdsShards(bRelay, 64))
		if took := time.Since(stoppedAt); took >= ttl/2 {
			t.Errorf("B took the shards %v after A stopped; want at once: A gives its leases back", took)
		}
		b.awaitPublished(t, pub)
		if dups := b.checkHistory(t, pub.Messages()); dups != 0 {
			t.Errorf("%d duplicates after a graceful stop; want none", dups)
		}
	})
}

// TestMemRelayManyKeysAcrossRelays: three writers commit and roll back transactions over
// 60 keys and one hot key (in every transaction of one writer), while relays come and go:
// two at first, a third joins, the first stops. Some messages, the hot key's among them,
// are rejected once; one transaction inserted first commits last. Every committed message
// is published once, each key's in order, and no rolled-back one.
func TestMemRelayManyKeysAcrossRelays(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupMem(t)
		rejected := map[memEvent]bool{} // the Publisher calls Fail under its lock
		pub := &outboxtest.Publisher{Fail: func(m *outbox.Message) error {
			ev, _ := memEventOf(m)
			if (ev.Key == "hot" && ev.N%10 == 3 || ev.N%13 == 7) && !rejected[ev] {
				rejected[ev] = true
				return errors.New("test: rejected once")
			}
			return nil
		}}
		cfg := outbox.RelayConfig{PollInterval: 50 * time.Millisecond, RetryMinDelay: 50 * time.Millisecond, RetryMaxDelay: 200 * time.Millisecond,
			BatchSize: 50, MaxInFlight: 40, PublishBatchSize: 10}
		start := func(id string) *outbox.Relay {
			c := cfg
			c.ID = id
			return b.relay(t, pub, c)
		}
		relays := []*outbox.Relay{start("r0"), start("r1")}

		late, err := b.begin("late") // inserted first (the lowest seq), committed last
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = late.tx.Rollback() })

		const writers, keysEach, txEach = 3, 20, 60
		load := func(phase int) {
			var wg sync.WaitGroup
			for w := range writers {
				wg.Go(func() {
					for i := range txEach {
						var keys []string
						for j := range 1 + (i+w)%4 {
							keys = append(keys, fmt.Sprintf("w%d-k%d", w, (i*3+j*7+phase)%keysEach))
						}
						if w == 0 {
							keys = append(keys, "hot")
						}
						slices.Sort(keys)
						keys = slices.Compact(keys)
						if err := b.write(i%5 == 4, keys...); err != nil {
							t.Errorf("writer %d: %v", w, err)
							return
						}
					}
				})
			}
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
		}
		load(0)
		relays = append(relays, start("r2"))
		load(1)
		sctx, cancel := testenv.CallContext()
		err = relays[0].Stop(sctx)
		cancel()
		if err != nil {
			t.Fatalf("stop r0: %v", err)
		}
		load(2)

		b.awaitPublished(t, pub)
		if err := b.end(late, true); err != nil {
			t.Fatal(err)
		}
		b.awaitPublished(t, pub)
		dups := b.checkHistory(t, pub.Messages())
		var shares []string
		for _, r := range relays {
			s := r.Stats()
			shares = append(shares, fmt.Sprintf("%s published=%d rejected=%d", r.ID(), s.Published, s.Rejected))
		}
		t.Logf("relays: %s", strings.Join(shares, ", "))
		if dups != 0 {
			t.Errorf("%d duplicates; with no lease lost, none is expected", dups)
		}
		if st := b.status(t); st.Dead != 0 || st.Published != int64(len(b.ledger.committed)) {
			t.Errorf("store after the drain: %d dead, %d published; want none dead and the %d committed", st.Dead, st.Published, len(b.ledger.committed))
		}
	})
}

// TestMemRelayLeaseFailuresLoggedSparingly: lease rounds failing in a row are retried
// within a fifth of a second; the log says so at the first failure and then once per ten
// seconds, with the count, not at every round, and says when a round succeeds again.
func TestMemRelayLeaseFailuresLoggedSparingly(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupMem(t)
		store := &cutStore{Store: b.store}
		var log testenv.Buffer
		r := b.relayOn(t, context.Background(), store, &outboxtest.Publisher{},
			outbox.RelayConfig{ID: "r", Logger: slog.New(slog.NewTextHandler(&log, nil))})
		testenv.Await(t, "the relay to lease every shard", holdsShards(r, 64))
		store.cut.Store(true)
		time.Sleep(25 * time.Second) // the bubble's clock: no wall time passes
		synctest.Wait()
		failed := strings.Count(log.String(), "lease renewal failed")
		store.cut.Store(false)
		testenv.Await(t, "a lease round to succeed again", func() (any, bool) {
			return log.String(), strings.Contains(log.String(), "lease renewal succeeded again")
		})
		// Failures at 0 s (or just after), ~10 s and ~20 s of the cut.
		if failed != 3 {
			t.Errorf("%d lines for 25 s of failed lease rounds, want 3 (the first, then one per 10 s):\n%s", failed, log.String())
		}
		if !strings.Contains(log.String(), "consecutive=1\n") {
			t.Errorf("the first failure's line lacks consecutive=1:\n%s", log.String())
		}
	})
}

// TestMemRelayPriorities: a backlog's higher-priority messages are published ahead of it,
// while every key's order holds: a critical message of a key with an older ordinary
// message waits for it, and one behind a message waiting for its retry waits for that.
func TestMemRelayPriorities(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupMem(t)
		w, err := outbox.NewWriter(b.store, outbox.WriterConfig{Priorities: map[string]int{"critical": 5}})
		if err != nil {
			t.Fatal(err)
		}
		b.w = w
		rejected := false // the Publisher calls Fail under its lock
		pub := &outboxtest.Publisher{Fail: func(m *outbox.Message) error {
			if ev, _ := memEventOf(m); ev == (memEvent{"slow", 0}) && !rejected {
				rejected = true
				return errors.New("test: rejected once")
			}
			return nil
		}}

		// The backlog: ordinary messages of 200 keys, "mix" and "slow" among them;
		// then critical ones, of keys of their own and of "mix" and "slow".
		background := memKeys("bg", 200)
		b.mustWrite(t, "slow", "mix")
		b.writeRounds(t, 10, background)
		b.topic = func(string) string { return "critical" }
		critical := memKeys("crit", 50)
		b.writeRounds(t, 2, append(critical, "mix", "slow"))

		cfg := outbox.RelayConfig{PollInterval: 50 * time.Millisecond, RetryMinDelay: time.Second, RetryMaxDelay: time.Second,
			BatchSize: 50, MaxInFlight: 20, PublishBatchSize: 10}
		b.relay(t, pub, cfg)
		b.awaitPublished(t, pub)
		got := pub.Messages()
		if dups := b.checkHistory(t, got); dups != 0 {
			t.Errorf("%d duplicates; with no lease lost, none is expected", dups)
		}
		// The critical messages of keys of their own go ahead of the backlog: all of
		// them within its first quarter (a batch of ordinary ones was fetched before the
		// backlog was known, and the hand's ordinary messages go first).
		last := -1
		for i := range got {
			if strings.HasPrefix(got[i].Key, "crit") {
				last = i
			}
		}
		if quarter := len(got) / 4; last < 0 || last >= quarter {
			t.Errorf("the last critical message was confirmed %d-th of %d; want within the first %d", last+1, len(got), quarter)
		}
	})
}
