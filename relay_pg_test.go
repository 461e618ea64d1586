package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxtest"
)

type relayBundle struct{ *testdb.DB }

func setupRelay(t *testing.T) *relayBundle {
	t.Helper()
	return &relayBundle{testdb.Migrated(t)}
}

func (b *relayBundle) scalar(t testing.TB, query string) int {
	t.Helper()
	var n int
	q := fmt.Sprintf(query, fmt.Sprintf(`"%s".outbox`, b.Schema))
	ctx, cancel := testenv.CallContext() // scalar also serves polls: no context outlives its call
	defer cancel()
	if err := b.Pool.QueryRow(ctx, q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// tryWrite commits msgs in one transaction and returns what failed: for writer
// goroutines, which must not call t.Fatal (b.Write does).
func (b *relayBundle) tryWrite(msgs ...outbox.Message) error {
	ctx, cancel := testenv.CallContext()
	defer cancel()
	return pgx.BeginFunc(ctx, b.Pool, func(tx pgx.Tx) error { return b.Writer.Write(ctx, tx, msgs...) })
}

func (b *relayBundle) relay(t *testing.T, store outboxdriver.Store, pub outbox.Publisher, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testdb.Logger()
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 50 * time.Millisecond
	}
	if store == nil {
		store = b.Driver
	}
	r, err := outbox.NewRelay(store, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(testenv.Context(t)) })
	return r
}

// awaitDrained waits until the outbox has no pending row. It fails the test only when
// the count of pending rows stops moving for testenv.Stall(), however long the drain takes.
func (b *relayBundle) awaitDrained(t *testing.T, what string) {
	t.Helper()
	testenv.Await(t, what, func() (any, bool) {
		n := b.scalar(t, `SELECT count(*) FROM %s`)
		return fmt.Sprintf("%d rows pending", n), n == 0
	})
}

// orderCheck verifies a confirmation history: no duplicates, and per key the outbox seqs
// appear in increasing order (first occurrences).
func orderCheck(msgs []outbox.Message) (dups, violations int) {
	seen := map[int64]bool{}
	last := map[string]int64{}
	for _, m := range msgs {
		if seen[m.Seq] {
			dups++
			continue
		}
		seen[m.Seq] = true
		if m.Key != "" {
			if m.Seq < last[m.Key] {
				violations++
			}
			last[m.Key] = m.Seq
		}
	}
	return dups, violations
}

