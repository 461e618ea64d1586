package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testdb"
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
	if err := b.Pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (b *relayBundle) relay(t *testing.T, store outbox.Store, pub outbox.Publisher, cfg outbox.RelayConfig) *outbox.Relay {
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
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	return r
}

// waitUntil polls cond until it holds or d passes.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
				rs = append(rs, b.relay(t, nil, pub, outbox.RelayConfig{ID: fmt.Sprintf("r%d", i), LeaseTTL: 3 * time.Second}))
			}
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
						b.Write(t, batch...)
					}
				}()
			}
			wg.Wait()
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			got, err := pub.WaitFor(ctx, events)
			if err != nil {
				t.Fatalf("published %d of %d: %v", len(got), events, err)
			}
			waitUntil(t, 30*time.Second, "all rows marked", func() bool {
				return b.scalar(t, `SELECT count(*) FROM %s`) == 0
			})
			got = pub.Messages()
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := pub.WaitFor(ctx, 50)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range got {
		if m.Key == "bad" {
			t.Fatalf("a message of the poisoned key was published before the poison was dead-lettered: %s", m.Payload)
		}
	}
	got, err = pub.WaitFor(ctx, 51)
	if err != nil {
		t.Fatal(err)
	}
	if last := got[len(got)-1]; string(last.Payload) != `"after poison"` {
		t.Fatalf("last published %s, want the poisoned key's next message", last.Payload)
	}
	var attempts int
	var lastErr string
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
	if n, err := b.Driver.DeadReplay(ctx, outbox.DeadFilter{IDs: []outbox.ID{poison}}); err != nil || n != 1 {
		t.Fatalf("replay: %d, %v", n, err)
	}
	got, err = pub.WaitFor(ctx, 52)
	if err != nil {
		t.Fatal(err)
	}
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
	waitUntil(t, 10*time.Second, "several outages", func() bool { return r.Stats().Outages >= 5 })
	if n := b.scalar(t, `SELECT count(*) FROM %[1]s WHERE attempts > 0`) + b.scalar(t, `SELECT count(*) FROM %[1]s_dead`); n != 0 {
		t.Fatalf("%d messages had attempts counted during an outage", n)
	}
	down.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got, err := pub.WaitFor(ctx, 20)
	if err != nil {
		t.Fatal(err)
	}
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
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := pub.WaitFor(wctx, 10); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the relay has moved past the early row's seq
	if err := early.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := pub.WaitFor(wctx, 11)
	if err != nil {
		t.Fatalf("the late-committing message was never published: %v", err)
	}
	if string(got[10].Payload) != `"inserted first, committed last"` {
		t.Fatalf("got %s", got[10].Payload)
	}
}

// pausableStore lets a test freeze one relay's database access, like a process stopped
// with SIGSTOP, while other relays go on.
type pausableStore struct {
	outbox.Store
	mu     sync.Mutex
	paused chan struct{}
}

