package outbox_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxtest"
)

// replayHistory publishes rounds of writes ten minutes apart (the bubble's clock) with
// a relay, and returns what the relay published and when each round began.
func replayHistory(t *testing.T, b *memBundle, rounds int, keys []string) (published []outbox.Message, starts []time.Time) {
	t.Helper()
	pub := &outboxtest.Publisher{}
	b.relay(t, pub, outbox.RelayConfig{ID: "live"})
	for range rounds {
		starts = append(starts, time.Now())
		b.writeRounds(t, 3, keys)
		b.awaitPublished(t, pub)
		time.Sleep(10 * time.Minute)
	}
	return pub.Messages(), starts
}

// checkReplayed checks that got holds exactly the messages of want (by ID), each with
// its dedup key and payload and the replay's header, each key's in want's order.
func checkReplayed(t *testing.T, got, want []outbox.Message, name string) {
	t.Helper()
	byID := map[outbox.ID]outbox.Message{}
	for _, m := range want {
		byID[m.ID] = m
	}
	seen := map[outbox.ID]bool{}
	last := map[string]int{} // key -> index in want of its last message seen
	index := map[outbox.ID]int{}
	for i, m := range want {
		index[m.ID] = i
	}
	for _, m := range got {
		w, ok := byID[m.ID]
		switch {
		case !ok:
			t.Errorf("replayed %s (%s), not selected", m.ID, m.Payload)
			continue
		case seen[m.ID]:
			continue // sent again after a resume
		case m.DedupKey != w.DedupKey || string(m.Payload) != string(w.Payload):
			t.Errorf("replayed %s with dedup key %q payload %q, want %q %q", m.ID, m.DedupKey, m.Payload, w.DedupKey, w.Payload)
		case m.Headers[outbox.HeaderReplay] != name:
			t.Errorf("replayed %s with headers %v, want %s=%s", m.ID, m.Headers, outbox.HeaderReplay, name)
		}
		if i, ok := last[m.Key]; ok && index[m.ID] < i {
			t.Errorf("key %s: %s replayed after %s", m.Key, m.Payload, want[i].Payload)
		}
		last[m.Key] = index[m.ID]
		seen[m.ID] = true
	}
	if len(seen) != len(want) {
		t.Errorf("replayed %d of the %d messages selected", len(seen), len(want))
	}
}

// TestMemReplayTimeRangeInKeyOrder: a replay of a time range publishes again exactly the
// messages published in it that the filter selects, each key's in the order of their
// first publication, with their IDs and dedup keys and the Outbox-Replay header; the
// live relay's pending work is untouched.
func TestMemReplayTimeRangeInKeyOrder(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupMem(t)
		b.topic = func(key string) string { return "orders." + key[:1] }
		keys := append(memKeys("a", 30), memKeys("b", 30)...)
		published, starts := replayHistory(t, b, 3, keys)

		filter := outboxdriver.HistoryFilter{Since: starts[1], Until: starts[2], Topic: "orders.a"}
		var want []outbox.Message
		for _, m := range published {
			if m.Topic == "orders.a" && b.publishedIn(t, m, starts[1], starts[2]) {
				want = append(want, m)
			}
		}
		if len(want) != 90 {
			t.Fatalf("%d messages of orders.a in the second round, want 90", len(want))
		}
		target := &outboxtest.Publisher{}
		var progress []outbox.ReplayProgress
		p, err := outbox.Replay(context.Background(), b.store, target, outbox.ReplayConfig{Filter: filter, Name: "r1", BatchSize: 7,
			Progress: func(p outbox.ReplayProgress) error { progress = append(progress, p); return nil }})
		if err != nil {
			t.Fatal(err)
		}
		checkReplayed(t, target.Messages(), want, "r1")
		if p.Total != 90 || p.Sent != 90 || p.Failed != 0 || p.Done != 90 || !p.Cursor.Equal(starts[2]) {
			t.Errorf("progress %+v, want 90 of 90 sent up to %v", p, starts[2])
		}
		if len(progress) == 0 || progress[len(progress)-1] != p {
			t.Errorf("the last progress reported %+v, want %+v", progress, p)
		}
		if st := b.status(t); st.Pending != 0 {
			t.Errorf("the replay left %d messages pending: it must not write to the outbox", st.Pending)
		}
	})
}

// publishedIn reports whether m was published in [from, to), by the store's history.
func (b *memBundle) publishedIn(t *testing.T, m outbox.Message, from, to time.Time) bool {
	t.Helper()
	rows, err := b.store.History(context.Background(), outboxdriver.HistoryFilter{Since: from, Until: to, Key: m.Key}, from, to, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(rows, func(p outboxdriver.Published) bool { return p.ID == m.ID })
}

// TestMemReplayResumes: a replay stopped after its first span (its progress recorder
// fails, as a crash would end it) goes on from the cursor it recorded: every message
// is published, those of the first span once more at most.
func TestMemReplayResumes(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupMem(t)
		keys := memKeys("k", 20)
		published, starts := replayHistory(t, b, 4, keys)
		filter := outboxdriver.HistoryFilter{Since: starts[0], Until: time.Now()}
		target := &outboxtest.Publisher{}
		crash := errors.New("the process died")
		var saved outbox.ReplayProgress
		_, err := outbox.Replay(context.Background(), b.store, target, outbox.ReplayConfig{Filter: filter, Name: "r2",
			Progress: func(p outbox.ReplayProgress) error { saved = p; return crash }})
		if !errors.Is(err, crash) || saved.Sent == 0 || saved.Sent == int64(len(published)) {
			t.Fatalf("first run: %v after %+v; want it stopped after part of the history", err, saved)
		}
		p, err := outbox.Replay(context.Background(), b.store, target, outbox.ReplayConfig{Filter: filter, Name: "r2", From: saved.Cursor})
		if err != nil {
			t.Fatal(err)
		}
		if p.Skipped != saved.Sent || p.Sent+p.Skipped != int64(len(published)) || p.Done != p.Total {
			t.Errorf("resumed run %+v after %+v, want the rest of %d", p, saved, len(published))
		}
		checkReplayed(t, target.Messages(), published, "r2")
	})
}