// TestRelayScaleOut runs 2 and 4 relays on 50,000 events over 1,000 keys written while
// they run: every event published once, per-key order kept.
func TestRelayScaleOut(t *testing.T) {
	for _, relays := range []int{2, 4} {
		t.Run(strconv.Itoa(relays), func(t *testing.T) {
			const events, keys, writers = 50_000, 1_000, 4
			b := setupRelay(t)
			pub := &outboxtest.Publisher{}
			var rs []*outbox.Relay
			for i := 0; i < relays; i++ {
				// A lease lost to a stall of the machine may duplicate messages by design,
				// and this test counts duplicates: the TTL is far above any stall.
				rs = append(rs, b.relay(t, nil, pub, outbox.RelayConfig{ID: fmt.Sprintf("r%d", i), LeaseTTL: time.Minute}))
			}
			// The relays share the shards before the writes: else a fast machine drains
			// everything through the first relay before the others' rounds take a share.
			testenv.Await(t, "every relay to hold a share of the shards", func() (any, bool) {
				var held []int64
				for _, r := range rs {
					held = append(held, r.Stats().Shards)
				}
				return fmt.Sprint(held), !slices.Contains(held, 0)
			})
			// Writers own disjoint keys, so each key's writes are serialized as an
			// application holding the aggregate's lock would serialize them.
			var wg sync.WaitGroup
			for w := 0; w < writers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					per := events / writers
					for i := 0; i < per; i += 100 {
						batch := make([]outbox.Message, 0, 100)
						for j := i; j < i+100; j++ {
							key := fmt.Sprintf("k%d", ((j*writers)+w)%keys)
							batch = append(batch, outbox.Message{Topic: "t", Key: key, Payload: []byte(strconv.Itoa(j))})
						}
						if err := b.tryWrite(batch...); err != nil {
							t.Errorf("writer %d: %v", w, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
			pub.Await(t, events)
			b.awaitDrained(t, "all rows marked published")
			got := pub.Messages()
			dups, violations := orderCheck(got)
			var shares []int64
			for _, r := range rs {
				shares = append(shares, r.Stats().Published)
			}
			t.Logf("relays=%d events=%d delivered=%d dup=%d order=%d per_relay=%v", relays, events, len(got), dups, violations, shares)
			if dups != 0 || violations != 0 || len(got) != events {
				t.Fatalf("dup=%d order=%d delivered=%d, want 0, 0, %d", dups, violations, len(got), events)
			}
			for i, s := range shares {
				if s == 0 {
					t.Errorf("relay %d published nothing: shards not shared", i)
				}
			}
		})
	}
}

// TestRelayPoisonDeadLetter: a message the broker always rejects is dead-lettered after
// MaxAttempts while other keys, and later messages of other keys, keep flowing; its own
// key's later message waits behind it and follows once it is dead.
// TestRelayPermanentRejection: a rejection wrapped with Permanent dead-letters the message
// on its first attempt, and its key goes on.
func TestRelayPermanentRejection(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	bad := outbox.NewID()
	pub := &outboxtest.Publisher{Fail: func(m *outbox.Message) error {
		if m.ID == bad {
			return outbox.Permanent(errors.New("subject reserved"))
		}
		return nil
	}}
	b.Write(t,
		outbox.Message{ID: bad, Topic: "t", Key: "k", Payload: []byte(`"unpublishable"`)},
		outbox.Message{Topic: "t", Key: "k", Payload: []byte(`"next"`)},
	)
	r := b.relay(t, nil, pub, outbox.RelayConfig{MaxAttempts: 10, RetryMinDelay: time.Hour, RetryMaxDelay: time.Hour})
	if got := pub.Await(t, 1); string(got[0].Payload) != `"next"` { // with a retry, it would wait an hour
		t.Fatalf("published %s, want the key's next message", got[0].Payload)
	}
	var attempts int
	q := fmt.Sprintf(`SELECT attempts FROM "%s".outbox_dead WHERE id = $1`, b.Schema)
	if err := b.Pool.QueryRow(testenv.Context(t), q, [16]byte(bad)).Scan(&attempts); err != nil || attempts != 1 {
		t.Fatalf("dead letter: attempts %d, %v; want 1 attempt", attempts, err)
	}
	if s := r.Stats(); s.DeadLettered != 1 || s.Rejected != 0 {
		t.Fatalf("stats %+v, want 1 dead and none rejected", s)
	}
}

func TestRelayPoisonDeadLetter(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	poison := outbox.NewID()
	pub := &outboxtest.Publisher{Fail: func(m *outbox.Message) error {
		if m.ID == poison {
			return errors.New("broker says: message rejected")
		}
		return nil
	}}
	b.Write(t,
		outbox.Message{ID: poison, Topic: "t", Key: "bad", Payload: []byte(`"poison"`)},
		outbox.Message{Topic: "t", Key: "bad", Payload: []byte(`"after poison"`)},
	)
	for i := 0; i < 50; i++ {
		b.Write(t, outbox.Message{Topic: "t", Key: fmt.Sprintf("good-%d", i), Payload: []byte(`"ok"`)})
	}
	r := b.relay(t, nil, pub, outbox.RelayConfig{MaxAttempts: 3, RetryMinDelay: 100 * time.Millisecond, RetryMaxDelay: 200 * time.Millisecond})
	got := pub.Await(t, 50)
	for _, m := range got {
		if m.Key == "bad" {
			t.Fatalf("a message of the poisoned key was published before the poison was dead-lettered: %s", m.Payload)
		}
	}
	got = pub.Await(t, 51)
	if last := got[len(got)-1]; string(last.Payload) != `"after poison"` {
		t.Fatalf("last published %s, want the poisoned key's next message", last.Payload)
	}
	var attempts int
	var lastErr string
	ctx := testenv.Context(t)
	q := fmt.Sprintf(`SELECT attempts, last_error FROM "%s".outbox_dead WHERE id = $1`, b.Schema)
	if err := b.Pool.QueryRow(ctx, q, [16]byte(poison)).Scan(&attempts, &lastErr); err != nil {
		t.Fatalf("poison not in the dead-letter view: %v", err)
	}
	if attempts != 3 || lastErr != "broker says: message rejected" {
		t.Fatalf("attempts=%d last_error=%q, want 3 and the broker's error", attempts, lastErr)
	}
	if s := r.Stats(); s.DeadLettered != 1 || s.Rejected != 2 {
		t.Fatalf("stats %+v, want 1 dead and 2 rejected", s)
	}
	// Replay keeps the id: consumers deduplicate on it.
	pub.Fail = nil
	if n, err := b.Driver.DeadReplay(ctx, outboxdriver.DeadFilter{IDs: []outbox.ID{poison}}); err != nil || n != 1 {
		t.Fatalf("replay: %d, %v", n, err)
	}
	got = pub.Await(t, 52)
	if got[51].ID != poison {
		t.Fatalf("replayed message has id %s, want %s", got[51].ID, poison)
	}
}

// TestRelayOutageBurnsNoAttempts: while the broker is down every publish fails as an
// outage; no attempt is counted and everything is published after recovery.
func TestRelayOutageBurnsNoAttempts(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	var down atomic.Bool
	down.Store(true)
	pub := &outboxtest.Publisher{Fail: func(*outbox.Message) error {
		if down.Load() {
			return outbox.Outage(errors.New("connection refused"))
		}
		return nil
	}}
	for i := 0; i < 20; i++ {
		b.Write(t, outbox.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%3), Payload: []byte(strconv.Itoa(i))})
	}
	r := b.relay(t, nil, pub, outbox.RelayConfig{MaxAttempts: 2, OutageMinDelay: 10 * time.Millisecond, OutageMaxDelay: 50 * time.Millisecond})
	testenv.Await(t, "several outages", func() (any, bool) {
		n := r.Stats().Outages
		return fmt.Sprintf("%d outages", n), n >= 5
	})
	if n := b.scalar(t, `SELECT count(*) FROM %[1]s WHERE attempts > 0`) + b.scalar(t, `SELECT count(*) FROM %[1]s_dead`); n != 0 {
		t.Fatalf("%d messages had attempts counted during an outage", n)
	}
	down.Store(false)
	got := pub.Await(t, 20)
	if dups, order := orderCheck(got); dups != 0 || order != 0 {
		t.Fatalf("dup=%d order=%d", dups, order)
	}
}

// TestRelayDestinationOutageHoldsOnlyItself: messages whose destination is unavailable
// wait, with no attempt counted, while the other destinations' messages are published and
// the relay never pauses; once the destination is back its messages go, in key order.
func TestRelayDestinationOutageHoldsOnlyItself(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	var down atomic.Bool
	down.Store(true)
	pub := &outboxtest.Publisher{Fail: func(m *outbox.Message) error {
		if m.Topic == "down" && down.Load() {
			return outbox.DestinationOutage("queue down", errors.New("no such queue"))
		}
		return nil
	}}
	for i := 0; i < 30; i++ {
		topic := "up"
		if i%3 == 0 {
			topic = "down"
		}
		b.Write(t, outbox.Message{Topic: topic, Key: fmt.Sprintf("%s-k%d", topic, i%2), Payload: []byte(strconv.Itoa(i))})
	}
	r := b.relay(t, nil, pub, outbox.RelayConfig{MaxAttempts: 2, RetryMinDelay: 20 * time.Millisecond, RetryMaxDelay: 100 * time.Millisecond})
	// The other destination's 20 messages go while "down" fails.
	testenv.Await(t, "the 20 messages of the other destination", func() (any, bool) {
		n := len(pub.Messages())
		return fmt.Sprintf("%d published", n), n >= 20
	})
	testenv.Await(t, "the deferred messages to be retried", func() (any, bool) {
		n := b.scalar(t, `SELECT count(*) FROM %[1]s WHERE last_error <> ''`)
		return fmt.Sprintf("%d with an error recorded", n), n > 0
	})
	if n := r.Stats().Outages; n != 0 {
		t.Fatalf("the relay paused %d times for one destination's outage", n)
	}
	if n := b.scalar(t, `SELECT count(*) FROM %[1]s WHERE attempts > 0`) + b.scalar(t, `SELECT count(*) FROM %[1]s_dead`); n != 0 {
		t.Fatalf("%d messages had attempts counted or were dead-lettered for their destination's outage", n)
	}
	for _, m := range pub.Messages() {
		if m.Topic == "down" {
			t.Fatalf("a message of the unavailable destination was confirmed: %s", m.Payload)
		}
	}
	down.Store(false)
	got := pub.Await(t, 30)
	if dups, order := orderCheck(got); dups != 0 || order != 0 {
		t.Fatalf("dup=%d order=%d", dups, order)
	}
}

// TestRelayCommitOrderTrap: a transaction that inserted first but commits last is still
// published (a cursor over ids would skip it).
func TestRelayCommitOrderTrap(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	ctx := context.Background()
	pub := &outboxtest.Publisher{}
	b.relay(t, nil, pub, outbox.RelayConfig{})
	early, err := b.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer early.Rollback(ctx)
	if err := b.Writer.Write(ctx, early, outbox.Message{Topic: "t", Key: "a", Payload: []byte(`"inserted first, committed last"`)}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		b.Write(t, outbox.Message{Topic: "t", Key: fmt.Sprintf("b%d", i), Payload: []byte(`"later"`)})
	}
	pub.Await(t, 10)
	// Once their outcomes are recorded, the relay has fetched, sent and retired rows above
	// the early row's seq.
	b.awaitDrained(t, "the later messages recorded as published")
	if err := early.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := pub.Await(t, 11) // a relay that skipped the early row stalls here
	if string(got[10].Payload) != `"inserted first, committed last"` {
		t.Fatalf("got %s", got[10].Payload)
	}
}

// pausableStore lets a test freeze one relay's database access, like a process stopped
// with SIGSTOP, while other relays go on: its outcome writes first, then its lease
// renewals too.
type pausableStore struct {
	outboxdriver.Store
	mu              sync.Mutex
	completes, sync chan struct{} // closed, or nil, when calls may pass
}

func (p *pausableStore) gate(ch *chan struct{}) {
	p.mu.Lock()
	c := *ch
	p.mu.Unlock()
	if c != nil {
		<-c
	}
}

func (p *pausableStore) pause(ch *chan struct{}) {
	p.mu.Lock()
	*ch = make(chan struct{})
	p.mu.Unlock()
}

func (p *pausableStore) resume() {
	p.mu.Lock()
	for _, ch := range []*chan struct{}{&p.completes, &p.sync} {
		if *ch != nil {
			close(*ch)
			*ch = nil
		}
	}
	p.mu.Unlock()
}

func (p *pausableStore) SyncLeases(ctx context.Context, r outboxdriver.LeaseRequest) (outboxdriver.LeaseState, error) {
	p.gate(&p.sync)
	return p.Store.SyncLeases(ctx, r)
}

func (p *pausableStore) Complete(ctx context.Context, c outboxdriver.Completion) ([]int64, error) {
	p.gate(&p.completes)
	return p.Store.Complete(ctx, c)
}

// leaseWatch notes when a relay finds it has lost every lease.
type leaseWatch struct {
	outbox.NopObserver
	lostAll atomic.Bool
}

func (w *leaseWatch) LeasesChanged(e outbox.LeaseEvent) {
	if e.Held == 0 && len(e.Lost) > 0 {
		w.lostAll.Store(true)
	}
}

// TestRelayZombieFenced: relay A confirms messages with the broker, then freezes (its
// outcome writes and lease renewals hang, as in a stop-the-world pause) past its lease;
// B takes the shards over and publishes; when A wakes, its late outcomes are refused, and
// per-key order (first deliveries) holds.
func TestRelayZombieFenced(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	pub := &outboxtest.Publisher{}
	zs := &pausableStore{Store: b.Driver}
	watch := &leaseWatch{}
	a := b.relay(t, zs, pub, outbox.RelayConfig{ID: "zombie", LeaseTTL: 3 * time.Second, PublishBatchSize: 10, MaxInFlight: 20, Observer: watch})
	t.Cleanup(zs.resume) // before A's Stop, on a failure too
	testenv.Await(t, "A holds every shard", func() (any, bool) {
		n := a.Stats().Shards
		return fmt.Sprintf("%d shards", n), n == 64
	})
	// A's outcome writes hang first, while it still renews its leases, so that it sends
	// what it fetched however slowly; then its renewals hang too.
	zs.pause(&zs.completes)
	var msgs []outbox.Message
	for i := 0; i < 200; i++ {
		msgs = append(msgs, outbox.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%10), Payload: []byte(strconv.Itoa(i))})
	}
	b.Write(t, msgs...)
	pub.Await(t, 10) // confirmed by the broker, never recorded
	zs.pause(&zs.sync)
	inHand := len(pub.Messages())
	// B takes the shards once A's leases expire in database time; it keeps them (its TTL
	// is far above any stall of the machine) and publishes everything.
	bRelay := b.relay(t, nil, pub, outbox.RelayConfig{ID: "successor", LeaseTTL: time.Minute})
	b.awaitDrained(t, "B to publish everything")
	zs.resume()
	testenv.AwaitCond(t, "A's late outcomes refused", func() bool { return a.Stats().Refused > 0 })
	testenv.AwaitCond(t, "A notices it lost its leases", watch.lostAll.Load)
	got := pub.Messages()
	dups, violations := orderCheck(got)
	t.Logf("A: %+v, B: %+v, delivered=%d dup=%d confirmed_by_A_before_freeze=%d", a.Stats(), bRelay.Stats(), len(got), dups, inHand)
	if violations != 0 {
		t.Fatalf("%d per-key order violations", violations)
	}
	if a.Stats().Published != 0 {
		t.Fatalf("the zombie recorded %d outcomes after losing its lease", a.Stats().Published)
	}
	if dups > 20 {
		t.Fatalf("%d duplicates, more than A's MaxInFlight (20)", dups)
	}
}

