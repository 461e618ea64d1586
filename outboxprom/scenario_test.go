package outboxprom

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// get is value for polling: 0 when the series does not exist (yet).
func get(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	m := find(t, g, name, labels)
	switch {
	case m == nil:
		return 0
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return float64(m.GetHistogram().GetSampleCount())
}

// eventually polls cond until it holds. The progress series (see counts) are the
// relay's progress: the test fails only when none of them has moved for testenv.Stall(),
// with what the registry holds. A wait for one event (a lease taken) sees them still,
// and so is bounded by testenv.Stall() alone.
func eventually(t *testing.T, g prometheus.Gatherer, what string, cond func() bool) {
	t.Helper()
	err := testenv.Progress(context.Background(), what, testenv.Stall(), func() (any, bool) {
		return counts(g, false), cond()
	})
	var se *testenv.StallError
	switch {
	case errors.As(err, &se):
		t.Fatalf("waiting for %s: no progress for %v; metrics:\n%s", what, se.Stall, counts(g, true))
	case err != nil:
		t.Fatal(err)
	}
}

// progress names the series that move only when messages move toward an end: published,
// dead-lettered, and the gauges of what is pending or dead. Failures, retries, pauses,
// refusals and shards gained or lost are left out: they keep rising while a relay fails,
// retries or churns its leases forever, which is no progress.
var progress = map[string]bool{
	"outbox_published_total":     true,
	"outbox_dead_lettered_total": true,
	"outbox_pending":             true,
	"outbox_dead":                true,
}

// counts returns outbox_ counters and gauges of g, one sample a line: with all, every one
// but durations, timestamps and sizes (which move without the outbox moving), for a
// report; without, only the progress series, for a stall detector.
func counts(g prometheus.Gatherer, all bool) string {
	var b strings.Builder
	mfs, err := g.Gather()
	if err != nil {
		fmt.Fprintf(&b, "gather: %v\n", err)
	}
	for _, mf := range mfs {
		name := mf.GetName()
		if !strings.HasPrefix(name, "outbox_") || strings.Contains(name, "seconds") || strings.Contains(name, "size") ||
			(!all && !progress[name]) {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			fmt.Fprintf(&b, "%s{%s} %v\n", name, strings.Join(labels, ","), m.GetCounter().GetValue()+m.GetGauge().GetValue())
		}
	}
	return b.String()
}

func startRelay(t *testing.T, store outboxdriver.Store, pub outbox.Publisher, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testdb.Logger()
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

// TestScenario runs a relay against PostgreSQL through publish, outage, reject and
// retry, and dead-letter, one step at a time, and checks after each step that every
// counter moved by exactly what the step should cause, then that stopping gives the
// leases back.
func TestScenario(t *testing.T) {
	t.Parallel()
	db := testdb.Migrated(t)
	reg := prometheus.NewRegistry()
	m := New(Config{Registerer: reg, Broker: "nats"})
	reg.MustRegister(NewStatusCollector(db.Driver, StatusConfig{MaxAge: -1}))

	var outageDone atomic.Bool
	pub := &outboxtest.Publisher{Fail: func(msg *outbox.Message) error {
		switch msg.Topic {
		case "outage": // the broker is down for this message's first attempt only
			if outageDone.CompareAndSwap(false, true) {
				return outbox.Outage(errors.New("broker unreachable"))
			}
		case "flaky": // rejected on the first attempt, accepted on the second
			if msg.Attempts == 0 {
				return errors.New("rejected once")
			}
		case "poison":
			return errors.New("payload refused")
		}
		return nil
	}}
	before := time.Now()
	var logs syncBuffer
	relay := startRelay(t, db.Driver, pub, outbox.RelayConfig{ID: "scenario", Observer: m, MaxAttempts: 2,
		Logger:        slog.New(slog.NewJSONHandler(&logs, nil)),
		RetryMinDelay: 10 * time.Millisecond, RetryMaxDelay: 20 * time.Millisecond, PollInterval: 20 * time.Millisecond,
		OutageMinDelay: 10 * time.Millisecond, OutageMaxDelay: 20 * time.Millisecond})

	rl := map[string]string{"relay": "scenario"}
	topic := func(topic string) map[string]string {
		return map[string]string{"relay": "scenario", "broker": "nats", "topic": topic}
	}
	failed := func(t, reason string) map[string]string {
		l := topic(t)
		l["reason"] = reason
		return l
	}
	type want struct {
		name   string
		labels map[string]string
		v      float64
	}
	check := func(step string, wants []want) {
		t.Helper()
		for _, w := range wants {
			if got := get(t, reg, w.name, w.labels); got != w.v {
				t.Errorf("after %s: %s%v = %v, want %v", step, w.name, w.labels, got, w.v)
			}
		}
	}

	eventually(t, reg, "the relay holds every shard", func() bool { return get(t, reg, "outbox_shards_held", rl) == 64 })
	check("start", []want{{"outbox_relay_up", rl, 1}, {"outbox_shards_gained_total", rl, 64}, {"outbox_shards_lost_total", rl, 0}})

	var orders []outbox.Message
	for i := range 5 {
		orders = append(orders, outbox.Message{Topic: "orders", Key: fmt.Sprintf("o%d", i), Payload: []byte(`{}`)})
	}
	db.Write(t, orders...)
	eventually(t, reg, "5 orders published", func() bool { return get(t, reg, "outbox_published_total", topic("orders")) == 5 })

	outageMsg := outbox.Message{ID: outbox.NewID(), Topic: "outage", Key: "x", Payload: []byte(`{}`)}
	db.Write(t, outageMsg)
	eventually(t, reg, "the outage message published", func() bool { return get(t, reg, "outbox_published_total", topic("outage")) == 1 })
	check("the outage", []want{
		{"outbox_publish_failed_total", failed("outage", "outage"), 1},
		{"outbox_publish_failed_total", failed("outage", "rejected"), 0},
		{"outbox_retried_total", topic("outage"), 0},
		{"outbox_broker_pauses_total", rl, 1},
	})

	flaky := outbox.Message{ID: outbox.NewID(), Topic: "flaky", Key: "order-7", EventType: "order.placed", DedupKey: "order-7:placed", Payload: []byte(`{}`)}
	db.Write(t, flaky)
	eventually(t, reg, "the flaky message published", func() bool { return get(t, reg, "outbox_published_total", topic("flaky")) == 1 })
	check("the rejection", []want{
		{"outbox_publish_failed_total", failed("flaky", "rejected"), 1},
		{"outbox_retried_total", topic("flaky"), 1},
		{"outbox_dead_lettered_total", topic("flaky"), 0},
		{"outbox_broker_pauses_total", rl, 1},
	})

	poison := outbox.Message{ID: outbox.NewID(), Topic: "poison", Key: "order-8", EventType: "order.paid", DedupKey: "order-8:paid", Payload: []byte(`{}`)}
	db.Write(t, poison)
	eventually(t, reg, "the poison message dead-lettered", func() bool {
		return get(t, reg, "outbox_dead_lettered_total", topic("poison")) == 1 && get(t, reg, "outbox_dead", map[string]string{"topic": "poison"}) == 1
	})
	check("the dead letter", []want{
		{"outbox_publish_failed_total", failed("poison", "rejected"), 2},
		{"outbox_retried_total", topic("poison"), 1},
		{"outbox_published_total", topic("poison"), 0},
		// Everything before, unchanged:
		{"outbox_published_total", topic("orders"), 5},
		{"outbox_published_total", topic("outage"), 1},
		{"outbox_published_total", topic("flaky"), 1},
		{"outbox_publish_failed_total", failed("orders", "outage"), 0},
		{"outbox_publish_failed_total", failed("orders", "rejected"), 0},
		{"outbox_publish_failed_total", failed("outage", "outage"), 1},
		{"outbox_broker_pauses_total", rl, 1},
		{"outbox_outcomes_refused_total", rl, 0},
		{"outbox_fetch_errors_total", rl, 0},
		{"outbox_record_errors_total", rl, 0},
		{"outbox_shards_lost_total", rl, 0},
		// Latencies: one sample per confirmation.
		{"outbox_publish_latency_seconds", map[string]string{"relay": "scenario", "topic": "orders"}, 5},
		{"outbox_commit_latency_seconds", map[string]string{"relay": "scenario", "topic": "orders"}, 5},
		{"outbox_commit_latency_seconds", map[string]string{"relay": "scenario", "topic": "flaky"}, 1},
		{"outbox_publish_latency_seconds", map[string]string{"relay": "scenario", "topic": "poison"}, 0},
		// The status collector's view of the same outbox.
		{"outbox_status_up", nil, 1},
		{"outbox_pending", map[string]string{"topic": "poison"}, 0},
		{"outbox_relays_live", nil, 1},
		{"outbox_shards_leased", nil, 64},
	})
	if n := relay.Stats().Published; n != 7 {
		t.Errorf("the relay's own count of published messages is %d, want 7", n)
	}
	last := get(t, reg, "outbox_last_publish_timestamp_seconds", rl)
	if float64(before.Unix()) > last || last > float64(time.Now().Unix()+1) {
		t.Errorf("last publish timestamp %v outside the test's run [%d, now]", last, before.Unix())
	}

	if err := relay.Stop(testenv.Context(t)); err != nil {
		t.Fatalf("stop the relay: %v", err)
	}
	checkMessageLogs(t, logs.String(), outageMsg, flaky, poison)
	check("stop", []want{{"outbox_relay_up", rl, 0}, {"outbox_shards_held", rl, 0}, {"outbox_shards_lost_total", rl, 64}})
}

// checkMessageLogs checks the relay's log lines about a message: a rejection and a dead
// letter name the event id, dedup key, aggregate id, event type, attempt and error; an
// outage names the event id and the error.
func checkMessageLogs(t *testing.T, logs string, outage, flaky, poison outbox.Message) {
	t.Helper()
	lines := map[string][]map[string]any{}
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		msg, _ := rec["msg"].(string)
		lines[msg] = append(lines[msg], rec)
	}
	full := func(m outbox.Message, attempt float64) map[string]any {
		return map[string]any{"event_id": m.ID.String(), "dedup_key": m.DedupID(), "aggregate_id": m.Key,
			"event_type": m.EventType, "topic": m.Topic, "attempt": attempt}
	}
	cases := []struct {
		msg  string
		want []map[string]any
	}{
		{"broker outage", []map[string]any{full(outage, 1)}},
		{"publish rejected; will retry", []map[string]any{full(flaky, 1), full(poison, 1)}},
		{"message dead-lettered", []map[string]any{full(poison, 2)}},
	}
	for _, c := range cases {
		got := lines[c.msg]
		if len(got) != len(c.want) {
			t.Errorf("%d log lines %q, want %d:\n%s", len(got), c.msg, len(c.want), logs)
			continue
		}
		for i, want := range c.want {
			for k, v := range want {
				if got[i][k] != v {
					t.Errorf("log line %q: %s = %v, want %v", c.msg, k, got[i][k], v)
				}
			}
			if e, _ := got[i]["err"].(string); e == "" || got[i]["relay_id"] != "scenario" {
				t.Errorf("log line %q lacks the error or the relay id: %v", c.msg, got[i])
			}
		}
	}
}

// syncBuffer is the output of a command the test reads while it is written.
type syncBuffer = testenv.Buffer

// pausableStore freezes one relay's lease renewals and outcome writes, like a process
// stopped with SIGSTOP, while its fetches and publishes go on.
type pausableStore struct {
	outboxdriver.Store
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

// resume lets the frozen calls go on. Resuming a store that is not paused does nothing.
func (p *pausableStore) resume() {
	p.mu.Lock()
	if p.paused != nil {
		close(p.paused)
		p.paused = nil
	}
	p.mu.Unlock()
}

func (p *pausableStore) SyncLeases(ctx context.Context, r outboxdriver.LeaseRequest) (outboxdriver.LeaseState, error) {
	p.gate()
	return p.Store.SyncLeases(ctx, r)
}

func (p *pausableStore) Complete(ctx context.Context, c outboxdriver.Completion) ([]int64, error) {
	p.gate()
	return p.Store.Complete(ctx, c)
}

// TestTakeover: relay a confirms messages while frozen past its lease; relay b takes
// every shard over and publishes everything; when a wakes, each outcome it had is
// refused, it counts its 64 shards lost, and the two relays settle at 32 shards each.
// Both relays report into one registry, told apart by the relay label.
//
// The exact shard counts hold only if no relay misses a renewal it was not meant to: a
// lease lasts 10 s, renewed every second, so only a stall of 9 s could, where 2 s
// leases (renewed every 0.67 s) were lost to a stall of 1.3 s. The cost is the wait for
// a's leases to expire before b takes over.
func TestTakeover(t *testing.T) {
	t.Parallel()
	db := testdb.Migrated(t)
	reg := prometheus.NewRegistry()
	pub := &outboxtest.Publisher{}
	ttl := 10 * time.Second
	frozen := &pausableStore{Store: db.Driver}
	startRelay(t, frozen, pub, outbox.RelayConfig{ID: "a", LeaseTTL: ttl, PollInterval: 20 * time.Millisecond,
		PublishBatchSize: 10, MaxInFlight: 20, Observer: New(Config{Registerer: reg, Broker: "nats"})})
	t.Cleanup(frozen.resume) // runs before a's Stop (cleanups run last first), should the test fail while a is frozen
	a, b := map[string]string{"relay": "a"}, map[string]string{"relay": "b"}
	eventually(t, reg, "a holds every shard", func() bool { return get(t, reg, "outbox_shards_held", a) == 64 })

	frozen.pause()
	var msgs []outbox.Message
	for i := range 50 {
		msgs = append(msgs, outbox.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%10), Payload: []byte(`{}`)})
	}
	db.Write(t, msgs...)
	eventually(t, reg, "a confirms messages while frozen", func() bool { return get(t, reg, "outbox_published_total", a) > 0 })

	startRelay(t, db.Driver, pub, outbox.RelayConfig{ID: "b", LeaseTTL: ttl, PollInterval: 20 * time.Millisecond,
		Observer: New(Config{Registerer: reg, Broker: "nats"})})
	eventually(t, reg, "b takes every shard over", func() bool { return get(t, reg, "outbox_shards_held", b) == 64 })
	eventually(t, reg, "b publishes and records everything", func() bool {
		return get(t, reg, "outbox_published_total", b) == 50 && db.CountIn(t, "outbox", "true") == 0
	})

	frozen.resume()
	confirmedByA := get(t, reg, "outbox_published_total", a)
	eventually(t, reg, "a's outcomes refused", func() bool { return get(t, reg, "outbox_outcomes_refused_total", a) == confirmedByA })
	eventually(t, reg, "the relays rebalance to 32 shards each", func() bool {
		return get(t, reg, "outbox_shards_held", a) == 32 && get(t, reg, "outbox_shards_held", b) == 32
	})
	for _, w := range []struct {
		name   string
		labels map[string]string
		v      float64
	}{
		{"outbox_published_total", a, confirmedByA}, // a published nothing after waking
		{"outbox_outcomes_refused_total", a, confirmedByA},
		{"outbox_shards_gained_total", a, 64 + 32},
		{"outbox_shards_lost_total", a, 64},
		{"outbox_shards_gained_total", b, 64},
		{"outbox_shards_lost_total", b, 32},
		{"outbox_outcomes_refused_total", b, 0},
		{"outbox_published_total", b, 50},
		{"outbox_relay_up", a, 1},
		{"outbox_relay_up", b, 1},
	} {
		if got := get(t, reg, w.name, w.labels); got != w.v {
			t.Errorf("%s%v = %v, want %v", w.name, w.labels, got, w.v)
		}
	}
	if got := len(pub.Messages()); float64(got) != 50+confirmedByA {
		t.Errorf("the broker got %d messages, want 50 + %v duplicates", got, confirmedByA)
	}
}