func (p *pausableStore) gate() {
	p.mu.Lock()
	ch := p.paused
	p.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

func (p *pausableStore) pause() {
	p.mu.Lock()
	p.paused = make(chan struct{})
	p.mu.Unlock()
}

func (p *pausableStore) resume() {
	p.mu.Lock()
	close(p.paused)
	p.paused = nil
	p.mu.Unlock()
}

func (p *pausableStore) SyncLeases(ctx context.Context, r outbox.LeaseRequest) (outbox.LeaseState, error) {
	p.gate()
	return p.Store.SyncLeases(ctx, r)
}

func (p *pausableStore) Complete(ctx context.Context, c outbox.Completion) ([]int64, error) {
	p.gate()
	return p.Store.Complete(ctx, c)
}

// TestRelayZombieFenced: relay A confirms messages with the broker, then freezes (its
// lease renewals and outcome writes hang, as in a stop-the-world pause) past its lease;
// B takes the shards over and publishes; when A wakes, its late outcomes are refused, and
// per-key order (first deliveries) holds.
func TestRelayZombieFenced(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	pub := &outboxtest.Publisher{}
	zs := &pausableStore{Store: b.Driver}
	ttl := 3 * time.Second
	a := b.relay(t, zs, pub, outbox.RelayConfig{ID: "zombie", LeaseTTL: ttl, PublishBatchSize: 10, MaxInFlight: 20})
	waitUntil(t, 10*time.Second, "A holds every shard", func() bool { return a.Stats().Shards == 64 })
	zs.pause()
	var msgs []outbox.Message
	for i := 0; i < 200; i++ {
		msgs = append(msgs, outbox.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%10), Payload: []byte(strconv.Itoa(i))})
	}
	b.Write(t, msgs...)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := pub.WaitFor(ctx, 10); err != nil {
		t.Fatalf("A confirmed nothing before freezing: %v", err)
	}
	inHand := len(pub.Messages())
	time.Sleep(ttl + 500*time.Millisecond) // A's leases expire in database time
	bRelay := b.relay(t, nil, pub, outbox.RelayConfig{ID: "successor", LeaseTTL: ttl})
	waitUntil(t, 20*time.Second, "B publishes everything", func() bool {
		return b.scalar(t, `SELECT count(*) FROM %s`) == 0
	})
	zs.resume()
	waitUntil(t, 10*time.Second, "A's late outcomes refused", func() bool { return a.Stats().Refused > 0 })
	waitUntil(t, 10*time.Second, "A notices it lost its leases", func() bool { return a.Stats().Shards == 0 })
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
	a, err := outbox.NewRelay(b.Driver, pub, outbox.RelayConfig{ID: "a", LeaseTTL: ttl, PollInterval: 50 * time.Millisecond, Logger: testdb.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctxA); err != nil {
		t.Fatal(err)
	}
	bRelay := b.relay(t, nil, pub, outbox.RelayConfig{ID: "b", LeaseTTL: ttl})
	waitUntil(t, 10*time.Second, "both hold shards", func() bool { return a.Stats().Shards > 0 && bRelay.Stats().Shards > 0 })
	stop := make(chan struct{})
	var wg sync.WaitGroup
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
				b.Write(t, msgs...)
			}
		}()
	}
	time.Sleep(time.Second)
	killA()
	<-a.Stopped()
	time.Sleep(ttl + time.Second)
	close(stop)
	wg.Wait()
	waitUntil(t, 30*time.Second, "everything published", func() bool { return b.scalar(t, `SELECT count(*) FROM %s`) == 0 })
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
	outbox.Store
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

func (s *heldFetchStore) Fetch(ctx context.Context, req outbox.FetchRequest) ([]*outbox.Message, error) {
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

func (s *heldFetchStore) SyncLeases(ctx context.Context, r outbox.LeaseRequest) (outbox.LeaseState, error) {
	if s.failLeases.Load() {
		return outbox.LeaseState{}, errors.New("test: lease renewal fails")
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
	waitUntil(t, 10*time.Second, "the relay holds every shard", func() bool { return r.Stats().Shards == 64 })

	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte("1")})
	select {
	case <-inFlight1:
	case <-time.After(10 * time.Second):
		t.Fatal("message 1 was not sent")
	}
	holding, release := store.arm()
	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte("2")}, outbox.Message{Topic: "t", Key: "k", Payload: []byte("3")})
	select {
	case <-holding: // a fetch that excluded message 1 (in hand) returned 2 and 3
	case <-time.After(10 * time.Second):
		t.Fatal("no fetch returned messages 2 and 3")
	}
	store.failLeases.Store(true)
	time.Sleep(ttl) // the leases lapse locally: nothing may be sent
	close(release1) // message 1 fails with an outage and is dropped from hand
	waitUntil(t, 10*time.Second, "the outage", func() bool { return r.Stats().Outages >= 1 })
	time.Sleep(50 * time.Millisecond)
	close(release) // the fetch returns 2 and 3
	store.failLeases.Store(false)
	waitUntil(t, 20*time.Second, "everything published", func() bool {
		return b.scalar(t, `SELECT count(*) FROM %s`) == 0
	})
	got := pub.Messages()
	var order []string
	for _, m := range got {
		order = append(order, string(m.Payload))
	}
	if _, violations := orderCheck(got); violations != 0 {
		t.Fatalf("published out of order: %v", order)
	}
}