// TestDedupConflictConcurrent: eight transactions write the same dedup key at once;
// exactly one message exists and every other writer is told.
func TestDedupConflictConcurrent(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	var dup, ok atomic.Int32
	start := make(chan struct{})
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			err := pgx.BeginFunc(ctx, b.Pool, func(tx pgx.Tx) error {
				err := b.Writer.Write(ctx, tx, outbox.Message{Topic: "t", DedupKey: "order-42:placed", Payload: []byte(`{}`)})
				if errors.Is(err, outbox.ErrDuplicate) {
					dup.Add(1)
					return nil // the caller decides: here, the work was already done
				}
				if err == nil {
					ok.Add(1)
				}
				return err
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if ok.Load() != 1 || dup.Load() != 7 {
		t.Fatalf("ok=%d dup=%d, want 1 and 7", ok.Load(), dup.Load())
	}
	if n := b.scalar(t, `SELECT count(*) FROM %s WHERE dedup_key = 'order-42:placed'`); n != 1 {
		t.Fatalf("%d rows with the dedup key", n)
	}
}

// TestRelayHardKillTakeover: relay A is killed (its context cancelled: in-flight work
// abandoned, leases left to expire) while writers keep committing; B takes A's shards
// over. Everything is published, per-key order holds.
func TestRelayHardKillTakeover(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	pub := &outboxtest.Publisher{}
	ttl := 2 * time.Second
	ctxA, killA := context.WithCancel(context.Background())
	t.Cleanup(killA)
	a, err := outbox.NewRelay(b.Driver, pub, outbox.RelayConfig{ID: "a", LeaseTTL: ttl, PollInterval: 50 * time.Millisecond, Logger: testdb.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctxA); err != nil {
		t.Fatal(err)
	}
	bRelay := b.relay(t, nil, pub, outbox.RelayConfig{ID: "b", LeaseTTL: ttl})
	testenv.Await(t, "both relays to hold shards", func() (any, bool) {
		sa, sb := a.Stats().Shards, bRelay.Stats().Shards
		return fmt.Sprintf("A %d, B %d shards", sa, sb), sa > 0 && sb > 0
	})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	stopWriters := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopWriters) // on a failure below too: the writers use t
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				msgs := make([]outbox.Message, 3)
				for j := range msgs {
					msgs[j] = outbox.Message{Topic: "t", Key: fmt.Sprintf("w%d-k%d", w, (i*3+j)%50), Payload: []byte("x")}
				}
				if err := b.tryWrite(msgs...); err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
			}
		}()
	}
	// A is killed while it publishes the writers' load, and the writers go on until B
	// has taken A's shards over.
	testenv.Await(t, "A to publish some of the load", func() (any, bool) {
		n := a.Stats().Published
		return fmt.Sprintf("A published %d", n), n >= 100
	})
	killA()
	testenv.AwaitChan(t, "A to stop once killed", a.Stopped(), func() any { return "A running" })
	testenv.Await(t, "B to take A's shards over", func() (any, bool) {
		n := bRelay.Stats().Shards
		return fmt.Sprintf("B holds %d shards", n), n == 64
	})
	stopWriters()
	b.awaitDrained(t, "everything published")
	got := pub.Messages()
	_, violations := orderCheck(got)
	t.Logf("delivered=%d order=%d A=%+v B=%+v", len(got), violations, a.Stats(), bRelay.Stats())
	if violations != 0 {
		t.Fatalf("%d per-key order violations after a takeover", violations)
	}
}

