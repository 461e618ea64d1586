package outboxtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxtest"
)

// relay starts a relay on b's store and stops it when the test ends (stopping twice is
// safe).
func (b *testBundle) relay(t *testing.T, pub outbox.Publisher, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
	}
	r, err := outbox.NewRelay(b.store, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(testenv.Context(t)) })
	return r
}

// body is the payload of the relay tests' messages: the n-th message written of its key.
type body struct {
	Key string `json:"key"`
	N   int    `json:"n"`
}

func keyMsg(key string, n int) outbox.Message {
	m := outbox.Message{Topic: "t", Key: key, Payload: fmt.Appendf(nil, `{"key":%q,"n":%d}`, key, n)}
	if n%3 == 0 {
		m.DedupKey = fmt.Sprintf("%s-%d", key, n) // unique: claimed, never skipped
	}
	return m
}

func bodyOf(t *testing.T, m outbox.Message) body {
	t.Helper()
	var b body
	if err := json.Unmarshal(m.Payload, &b); err != nil {
		t.Fatalf("payload %q: %v", m.Payload, err)
	}
	return b
}

// TestStoreRelaysPublishCommitted runs two relays on the store while writers commit and
// roll back overlapping transactions, some messages are rejected once, and one
// transaction that inserted first commits last: every committed message is published
// once, in its key's order, and no rolled-back one is.
func TestStoreRelaysPublishCommitted(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	rejected := map[body]bool{} // Publisher calls Fail under its lock
	pub := &outboxtest.Publisher{Fail: func(m *outbox.Message) error {
		var bd body
		if err := json.Unmarshal(m.Payload, &bd); err != nil {
			return err
		}
		if bd.N%4 == 1 && !rejected[bd] {
			rejected[bd] = true
			return errors.New("rejected once for the test")
		}
		return nil
	}}
	cfg := outbox.RelayConfig{PollInterval: 10 * time.Millisecond, RetryMinDelay: 5 * time.Millisecond, RetryMaxDelay: 20 * time.Millisecond,
		BatchSize: 50, MaxInFlight: 100, PublishBatchSize: 25}
	for i := range 2 {
		c := cfg
		c.ID = "relay-" + strconv.Itoa(i)
		b.relay(t, pub, c)
	}

	ctx := context.Background()
	early := b.store.Begin() // inserts first (the lowest seq), commits last
	defer early.Rollback()
	if err := b.w.Write(ctx, early, keyMsg("early", 0)); err != nil {
		t.Fatal(err)
	}

	const writers, keysEach, txEach = 4, 5, 60
	committed := make([][]body, writers)
	rolledBack := make([][]body, writers)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			next := map[string]int{}
			for i := range txEach {
				var batch []outbox.Message
				var bodies []body
				for range 1 + rng.IntN(4) {
					key := fmt.Sprintf("w%d-k%d", w, rng.IntN(keysEach))
					batch = append(batch, keyMsg(key, next[key]))
					bodies = append(bodies, body{key, next[key]})
					next[key]++
				}
				rollback := i%5 == 4
				if err := b.write(ctx, batch, rollback); err != nil {
					errs <- fmt.Errorf("writer %d, transaction %d: %w", w, i, err)
					return
				}
				if rollback {
					rolledBack[w] = append(rolledBack[w], bodies...)
				} else {
					committed[w] = append(committed[w], bodies...)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	want := map[body]bool{{"early", 0}: true}
	for _, bs := range committed {
		for _, bd := range bs {
			want[bd] = true
		}
	}
	pub.Await(t, len(want)-1) // everything but the early message, whose transaction is open
	if err := early.Commit(); err != nil {
		t.Fatal(err)
	}
	got := pub.Await(t, len(want))
	testenv.Await(t, "every outcome recorded", func() (any, bool) {
		s := b.status(t)
		return fmt.Sprintf("%d pending, %d published", s.Pending, s.Published), s.Pending == 0 && s.Published == int64(len(want))
	})

	last := map[string]int{}
	seen := map[body]bool{}
	for _, m := range got {
		bd := bodyOf(t, m)
		if seen[bd] {
			t.Errorf("published twice: %+v", bd)
		}
		seen[bd] = true
		if !want[bd] {
			t.Errorf("published a message that was not committed: %+v", bd)
		}
		if prev, ok := last[bd.Key]; ok && bd.N <= prev {
			t.Errorf("key %s: message %d published after %d", bd.Key, bd.N, prev)
		}
		last[bd.Key] = bd.N
	}
	for _, bs := range rolledBack {
		for _, bd := range bs {
			if seen[bd] {
				t.Errorf("published a rolled-back message: %+v", bd)
			}
		}
	}
	if len(seen) != len(want) {
		t.Errorf("published %d distinct messages, want the %d committed", len(seen), len(want))
	}
	if s := b.status(t); s.Dead != 0 || s.OldestTransactionAge != 0 {
		t.Errorf("status after the drain: %+v", s)
	}
}

// TestStoreRelayOnFakeClock runs a relay in a testing/synctest bubble, whose clock is the
// store's and the relay's: minutes of backoff and of delay pass at once, and
// nothing depends on how fast the machine is.
func TestStoreRelayOnFakeClock(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setup(t, false) // time.Now is the bubble's clock
		start := time.Now()
		later := keyMsg("b", 0)
		later.DeliverAt = start.Add(10 * time.Minute)
		b.mustWrite(t, keyMsg("a", 0), keyMsg("a", 1), later, keyMsg("a", 2))

		rejections := 0
		pub := &outboxtest.Publisher{Fail: func(m *outbox.Message) error {
			if m.Key == "a" && rejections < 2 {
				rejections++
				return errors.New("rejected for the test")
			}
			return nil
		}}
		r := b.relay(t, pub, outbox.RelayConfig{ID: "fake-clock", RetryMinDelay: time.Minute, RetryMaxDelay: time.Minute,
			Logger: slog.New(slog.DiscardHandler)})

		// Each of a0's two rejections backs off for 1 to 2 minutes (RetryMinDelay plus
		// jitter up to the ceiling), holding a's later messages back.
		time.Sleep(59 * time.Second)
		if got := pub.Messages(); len(got) != 0 {
			t.Fatalf("published %d messages during a0's first backoff", len(got))
		}
		time.Sleep(time.Until(start.Add(5 * time.Minute)))
		var keys []string
		for _, m := range pub.Messages() {
			keys = append(keys, fmt.Sprintf("%s%d", m.Key, bodyOf(t, m).N))
		}
		if !slices.Equal(keys, []string{"a0", "a1", "a2"}) {
			t.Fatalf("after a0's backoffs published %v, want a0 a1 a2", keys)
		}
		time.Sleep(time.Until(later.DeliverAt) + time.Second)
		got := pub.Messages()
		if len(got) != 4 || got[3].Key != "b" {
			t.Fatalf("after b0's DeliverAt published %d messages, want b's delayed one last", len(got))
		}
		if err := r.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		if s := b.status(t); s.Pending != 0 || s.Published != 4 {
			t.Errorf("status after the relay stopped: %+v", s)
		}
	})
}