// TestMemReplayWaitsOutOutages: the destination is down for its first publishes; the
// replay waits, counts nothing failed, and publishes everything once it is back.
// Rejections are tried again, and a message rejected for good is counted and skipped.
func TestMemReplayWaitsOutOutages(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupMem(t)
		keys := memKeys("k", 10)
		published, starts := replayHistory(t, b, 1, keys)
		var calls atomic.Int64
		poison := published[3].ID
		target := &outboxtest.Publisher{Fail: func(m *outbox.Message) error {
			switch {
			case calls.Add(1) <= 25:
				return outbox.Outage(errors.New("connection refused"))
			case m.ID == poison:
				return errors.New("refused by the destination")
			}
			return nil
		}}
		p, err := outbox.Replay(context.Background(), b.store, target, outbox.ReplayConfig{
			Filter: outboxdriver.HistoryFilter{Since: starts[0], Until: time.Now()}, Name: "r3", MaxAttempts: 3})
		if err != nil {
			t.Fatal(err)
		}
		if p.Sent != int64(len(published))-1 || p.Failed != 1 {
			t.Errorf("progress %+v, want all but the poison message sent and it failed", p)
		}
		var want []outbox.Message
		for _, m := range published {
			if m.ID != poison {
				want = append(want, m)
			}
		}
		checkReplayed(t, target.Messages(), want, "r3")
	})
}

// TestMemReplayLiveFirst: while live messages wait for a relay, the replay sends
// nothing and reports itself paused; once the relay catches up, it goes on.
func TestMemReplayLiveFirst(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupMem(t)
		keys := memKeys("k", 10)
		gate := newGatedPublisher(&outboxtest.Publisher{}, func(*outbox.Message) bool { return false })
		live := b.relay(t, gate, outbox.RelayConfig{ID: "live"})
		b.writeRounds(t, 2, keys)
		testenv.Await(t, "the history published", func() (any, bool) {
			return b.status(t).Pending, b.status(t).Pending == 0
		})
		since := time.Now().Add(-time.Hour)
		time.Sleep(time.Minute)
		until := time.Now()
		// Live traffic the relay cannot send: a stopped relay.
		ctx, cancel := testenv.CallContext()
		if err := live.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		b.writeRounds(t, 20, keys)
		time.Sleep(2 * time.Second)

		target := &outboxtest.Publisher{}
		paused := make(chan struct{})
		done := make(chan outbox.ReplayProgress, 1)
		go func() {
			p, err := outbox.Replay(context.Background(), b.store, target, outbox.ReplayConfig{
				Filter: outboxdriver.HistoryFilter{Since: since, Until: until}, Name: "r4", LiveBacklog: 100,
				Progress: func(p outbox.ReplayProgress) error {
					if p.Paused {
						close(paused)
					}
					return nil
				}})
			if err != nil {
				t.Error(err)
			}
			done <- p
		}()
		testenv.AwaitRecv(t, "the replay to pause for the live backlog", paused)
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := len(target.Messages()); n != 0 {
			t.Fatalf("the replay sent %d messages while 200 live ones waited", n)
		}
		b.relay(t, &outboxtest.Publisher{}, outbox.RelayConfig{ID: "live-again"})
		p := testenv.AwaitRecv(t, "the replay to finish once the live backlog drained", done)
		if p.Sent != 20 {
			t.Errorf("progress %+v, want the 20 messages of the history sent", p)
		}
	})
}

// TestReplayConfigErrors: a replay without a time range or a name is refused before it
// reads anything.
func TestReplayConfigErrors(t *testing.T) {
	t.Parallel()
	store := outboxtest.NewStore(outboxtest.StoreConfig{})
	now := time.Now()
	for _, tc := range []struct {
		cfg   outbox.ReplayConfig
		field string
	}{
		{outbox.ReplayConfig{Name: "x"}, "HistoryFilter.Since"},
		{outbox.ReplayConfig{Name: "x", Filter: outboxdriver.HistoryFilter{Since: now, Until: now}}, "HistoryFilter.Until"},
		{outbox.ReplayConfig{Name: "x", Filter: outboxdriver.HistoryFilter{Since: now, Until: now.Add(1), Topic: "a[b]"}}, "HistoryFilter.Topic"},
		{outbox.ReplayConfig{Filter: outboxdriver.HistoryFilter{Since: now, Until: now.Add(1)}}, "Name"},
	} {
		_, err := outbox.Replay(context.Background(), store, &outboxtest.Publisher{}, tc.cfg)
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("%+v: %v, want a ConfigError on %s", tc.cfg, err, tc.field)
		}
	}
}
