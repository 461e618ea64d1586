package outboxtest_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/storetest"
)

type testBundle struct {
	store *outboxtest.Store
	w     *outbox.Writer[*outboxtest.Tx]
	clock *fakeClock // nil when the store runs on time.Now
}

// setup returns a fresh store on time.Now, or on a fake clock when fake is set.
func setup(t testing.TB, fake bool) *testBundle {
	t.Helper()
	b := &testBundle{}
	cfg := outboxtest.StoreConfig{}
	if fake {
		b.clock = &fakeClock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
		cfg.Now = b.clock.Now
	}
	b.store = outboxtest.NewStore(cfg)
	w, err := outbox.NewWriter(b.store, outbox.WriterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	b.w = w
	return b
}

// write writes msgs in one transaction and commits it, or rolls it back when rollback is
// set. It returns Write's error (a *outbox.DuplicateError leaves the transaction usable:
// it commits anyway).
func (b *testBundle) write(ctx context.Context, msgs []outbox.Message, rollback bool) error {
	tx := b.store.Begin()
	defer tx.Rollback()
	werr := b.w.Write(ctx, tx, msgs...)
	if rollback {
		return tx.Rollback()
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	return werr
}

func (b *testBundle) mustWrite(t testing.TB, msgs ...outbox.Message) {
	t.Helper()
	if err := b.write(testenv.Context(t), msgs, false); err != nil {
		t.Fatalf("write: %v", err)
	}
}

func (b *testBundle) sync(t testing.TB, relay string, ttl time.Duration, held []outboxdriver.Lease) outboxdriver.LeaseState {
	t.Helper()
	st, err := b.store.SyncLeases(testenv.Context(t), outboxdriver.LeaseRequest{RelayID: relay, TTL: ttl, Held: held})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (b *testBundle) fetch(t testing.TB, relay string, leases []outboxdriver.Lease, req outboxdriver.FetchRequest) []*outbox.Message {
	t.Helper()
	req.RelayID, req.Leases, req.Limit = relay, leases, 1000
	got, err := b.store.Fetch(testenv.Context(t), req)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func (b *testBundle) complete(t testing.TB, relay string, c outboxdriver.Completion) []int64 {
	t.Helper()
	c.RelayID = relay
	refused, err := b.store.Complete(testenv.Context(t), c)
	if err != nil {
		t.Fatal(err)
	}
	return refused
}

func (b *testBundle) status(t testing.TB) outboxdriver.Status {
	t.Helper()
	st, err := b.store.Status(testenv.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// fakeClock is a database clock that moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func outcome(leases []outboxdriver.Lease, m *outbox.Message) outboxdriver.Outcome {
	for _, l := range leases {
		if l.Shard == m.Shard {
			return outboxdriver.Outcome{Seq: m.Seq, Token: l.Token}
		}
	}
	return outboxdriver.Outcome{Seq: m.Seq}
}

func payloads(ms []*outbox.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = string(m.Payload)
	}
	return out
}

func msg(key, payload string) outbox.Message {
	return outbox.Message{Topic: "t", Key: key, Payload: []byte(payload)}
}

func TestStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Outbox {
		t.Parallel() // each subtest has a store of its own
		b := setup(t, false)
		return storetest.Outbox{
			Store: b.store,
			Write: b.write,
			WriteSavepoint: func(ctx context.Context, kept, rolledBack []outbox.Message) error {
				tx := b.store.Begin()
				defer tx.Rollback()
				if err := b.w.Write(ctx, tx, kept...); err != nil {
					return err
				}
				sp, err := tx.Savepoint()
				if err != nil {
					return err
				}
				if err := b.w.Write(ctx, sp, rolledBack...); err != nil {
					return err
				}
				if err := sp.Rollback(); err != nil {
					return err
				}
				return tx.Commit()
			},
		}
	})
}

// TestStoreSeqAtInsertVisibleAtCommit writes in two transactions that overlap: the one
// that inserted first and committed last holds the lower seq, and appears below a message
// already published. A continuation above the published one does not see it; a full
// fetch does.
func TestStoreSeqAtInsertVisibleAtCommit(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	ctx := testenv.Context(t)
	early := b.store.Begin()
	defer early.Rollback()
	if err := b.w.Write(ctx, early, msg("a", `"inserted first"`)); err != nil {
		t.Fatal(err)
	}
	b.mustWrite(t, msg("b", `"inserted second"`))
	st := b.sync(t, "r1", time.Minute, nil)
	got := b.fetch(t, "r1", st.Held, outboxdriver.FetchRequest{})
	if len(got) != 1 || string(got[0].Payload) != `"inserted second"` {
		t.Fatalf("fetched %v before the first transaction committed, want only the committed message", payloads(got))
	}
	second := got[0]
	if refused := b.complete(t, "r1", outboxdriver.Completion{Published: []outboxdriver.Outcome{outcome(st.Held, second)}}); len(refused) != 0 {
		t.Fatalf("refused %v", refused)
	}
	b.clock.Add(time.Second)
	if s := b.status(t); s.OldestTransactionAge != time.Second {
		t.Errorf("oldest transaction age %v with the early transaction open for 1 s of database time", s.OldestTransactionAge)
	}
	if err := early.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := b.fetch(t, "r1", st.Held, outboxdriver.FetchRequest{After: second.Seq}); len(got) != 0 {
		t.Fatalf("continuation above seq %d fetched %v: the late commit lies below it", second.Seq, payloads(got))
	}
	got = b.fetch(t, "r1", st.Held, outboxdriver.FetchRequest{})
	if len(got) != 1 || string(got[0].Payload) != `"inserted first"` || got[0].Seq >= second.Seq {
		t.Fatalf("full fetch after the late commit: %v; want the early message, under a seq below %d", payloads(got), second.Seq)
	}
	if s := b.status(t); s.OldestTransactionAge != 0 || s.Pending != 1 || s.Published != 1 {
		t.Errorf("status %+v, want no open transaction, 1 pending, 1 published", s)
	}
}

// TestStoreDedupClaimWaits checks that a dedup key claimed by an open transaction makes a
// second writer wait until that one ends: taken if it commits, free if it rolls back.
func TestStoreDedupClaimWaits(t *testing.T) {
	t.Parallel()
	keyed := func(payload string) outbox.Message {
		m := msg("a", payload)
		m.DedupKey = "order-1"
		return m
	}
	for _, tc := range []struct {
		name    string
		end     func(*outboxtest.Tx) error
		wantErr error
		want    []string
	}{
		{"holder commits", (*outboxtest.Tx).Commit, outbox.ErrDuplicate, []string{`"first"`}},
		{"holder rolls back", (*outboxtest.Tx).Rollback, nil, []string{`"second"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := setup(t, false)
				ctx := context.Background()
				first := b.store.Begin()
				if err := b.w.Write(ctx, first, keyed(`"first"`)); err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() { done <- b.write(ctx, []outbox.Message{keyed(`"second"`)}, false) }()
				synctest.Wait()
				select {
				case err := <-done:
					t.Fatalf("the second writer did not wait for the open claim: %v", err)
				default:
				}
				if err := tc.end(first); err != nil {
					t.Fatal(err)
				}
				if err := <-done; !errors.Is(err, tc.wantErr) {
					t.Fatalf("second write: %v, want %v", err, tc.wantErr)
				}
				st := b.sync(t, "r1", time.Minute, nil)
				if got := payloads(b.fetch(t, "r1", st.Held, outboxdriver.FetchRequest{})); !slices.Equal(got, tc.want) {
					t.Fatalf("fetched %v, want %v", got, tc.want)
				}
			})
		})
	}
}

// TestStoreDedupWaitEnds checks the two ways a wait for a dedup claim ends without the
// holder ending: the writer's context, and a deadlock.
func TestStoreDedupWaitEnds(t *testing.T) {
	t.Parallel()
	keyed := func(key string) outbox.Message {
		m := msg("a", `{}`)
		m.DedupKey = key
		return m
	}
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, false)
		ctx := context.Background()
		holder := b.store.Begin()
		defer holder.Rollback()
		if err := b.w.Write(ctx, holder, keyed("x")); err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		waiter := b.store.Begin()
		// Keys are claimed in sorted order: w, then x, which makes the call wait.
		if err := b.w.Write(short, waiter, keyed("x"), keyed("w")); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("write waiting past its context: %v, want context.DeadlineExceeded", err)
		}
		// The failed call gave back what it claimed: w is free for another transaction.
		short, cancel = context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := b.write(short, []outbox.Message{keyed("w")}, true); err != nil {
			t.Fatalf("w after the failed call: %v", err)
		}
		_ = waiter.Rollback()

		// holder holds x; other holds z and waits for x; holder then asks for z.
		other := b.store.Begin()
		defer other.Rollback()
		if err := b.w.Write(ctx, other, keyed("z")); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- b.w.Write(ctx, other, keyed("x")) }()
		synctest.Wait()
		if err := b.w.Write(ctx, holder, keyed("z")); err == nil || errors.Is(err, outbox.ErrDuplicate) {
			t.Fatalf("a write closing a cycle of waits: %v, want a deadlock error", err)
		}
		if err := holder.Rollback(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("the writer waiting for x after its holder rolled back: %v", err)
		}
	})
}

// TestStoreDatabaseTime drives leases, retries, DeliverAt and retention with a fake
// clock: nothing happens until the store's clock says so, however long the test runs.
func TestStoreDatabaseTime(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	delayed := msg("d", `"delayed"`)
	delayed.DeliverAt = b.clock.Now().Add(time.Hour)
	b.mustWrite(t, msg("r", `"retried"`), msg("r", `"after the retry"`), delayed)

	a := b.sync(t, "a", 10*time.Second, nil)
	got := b.fetch(t, "a", a.Held, outboxdriver.FetchRequest{})
	if !slices.Equal(payloads(got), []string{`"retried"`, `"after the retry"`}) {
		t.Fatalf("fetched %v, want the undelayed messages", payloads(got))
	}
	fail := outboxdriver.Failure{Outcome: outcome(a.Held, got[0]), Error: "no", Delay: time.Minute}
	if refused := b.complete(t, "a", outboxdriver.Completion{Failed: []outboxdriver.Failure{fail}}); len(refused) != 0 {
		t.Fatalf("refused %v", refused)
	}
	b.clock.Add(59 * time.Second) // a's leases expired, the retry not yet due
	if got := b.fetch(t, "a", a.Held, outboxdriver.FetchRequest{}); len(got) != 0 {
		t.Fatalf("fetched %v under expired leases", payloads(got))
	}
	bs := b.sync(t, "b", 10*time.Second, nil)
	if len(bs.Held) != bs.Shards || bs.Live != 1 {
		t.Fatalf("b holds %d of %d shards (live %d) after a's leases expired", len(bs.Held), bs.Shards, bs.Live)
	}
	if got := b.fetch(t, "b", bs.Held, outboxdriver.FetchRequest{}); len(got) != 0 {
		t.Fatalf("fetched %v while the retry backs off and the delayed message waits", payloads(got))
	}
	b.clock.Add(time.Second)
	got = b.fetch(t, "b", bs.Held, outboxdriver.FetchRequest{})
	if !slices.Equal(payloads(got), []string{`"retried"`, `"after the retry"`}) || got[0].Attempts != 1 {
		t.Fatalf("after the backoff fetched %v (attempts %d), want the retried message first", payloads(got), got[0].Attempts)
	}
	late := outboxdriver.Completion{Published: []outboxdriver.Outcome{outcome(a.Held, got[0])}}
	if refused := b.complete(t, "a", late); len(refused) != 1 {
		t.Fatalf("a's outcome under its expired lease: refused %v, want it refused", refused)
	}
	pub := outboxdriver.Completion{Published: []outboxdriver.Outcome{outcome(bs.Held, got[0]), outcome(bs.Held, got[1])}}
	if refused := b.complete(t, "b", pub); len(refused) != 0 {
		t.Fatalf("refused %v", refused)
	}

	b.clock.Add(time.Hour)
	bs = b.sync(t, "b", 10*time.Second, bs.Held)
	if got := b.fetch(t, "b", bs.Held, outboxdriver.FetchRequest{}); !slices.Equal(payloads(got), []string{`"delayed"`}) {
		t.Fatalf("an hour later fetched %v, want the delayed message", payloads(got))
	}
	ctx := testenv.Context(t)
	if n, err := b.store.DeletePublished(ctx, 2*time.Hour, 10); err != nil || n != 0 {
		t.Fatalf("DeletePublished of messages younger than the retention: %d, %v", n, err)
	}
	b.clock.Add(time.Hour + time.Second)
	if n, err := b.store.DeletePublished(ctx, 2*time.Hour, 10); err != nil || n != 2 {
		t.Fatalf("DeletePublished past the retention: %d, %v; want 2", n, err)
	}
}

// TestStoreCopies checks that no caller shares the store's memory: not the writer's
// message, not a fetched one, not a dead letter.
func TestStoreCopies(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	in := msg("k", `{"v":1}`)
	in.Headers = map[string]string{"h": "1"}
	tx := b.store.Begin()
	if err := b.w.Write(testenv.Context(t), tx, in); err != nil { // Write copies the Message, not its payload or headers
		t.Fatal(err)
	}
	in.Payload[0], in.Headers["h"] = 'X', "changed"
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	st := b.sync(t, "r1", time.Minute, nil)
	got := b.fetch(t, "r1", st.Held, outboxdriver.FetchRequest{})
	got[0].Payload[0], got[0].Headers["h"] = 'Y', "changed"
	again := b.fetch(t, "r1", st.Held, outboxdriver.FetchRequest{})
	if string(again[0].Payload) != `{"v":1}` || again[0].Headers["h"] != "1" {
		t.Fatalf("the stored message changed with a caller's copy: %q %v", again[0].Payload, again[0].Headers)
	}
	dead := outboxdriver.Failure{Outcome: outcome(st.Held, again[0]), Error: "no", Dead: true}
	b.complete(t, "r1", outboxdriver.Completion{Failed: []outboxdriver.Failure{dead}})
	dls, err := b.store.DeadList(testenv.Context(t), outboxdriver.DeadFilter{})
	if err != nil || len(dls) != 1 {
		t.Fatalf("DeadList: %v, %v", dls, err)
	}
	dls[0].Payload[0], dls[0].Headers["h"] = 'Z', "changed"
	dls, _ = b.store.DeadList(testenv.Context(t), outboxdriver.DeadFilter{})
	if string(dls[0].Payload) != `{"v":1}` || dls[0].Headers["h"] != "1" {
		t.Fatalf("the dead letter changed with a caller's copy: %q %v", dls[0].Payload, dls[0].Headers)
	}
}

// TestStoreSavepoints checks that rolling back a savepoint undoes the writes since it was
// taken, dedup claims included, and ends the savepoints taken after it; and that a
// transaction, once ended, refuses everything.
func TestStoreSavepoints(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	ctx := testenv.Context(t)
	keyed := func(payload, key string) outbox.Message {
		m := msg("a", payload)
		m.DedupKey = key
		return m
	}
	tx := b.store.Begin()
	defer tx.Rollback()
	if err := b.w.Write(ctx, tx, keyed(`1`, "one")); err != nil {
		t.Fatal(err)
	}
	sp1, err := tx.Savepoint()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.w.Write(ctx, sp1, keyed(`2`, "two")); err != nil {
		t.Fatal(err)
	}
	sp2, err := sp1.Savepoint()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.w.Write(ctx, sp2, msg("a", `3`)); err != nil {
		t.Fatal(err)
	}
	if err := sp1.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := b.w.Write(ctx, sp2, msg("a", `4`)); !errors.Is(err, outboxtest.ErrTxDone) {
		t.Fatalf("write in a savepoint taken after one rolled back: %v, want ErrTxDone", err)
	}
	if err := b.w.Write(ctx, tx, keyed(`5`, "two")); err != nil {
		t.Fatalf("the dedup key of a rolled-back savepoint is still taken: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func() error{
		"Commit":    tx.Commit,
		"Rollback":  tx.Rollback,
		"Write":     func() error { return b.w.Write(ctx, tx, msg("a", `6`)) },
		"Savepoint": func() error { _, err := tx.Savepoint(); return err },
	} {
		if err := call(); !errors.Is(err, outboxtest.ErrTxDone) {
			t.Errorf("%s after Commit: %v, want ErrTxDone", name, err)
		}
	}
	st := b.sync(t, "r1", time.Minute, nil)
	if got := payloads(b.fetch(t, "r1", st.Held, outboxdriver.FetchRequest{})); !slices.Equal(got, []string{`1`, `5`}) {
		t.Fatalf("fetched %v, want the messages outside the rolled-back savepoint", got)
	}
}
