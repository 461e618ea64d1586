package outboxprom

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
)

// fakeAdmin answers Status with whatever the test set, counting the calls.
type fakeAdmin struct {
	outboxdriver.Admin // only Status is called
	mu                 sync.Mutex
	st                 outboxdriver.Status
	err                error
	block              chan struct{} // when set, Status waits for it or for ctx
	calls              atomic.Int32
}

func (a *fakeAdmin) Status(ctx context.Context) (outboxdriver.Status, error) {
	a.calls.Add(1)
	a.mu.Lock()
	st, err, block := a.st, a.err, a.block
	a.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return outboxdriver.Status{}, ctx.Err()
		}
	}
	return st, err
}

func (a *fakeAdmin) set(st outboxdriver.Status, err error) {
	a.mu.Lock()
	a.st, a.err = st, err
	a.mu.Unlock()
}

// TestStatusCollectorCache: scrapes within MaxAge share one Status call, concurrent
// scrapes too; the next scrape after MaxAge reads again; -1 reads every time.
func TestStatusCollectorCache(t *testing.T) {
	t.Parallel()
	admin := &fakeAdmin{st: outboxdriver.Status{Topics: []outboxdriver.TopicStatus{{Topic: "t", Pending: 1}}}}
	c := NewStatusCollector(admin, StatusConfig{MaxAge: time.Minute})
	clock := &fakeClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	c.now = clock.now
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)

	release := make(chan struct{})
	admin.mu.Lock()
	admin.block = release
	admin.mu.Unlock()
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := reg.Gather(); err != nil {
				t.Error(err)
			}
		}()
	}
	testenv.AwaitCond(t, "a scrape to be inside Status", func() bool { return admin.calls.Load() > 0 })
	close(release)
	wg.Wait()
	if n := admin.calls.Load(); n != 1 {
		t.Fatalf("5 concurrent scrapes made %d Status calls, want 1", n)
	}
	clock.t = clock.t.Add(59 * time.Second)
	value(t, reg, "outbox_pending", map[string]string{"topic": "t"})
	if n := admin.calls.Load(); n != 1 {
		t.Fatalf("a scrape within MaxAge made a Status call (%d)", n)
	}
	clock.t = clock.t.Add(time.Second)
	value(t, reg, "outbox_pending", map[string]string{"topic": "t"})
	if n := admin.calls.Load(); n != 2 {
		t.Fatalf("a scrape after MaxAge made %d Status calls in all, want 2", n)
	}

	every := &fakeAdmin{}
	reg2 := prometheus.NewRegistry()
	reg2.MustRegister(NewStatusCollector(every, StatusConfig{MaxAge: -1}))
	for range 3 {
		value(t, reg2, "outbox_status_up", nil)
	}
	if n := every.calls.Load(); n != 3 {
		t.Fatalf("MaxAge -1: 3 scrapes made %d Status calls, want 3", n)
	}
}