// heldFetchStore holds the first Fetch that returns rows, once armed, until released,
// and fails lease renewals on demand.
type heldFetchStore struct {
	outboxdriver.Store
	mu         sync.Mutex
	hold       chan struct{} // armed: the next Fetch with rows waits for it to close
	holding    chan struct{} // closed when a Fetch is being held
	failLeases atomic.Bool
}

func (s *heldFetchStore) arm() (holding, release chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold, s.holding = make(chan struct{}), make(chan struct{})
	return s.holding, s.hold
}

func (s *heldFetchStore) Fetch(ctx context.Context, req outboxdriver.FetchRequest) ([]*outbox.Message, error) {
	rows, err := s.Store.Fetch(ctx, req)
	s.mu.Lock()
	hold, holding := s.hold, s.holding
	if len(rows) > 0 {
		s.hold, s.holding = nil, nil
	}
	s.mu.Unlock()
	if hold != nil && len(rows) > 0 {
		close(holding)
		<-hold
	}
	return rows, err
}

func (s *heldFetchStore) SyncLeases(ctx context.Context, r outboxdriver.LeaseRequest) (outboxdriver.LeaseState, error) {
	if s.failLeases.Load() {
		return outboxdriver.LeaseState{}, errors.New("test: lease renewal fails")
	}
	return s.Store.SyncLeases(ctx, r)
}

