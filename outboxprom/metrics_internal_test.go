package outboxprom

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/outboxkit/outbox"
)

// find returns the series of the gathered metric name whose labels include want, or
// nil.
func find(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) *dto.Metric {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue series
				}
			}
			return m
		}
	}
	return nil
}

// value returns a counter's or gauge's value, failing when the series is missing.
func value(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	m := find(t, g, name, labels)
	if m == nil {
		t.Fatalf("no series %s%v", name, labels)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// histogram returns a histogram's sample count and sum, failing when it is missing.
func histogram(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) (uint64, float64) {
	t.Helper()
	m := find(t, g, name, labels)
	if m == nil || m.Histogram == nil {
		t.Fatalf("no histogram %s%v", name, labels)
	}
	return m.Histogram.GetSampleCount(), m.Histogram.GetSampleSum()
}

// exposition renders the gathered families named in the text format, in name order.
func exposition(t *testing.T, g prometheus.Gatherer, names ...string) string {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		if slices.Contains(names, mf.GetName()) {
			if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
				t.Fatal(err)
			}
		}
	}
	return b.String()
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// fakeClock is the clock of the commit-latency bound.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// TestObserverByHand drives a Metrics through every Observer method with known times and
// checks each series: counters by topic, broker and reason, both latencies (the commit
// bound from the last fetch before the first attempt), batch sizes, leases, refusals.
func TestObserverByHand(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := New(Config{Registerer: reg, Broker: "nats"})
	t0 := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	clock := &fakeClock{t: t0}
	m.now = clock.now
	at := func(d time.Duration) time.Time { return t0.Add(d) }

	if mfs, _ := reg.Gather(); len(mfs) != 0 {
		t.Fatalf("series before the relay started: %v", mfs)
	}
	m.Running(outbox.RunningEvent{RelayID: "r1", Running: true})
	r1 := map[string]string{"relay": "r1"}
	if value(t, reg, "outbox_relay_up", r1) != 1 || value(t, reg, "outbox_shards_gained_total", r1) != 0 {
		t.Fatal("relay_up or shards_gained_total missing at start")
	}

	msg := func(seq int64, topic string, created time.Duration) *outbox.Message {
		return &outbox.Message{Seq: seq, Topic: topic, CreatedAt: at(created)}
	}
	m1, m2, m3 := msg(1, "a", -time.Second), msg(2, "a", 0), msg(3, "b", 0)
	clock.t = at(time.Second)
	m.FetchDone(outbox.FetchEvent{Messages: 3, Took: 10 * time.Millisecond})
	clock.t = at(1500 * time.Millisecond)
	m.FetchDone(outbox.FetchEvent{Messages: 0, Took: 5 * time.Millisecond}) // empty: not a bound
	m.FetchDone(outbox.FetchEvent{Messages: 0, Took: 7 * time.Millisecond, Err: errors.New("database down")})
	m.PublishDone(outbox.PublishEvent{Batch: []*outbox.Message{m1, m2, m3},
		Errs: []error{nil, outbox.Outage(errors.New("no route")), errors.New("too large")}, Start: at(2 * time.Second), Took: 100 * time.Millisecond})
	m.Rejected(outbox.RejectEvent{Message: m3, Err: errors.New("too large"), Attempt: 1, Dead: false})

	m4 := msg(4, "b", 3*time.Second)
	clock.t = at(4 * time.Second)
	m.FetchDone(outbox.FetchEvent{Messages: 1, Took: 10 * time.Millisecond})
	m.PublishDone(outbox.PublishEvent{Batch: []*outbox.Message{m2, m3, m4}, Start: at(5 * time.Second), Took: time.Second})

	// A publish that started before every fetch remembered: its start is the bound.
	m5 := msg(5, "c", 0)
	m.PublishDone(outbox.PublishEvent{Batch: []*outbox.Message{m5}, Start: at(500 * time.Millisecond), Took: 250 * time.Millisecond})

	m6 := msg(6, "c", 0)
	m.PublishDone(outbox.PublishEvent{Batch: []*outbox.Message{m6}, Errs: []error{errors.New("poison")}, Start: at(6 * time.Second)})
	m.Rejected(outbox.RejectEvent{Message: m6, Err: errors.New("poison"), Attempt: 3, Dead: true})

	nats := func(topic string) map[string]string {
		return map[string]string{"relay": "r1", "topic": topic, "broker": "nats"}
	}
	reason := func(topic, r string) map[string]string {
		l := nats(topic)
		l["reason"] = r
		return l
	}
	counters := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"outbox_published_total", nats("a"), 2},
		{"outbox_published_total", nats("b"), 2},
		{"outbox_published_total", nats("c"), 1},
		{"outbox_publish_failed_total", reason("a", "outage"), 1},
		{"outbox_publish_failed_total", reason("b", "rejected"), 1},
		{"outbox_publish_failed_total", reason("c", "rejected"), 1},
		{"outbox_retried_total", nats("b"), 1},
		{"outbox_dead_lettered_total", nats("c"), 1},
		{"outbox_fetch_errors_total", r1, 1},
		{"outbox_last_publish_timestamp_seconds", r1, float64(at(6 * time.Second).Unix())},
	}
	for _, c := range counters {
		if got := value(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if find(t, reg, "outbox_publish_failed_total", reason("a", "rejected")) != nil {
		t.Error("a rejected series for a topic without rejections")
	}

	// Publish latency: confirmation - created_at. m1: 2.1 - (-1) = 3.1; m2: 6 - 0 = 6.
	// Commit latency: confirmation - the bound. m1: 2.1 - 1 (fetch at 1s) = 1.1; m2 and m3
	// keep the bound of their first attempt: 6 - 1 = 5 each; m4: 6 - 4 = 2; m5: its own
	// start: 0.25.
	hists := []struct {
		name       string
		topic      string
		count      uint64
		sum        float64
		commitSum  float64
		commitSeen uint64
	}{
		{"a", "a", 2, 3.1 + 6, 1.1 + 5, 2},
		{"b", "b", 2, 6 + 3, 5 + 2, 2},
		{"c", "c", 1, 0.75, 0.25, 1},
	}
	for _, h := range hists {
		l := map[string]string{"relay": "r1", "topic": h.topic}
		if n, sum := histogram(t, reg, "outbox_publish_latency_seconds", l); n != h.count || !near(sum, h.sum) {
			t.Errorf("publish latency of %s: %d samples, sum %v; want %d, %v", h.topic, n, sum, h.count, h.sum)
		}
		if n, sum := histogram(t, reg, "outbox_commit_latency_seconds", l); n != h.commitSeen || !near(sum, h.commitSum) {
			t.Errorf("commit latency of %s: %d samples, sum %v; want %d, %v", h.topic, n, sum, h.commitSeen, h.commitSum)
		}
	}
	if n, sum := histogram(t, reg, "outbox_fetch_batch_size", r1); n != 2 || sum != 4 {
		t.Errorf("fetch batch size: %d samples, sum %v; want 2 fetches of 4 messages", n, sum)
	}
	if n, _ := histogram(t, reg, "outbox_fetch_duration_seconds", r1); n != 4 {
		t.Errorf("fetch duration: %d samples, want 4 (empty and failed fetches included)", n)
	}
	if n, sum := histogram(t, reg, "outbox_publish_batch_size", r1); n != 4 || sum != 8 {
		t.Errorf("publish batch size: %d samples, sum %v; want 4 calls of 8 messages", n, sum)
	}
	if len(m.seen) != 0 {
		t.Errorf("first-seen bounds left behind: %v", m.seen)
	}

	shards := func(from, to int) []int {
		var s []int
		for i := from; i < to; i++ {
			s = append(s, i)
		}
		return s
	}
	m.LeasesChanged(outbox.LeaseEvent{Held: 64, Gained: shards(0, 64), Live: 1})
	m.LeasesChanged(outbox.LeaseEvent{Held: 32, Lost: shards(32, 64), Live: 2})
	m.RecordDone(outbox.RecordEvent{Published: 2, Retried: 1, Refused: 3, Took: 5 * time.Millisecond})
	m.RecordDone(outbox.RecordEvent{Refused: 2}) // refused without asking the store: no duration
	m.RecordDone(outbox.RecordEvent{Took: 30 * time.Millisecond, Err: errors.New("database down")})
	m.Paused(outbox.PauseEvent{Pause: time.Second})
	for name, want := range map[string]float64{
		"outbox_shards_held": 32, "outbox_shards_gained_total": 64, "outbox_shards_lost_total": 32,
		"outbox_outcomes_refused_total": 5, "outbox_record_errors_total": 1, "outbox_broker_pauses_total": 1,
	} {
		if got := value(t, reg, name, r1); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if n, _ := histogram(t, reg, "outbox_record_duration_seconds", r1); n != 2 {
		t.Errorf("record duration: %d samples, want 2", n)
	}
	m.Running(outbox.RunningEvent{RelayID: "r1"})
	if value(t, reg, "outbox_relay_up", r1) != 0 || value(t, reg, "outbox_shards_held", r1) != 0 {
		t.Error("relay_up or shards_held not 0 after stop")
	}
	if find(t, reg, "outbox_relay_up", map[string]string{"relay": ""}) != nil {
		t.Error("a series with an empty relay label")
	}
}

// TestTwoRelaysOneRegistry: a second Metrics on the same registerer shares the collectors
// and keeps its own series; a clash of labels panics with Prometheus's error.
func TestTwoRelaysOneRegistry(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	a := New(Config{Registerer: reg, Broker: "kafka"})
	b := New(Config{Registerer: reg, Broker: "kafka"})
	a.Running(outbox.RunningEvent{RelayID: "a", Running: true})
	b.Running(outbox.RunningEvent{RelayID: "b", Running: true})
	a.PublishDone(outbox.PublishEvent{Batch: []*outbox.Message{{Topic: "t"}}, Start: time.Now()})
	if value(t, reg, "outbox_published_total", map[string]string{"relay": "a", "broker": "kafka"}) != 1 ||
		find(t, reg, "outbox_published_total", map[string]string{"relay": "b"}) != nil {
		t.Error("relay a's publish not counted under a alone")
	}
	if value(t, reg, "outbox_relay_up", map[string]string{"relay": "b"}) != 1 {
		t.Error("relay b not up")
	}

	clash := prometheus.NewRegistry()
	clash.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_published_total", Help: "another"}))
	defer func() {
		r := recover()
		if err, ok := r.(error); !ok || !strings.Contains(err.Error(), "outbox_published_total") {
			t.Errorf("want a panic naming the clashing metric, got %v", r)
		}
	}()
	New(Config{Registerer: clash})
}

// TestWALSeries: a polling relay has no WAL series; a WAL-mode relay's appear with its
// first stream news and follow it.
func TestWALSeries(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := New(Config{Registerer: reg})
	m.Running(outbox.RunningEvent{RelayID: "r", Running: true})
	r := map[string]string{"relay": "r"}
	if find(t, reg, "outbox_wal_reading", r) != nil || find(t, reg, "outbox_wal_silent_reopens_total", r) != nil {
		t.Fatal("WAL series before any WAL news")
	}
	m.WALStream(outbox.WALStreamEvent{Reading: true})
	if value(t, reg, "outbox_wal_reading", r) != 1 || value(t, reg, "outbox_wal_silent_reopens_total", r) != 0 ||
		value(t, reg, "outbox_wal_slot_recreations_total", r) != 0 || value(t, reg, "outbox_wal_log_messages_total", r) != 0 {
		t.Fatal("reading, or the counters from zero, missing once the stream is live")
	}
	m.WALStream(outbox.WALStreamEvent{Reading: true, FromLog: 3})
	m.WALStream(outbox.WALStreamEvent{Reading: true, FromLog: 2})
	if got := value(t, reg, "outbox_wal_log_messages_total", r); got != 5 {
		t.Fatalf("messages from the log %v, want 5", got)
	}
	beat := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	m.WALStream(outbox.WALStreamEvent{Reading: true, Beat: beat})
	if got := value(t, reg, "outbox_wal_heartbeat_timestamp_seconds", r); got != float64(beat.Unix()) {
		t.Fatalf("heartbeat timestamp %v, want %d", got, beat.Unix())
	}
	m.WALStream(outbox.WALStreamEvent{})
	m.WALStream(outbox.WALStreamEvent{Silent: true})
	if value(t, reg, "outbox_wal_reading", r) != 0 || value(t, reg, "outbox_wal_silent_reopens_total", r) != 1 {
		t.Fatal("a silent stream not counted, or still reading")
	}
	m.WALStream(outbox.WALStreamEvent{Reading: true, Recreated: true})
	if value(t, reg, "outbox_wal_slot_recreations_total", r) != 1 {
		t.Fatal("a slot made anew not counted")
	}
	m.Running(outbox.RunningEvent{RelayID: "r"})
	if value(t, reg, "outbox_wal_reading", r) != 0 {
		t.Fatal("reading after the relay stopped")
	}
}

// TestTopicLabelsBounded: topics beyond MaxTopics share the series of OtherTopic.
func TestTopicLabelsBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(Config{Registerer: reg, Broker: "nats", MaxTopics: 2})
	m.Running(outbox.RunningEvent{RelayID: "r", Running: true})
	var batch []*outbox.Message
	for _, topic := range []string{"a", "b", "c", "d", "a", "c"} {
		batch = append(batch, &outbox.Message{Topic: topic, Seq: int64(len(batch) + 1)})
	}
	m.PublishDone(outbox.PublishEvent{Batch: batch, Start: time.Now()})
	for topic, want := range map[string]float64{"a": 2, "b": 1, OtherTopic: 3} {
		if got := value(t, reg, "outbox_published_total", map[string]string{"topic": topic}); got != want {
			t.Errorf("published_total{topic=%q} = %v, want %v", topic, got, want)
		}
	}
	if find(t, reg, "outbox_published_total", map[string]string{"topic": "c"}) != nil {
		t.Error("topic c has series of its own beyond MaxTopics")
	}
}