// TestStatusCollectorFailure: a failing or hanging Status makes outbox_status_up 0 and
// leaves the other series out, without failing the scrape; a topic gone quiet is
// reported at zero once Status recovers.
func TestStatusCollectorFailure(t *testing.T) {
	t.Parallel()
	admin := &fakeAdmin{st: outboxdriver.Status{
		Topics: []outboxdriver.TopicStatus{{Topic: "orders", Pending: 3, Due: 2, Retrying: 1, Dead: 4, OldestPendingAge: 90 * time.Second}},
		Relays: []outboxdriver.RelayInfo{{ID: "a", Live: true, Fingerprint: "f1"}, {ID: "b", Fingerprint: "f3"}, {ID: "c", Live: true, Fingerprint: "f2"}, {ID: "d", Live: true}},
		Shards: 64, ShardsLeased: 60,
		Partitions:           &outboxdriver.PartitionStatus{Count: 9, DaysAhead: 6},
		OldestTransactionAge: 42 * time.Second,
	}}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewStatusCollector(admin, StatusConfig{MaxAge: -1, Timeout: 50 * time.Millisecond}))
	orders := map[string]string{"topic": "orders"}
	for name, want := range map[string]float64{
		"outbox_status_up": 1, "outbox_pending": 3, "outbox_due": 2, "outbox_retrying": 1, "outbox_dead": 4,
		"outbox_oldest_pending_age_seconds": 90, "outbox_relays_live": 3, "outbox_relay_routings": 2, "outbox_shards": 64, "outbox_shards_leased": 60,
		"outbox_partitions": 9, "outbox_partition_days_ahead": 6, "outbox_oldest_transaction_age_seconds": 42,
	} {
		labels := orders
		if !slices.Contains([]string{"outbox_pending", "outbox_due", "outbox_retrying", "outbox_dead", "outbox_oldest_pending_age_seconds"}, name) {
			labels = nil
		}
		if got := value(t, reg, name, labels); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}

	onlyUp := func(why string) {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatalf("%s: the scrape failed: %v", why, err)
		}
		if len(mfs) != 1 || mfs[0].GetName() != "outbox_status_up" || mfs[0].GetMetric()[0].GetGauge().GetValue() != 0 {
			t.Fatalf("%s: want outbox_status_up 0 alone, got %v", why, mfs)
		}
	}
	admin.set(outboxdriver.Status{}, errors.New("connection refused"))
	onlyUp("Status failing")
	admin.set(outboxdriver.Status{}, nil)
	admin.mu.Lock()
	admin.block = make(chan struct{}) // never released: Status times out
	admin.mu.Unlock()
	onlyUp("Status hanging")

	admin.mu.Lock()
	admin.block = nil
	admin.mu.Unlock()
	admin.set(outboxdriver.Status{Topics: []outboxdriver.TopicStatus{{Topic: "billing", Pending: 1}}, Shards: 64}, nil)
	if value(t, reg, "outbox_status_up", nil) != 1 || value(t, reg, "outbox_pending", orders) != 0 ||
		value(t, reg, "outbox_dead", orders) != 0 || value(t, reg, "outbox_pending", map[string]string{"topic": "billing"}) != 1 {
		t.Fatal("after recovery: want orders at zero and billing at 1")
	}
}

// TestStatusCollectorWAL: each WAL-mode slot's recorded state and PostgreSQL's view of
// it; a slot that is gone reports that alone, and the safe size is absent without a limit.
// (The query behind Status is tested on a logical server in outboxpgx.)
func TestStatusCollectorWAL(t *testing.T) {
	t.Parallel()
	safe := int64(1 << 30)
	admin := &fakeAdmin{st: outboxdriver.Status{WAL: []outboxdriver.WALSlotStatus{
		{Slot: "a", State: "streaming", Reader: "r1", Exists: true, Active: true, WALStatus: "reserved",
			LagBytes: 4096, RetainedBytes: 8192, SafeWALSizeBytes: &safe},
		{Slot: "b", State: "fallback", Reason: "slot_missing"},
		{Slot: "c", State: "streaming", Exists: true, WALStatus: "extended"},
	}}}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewStatusCollector(admin, StatusConfig{MaxAge: -1}))
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"outbox_wal_source", map[string]string{"slot": "a", "state": "streaming"}, 1},
		{"outbox_wal_source", map[string]string{"slot": "a", "state": "fallback"}, 0},
		{"outbox_wal_source", map[string]string{"slot": "b", "state": "fallback"}, 1},
		{"outbox_wal_slot_exists", map[string]string{"slot": "b"}, 0},
		{"outbox_wal_slot_active", map[string]string{"slot": "a"}, 1},
		{"outbox_wal_slot_status", map[string]string{"slot": "a", "status": "reserved"}, 1},
		{"outbox_wal_slot_status", map[string]string{"slot": "c", "status": "extended"}, 1},
		{"outbox_wal_slot_status", map[string]string{"slot": "c", "status": "lost"}, 0},
		{"outbox_wal_slot_lag_bytes", map[string]string{"slot": "a"}, 4096},
		{"outbox_wal_slot_retained_bytes", map[string]string{"slot": "a"}, 8192},
		{"outbox_wal_slot_safe_wal_size_bytes", map[string]string{"slot": "a"}, float64(safe)},
	} {
		if got := value(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	for _, absent := range []struct {
		name string
		slot string
	}{{"outbox_wal_slot_lag_bytes", "b"}, {"outbox_wal_slot_active", "b"}, {"outbox_wal_slot_safe_wal_size_bytes", "c"}} {
		if m := find(t, reg, absent.name, map[string]string{"slot": absent.slot}); m != nil {
			t.Errorf("%s{slot=%s} reported, want it absent", absent.name, absent.slot)
		}
	}
}