// TestRelayDropDuringFetchKeepsOrder: a key's message in flight is dropped from hand (a
// broker outage after the relay's leases lapsed locally) while a fetch that excluded it
// runs and returns the key's next messages. Those must not be sent before it.
func TestRelayDropDuringFetchKeepsOrder(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	inFlight1, release1 := make(chan struct{}), make(chan struct{})
	var once sync.Once
	pub := &outboxtest.Publisher{Fail: func(m *outbox.Message) error {
		var first bool
		if string(m.Payload) == "1" {
			once.Do(func() { first = true })
		}
		if first {
			close(inFlight1)
			<-release1 // in flight until the test lets it fail (the publisher is locked meanwhile)
			return outbox.Outage(errors.New("test: broker outage"))
		}
		return nil
	}}
	store := &heldFetchStore{Store: b.Driver}
	ttl := 1500 * time.Millisecond
	r := b.relay(t, store, pub, outbox.RelayConfig{ID: "r", LeaseTTL: ttl, OutageMinDelay: 10 * time.Millisecond, OutageMaxDelay: 50 * time.Millisecond})
	testenv.Await(t, "the relay to hold every shard", func() (any, bool) {
		n := r.Stats().Shards
		return fmt.Sprintf("%d shards", n), n == 64
	})

	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte("1")})
	testenv.AwaitChan(t, "message 1 to be sent", inFlight1, func() any { return "not sent" })
	holding, release := store.arm()
	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte("2")}, outbox.Message{Topic: "t", Key: "k", Payload: []byte("3")})
	// A fetch that excluded message 1 (in hand) returns 2 and 3, and is held.
	testenv.AwaitChan(t, "a fetch to return messages 2 and 3", holding, func() any { return "no such fetch" })
	store.failLeases.Store(true)
	// The leases lapse locally, TTL - TTL/5 after the last renewal began at the latest
	// (this waits for time to pass, not for work): nothing may be sent.
	time.Sleep(ttl)
	close(release1) // message 1 fails with an outage and is dropped from hand
	// The relay counts the outage in the same loop step, after dropping message 1.
	testenv.AwaitCond(t, "the outage", func() bool { return r.Stats().Outages >= 1 })
	close(release) // the fetch returns 2 and 3
	store.failLeases.Store(false)
	b.awaitDrained(t, "everything published")
	got := pub.Messages()
	var order []string
	for _, m := range got {
		order = append(order, string(m.Payload))
	}
	if _, violations := orderCheck(got); violations != 0 {
		t.Fatalf("published out of order: %v", order)
	}
}

// TestRelayMaintainsPartitions: a relay whose store keeps the published history in daily
// partitions creates a missing day itself (at start, and every CleanupInterval), and its
// message ends up recorded in that day. Whether the first attempt to record it fails
// depends on which comes first; the store tests cover that path on its own
// (TestMissingPartitionKeepsPending).
func TestRelayMaintainsPartitions(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	today := "outbox_published_" + b.Today(t).Format("20060102")
	b.Exec(t, `DROP TABLE %[1]s.`+today)
	pub := &outboxtest.Publisher{}
	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`1`)})
	b.relay(t, nil, pub, outbox.RelayConfig{CleanupInterval: 100 * time.Millisecond})
	pub.Await(t, 1)
	b.awaitDrained(t, "the message recorded as published")
	if n := b.CountIn(t, today, "true"); n != 1 {
		t.Fatalf("%d rows in today's partition; want the published message", n)
	}
}
