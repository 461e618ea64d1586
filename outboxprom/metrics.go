package outboxprom

import (
	"cmp"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outbox"
)

// Buckets of the histograms, in seconds or messages. They can be replaced through
// Config.
var (
	// LatencyBucketsDefault spans a broker round trip (5 ms) to a long outage (10 min):
	// the publish and commit latencies.
	LatencyBucketsDefault = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
	// DurationBucketsDefault spans one database round trip (1 ms) to a statement timeout
	// (30 s): the fetch and record durations.
	DurationBucketsDefault = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	// BatchBucketsDefault spans one message to the largest fetch worth making.
	BatchBucketsDefault = []float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000}
)

// BrokerDefault is the broker label of a Metrics whose Config names none.
const BrokerDefault = "unknown"

// Config configures a Metrics. The zero value registers on prometheus.DefaultRegisterer
// with the default buckets.
type Config struct {
	// Registerer receives the metrics. Defaults to prometheus.DefaultRegisterer.
	Registerer prometheus.Registerer

	// Broker is the value of the broker label: the broker kind the relay publishes to
	// (nats, amqp, kafka, redis, sqs, webhook). Defaults to BrokerDefault ("unknown").
	Broker string

	// ConstLabels are added to every metric (a service or outbox name, say). Every
	// Metrics on one registerer must use the same label names. Optional.
	ConstLabels prometheus.Labels

	// LatencyBuckets, DurationBuckets and BatchBuckets are the histograms' buckets.
	// Default to LatencyBucketsDefault, DurationBucketsDefault and BatchBucketsDefault.
	LatencyBuckets  []float64
	DurationBuckets []float64
	BatchBuckets    []float64

	// MaxTopics is how many distinct topics get series of their own (the topic label of
	// the counters and histograms); the messages of later topics are counted under the
	// topic OtherTopic, so that the number of series stays bounded however many topics
	// the application invents. Defaults to MaxTopicsDefault; -1 means no limit.
	MaxTopics int
}

// MaxTopicsDefault is Config.MaxTopics' default.
const MaxTopicsDefault = 200

// OtherTopic is the topic label of the messages of the topics beyond Config.MaxTopics.
const OtherTopic = "_other"

// Metrics is an outbox.Observer that keeps Prometheus metrics of one relay. Pass it in
// outbox.RelayConfig.Observer; use one Metrics per relay. The relay label of its series
// is the relay's ID, learnt when the relay starts (Observer.Running).
//
// Several Metrics may register on one registerer (several relays in one process): they
// share the collectors and tell their series apart by the relay label.
//
// Metrics is safe for concurrent use.
type Metrics struct {
	broker string
	vecs   *vecs
	now    func() time.Time // the clock of the commit-latency bound; a test replaces it

	cur atomic.Pointer[relayMetrics]

	mu      sync.Mutex
	fetches [fetchRing]time.Time // when recent non-empty fetches returned, oldest overwritten first
	nfetch  int                  // fetches recorded so far
	seen    map[int64]time.Time  // seq -> first-seen bound of messages that failed an attempt here
	lastPub time.Time            // the latest confirmation

	maxTopics int
	topicMu   sync.Mutex
	topics    map[string]bool // the topics that have series of their own
}

// fetchRing is how many recent fetches the commit-latency bound remembers. A publish
// that started before all of them falls back to its own start, a looser bound.
const fetchRing = 128

// maxSeen bounds the messages remembered between a failed attempt and their next: a
// message whose shard moved away is never seen again, so the map is cleared when full
// (those messages then fall back to the start of the fetch that handed them over again).
const maxSeen = 1 << 16

var _ outbox.Observer = (*Metrics)(nil)

// vecs are the collectors, shared by every Metrics on a registerer.
type vecs struct {
	up, shardsHeld, lastPublish                          *prometheus.GaugeVec
	published, failed, retried, dead                     *prometheus.CounterVec
	gained, lost, refused, pauses, fetchErrs, recordErrs *prometheus.CounterVec
	publishLatency, commitLatency                        *prometheus.HistogramVec
	publishBatch, fetchBatch, fetchDur, recordDur        *prometheus.HistogramVec
	walReading, walBeat                                  *prometheus.GaugeVec
	walSilent, walRecreated, walFromLog                  *prometheus.CounterVec
}

// relayMetrics are the collectors curried with one relay's labels.
type relayMetrics struct {
	relay                                                string
	up, shardsHeld, lastPublish                          prometheus.Gauge
	published, retried, dead                             *prometheus.CounterVec // by topic
	failedOutage, failedDestination, failedRejected      *prometheus.CounterVec // by topic
	publishLatency, commitLatency                        prometheus.ObserverVec // by topic
	gained, lost, refused, pauses, fetchErrs, recordErrs prometheus.Counter
	publishBatch, fetchBatch, fetchDur, recordDur        prometheus.Observer
	wal                                                  atomic.Bool // the WAL series exist (WALStream was called)
}

// New returns a Metrics registered on c.Registerer. Registering collectors that are
// already there (another Metrics with the same names, labels and help) reuses them; any
// other registration error, such as a metric of the same name with other labels, panics,
// as prometheus.MustRegister does.
func New(c Config) *Metrics {
	reg := c.Registerer
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	latency := orDefault(c.LatencyBuckets, LatencyBucketsDefault)
	durations := orDefault(c.DurationBuckets, DurationBucketsDefault)
	batches := orDefault(c.BatchBuckets, BatchBucketsDefault)
	cl := c.ConstLabels

	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "outbox", Name: name, Help: help, ConstLabels: cl}, labels))
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "outbox", Name: name, Help: help, ConstLabels: cl}, labels))
	}
	histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "outbox", Name: name, Help: help, ConstLabels: cl, Buckets: buckets}, labels))
	}
	v := &vecs{
		up:          gauge("relay_up", "1 while the relay runs, 0 once it stopped.", "relay"),
		shardsHeld:  gauge("shards_held", "Shards the relay holds a lease on.", "relay"),
		lastPublish: gauge("last_publish_timestamp_seconds", "Unix time of the relay's last publish the broker confirmed.", "relay"),

		published: counter("published_total", "Messages the broker confirmed (counted at the confirmation).", "relay", "topic", "broker"),
		failed:    counter("publish_failed_total", "Publish attempts that failed: reason outage (the broker unreachable; not counted as an attempt), destination (this message's destination unavailable; not counted, the message waits) or rejected (counted).", "relay", "topic", "broker", "reason"),
		retried:   counter("retried_total", "Rejected messages scheduled for another attempt.", "relay", "topic", "broker"),
		dead:      counter("dead_lettered_total", "Messages dead-lettered after their last rejected attempt.", "relay", "topic", "broker"),

		gained:     counter("shards_gained_total", "Shard leases the relay took: at start, after a rebalance, or over from a relay that died.", "relay"),
		lost:       counter("shards_lost_total", "Shard leases the relay lost or gave back: at stop, after a rebalance, or taken over while it stalled.", "relay"),
		refused:    counter("outcomes_refused_total", "Publish outcomes not recorded because the relay's lease had moved on (fenced); the new owner publishes those messages again.", "relay"),
		pauses:     counter("broker_pauses_total", "Pauses of sending after a broker outage.", "relay"),
		fetchErrs:  counter("fetch_errors_total", "Fetches of due messages that failed (database errors).", "relay"),
		recordErrs: counter("record_errors_total", "Recordings of publish outcomes that failed and were retried (database errors).", "relay"),

		publishLatency: histogram("publish_latency_seconds", "From the message's created_at (database time of the writing transaction) to the broker's confirmation.", latency, "relay", "topic"),
		commitLatency:  histogram("commit_latency_seconds", "From when the message was known committed (a lower bound: the end of the fetch that handed it to the relay) to the broker's confirmation.", latency, "relay", "topic"),
		publishBatch:   histogram("publish_batch_size", "Messages per publish call.", batches, "relay"),
		fetchBatch:     histogram("fetch_batch_size", "Messages per fetch that returned any.", batches, "relay"),
		fetchDur:       histogram("fetch_duration_seconds", "Duration of fetches of due messages, failed and empty ones included.", durations, "relay"),
		recordDur:      histogram("record_duration_seconds", "Duration of the database writes that record publish outcomes.", durations, "relay"),

		walReading:   gauge("wal_reading", "WAL mode: 1 while the relay streams the replication slot (it is the slot's reader and the stream is live), else 0.", "relay"),
		walBeat:      gauge("wal_heartbeat_timestamp_seconds", "WAL mode: Unix time at which the last heartbeat the relay wrote into the log came back through its stream.", "relay"),
		walSilent:    counter("wal_silent_reopens_total", "WAL mode: times the relay found its stream silent (no heartbeat, nothing else, for three heartbeat intervals) and opened it again.", "relay"),
		walFromLog:   counter("wal_log_messages_total", "WAL mode: messages the relay took from the stream to publish without fetching them (the log path; the rest are fetched).", "relay"),
		walRecreated: counter("wal_slot_recreations_total", "WAL mode: times the relay made its replication slot anew after PostgreSQL lost it (max_slot_wal_keep_size) or it went missing (dropped by hand, a failover).", "relay"),
	}
	return &Metrics{broker: cmp.Or(c.Broker, BrokerDefault), vecs: v, now: time.Now, seen: map[int64]time.Time{},
		maxTopics: cmp.Or(c.MaxTopics, MaxTopicsDefault), topics: map[string]bool{}}
}

// topic returns the topic label of a message of topic t: t itself for the first
// maxTopics topics seen, OtherTopic for the rest.
func (m *Metrics) topic(t string) string {
	if m.maxTopics < 0 {
		return t
	}
	m.topicMu.Lock()
	defer m.topicMu.Unlock()
	switch {
	case m.topics[t]:
		return t
	case len(m.topics) >= m.maxTopics:
		return OtherTopic
	}
	m.topics[t] = true
	return t
}

func orDefault(v, def []float64) []float64 {
	if len(v) == 0 {
		return def
	}
	return v
}

// relay returns the collectors of the relay that last reported Running. Before any did,
// they carry an empty relay label (the relay calls Running first, so only a Metrics
// driven by hand sees that).
func (m *Metrics) relay() *relayMetrics {
	if r := m.cur.Load(); r != nil {
		return r
	}
	m.cur.CompareAndSwap(nil, m.curry(""))
	return m.cur.Load()
}

// register registers c, or returns the collector already registered in its place.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	panic(err)
}

func (m *Metrics) curry(relay string) *relayMetrics {
	v := m.vecs
	rl := prometheus.Labels{"relay": relay}
	rb := prometheus.Labels{"relay": relay, "broker": m.broker}
	return &relayMetrics{
		relay:             relay,
		up:                v.up.With(rl),
		shardsHeld:        v.shardsHeld.With(rl),
		lastPublish:       v.lastPublish.With(rl),
		published:         v.published.MustCurryWith(rb),
		retried:           v.retried.MustCurryWith(rb),
		dead:              v.dead.MustCurryWith(rb),
		failedOutage:      v.failed.MustCurryWith(prometheus.Labels{"relay": relay, "broker": m.broker, "reason": "outage"}),
		failedRejected:    v.failed.MustCurryWith(prometheus.Labels{"relay": relay, "broker": m.broker, "reason": "rejected"}),
		failedDestination: v.failed.MustCurryWith(prometheus.Labels{"relay": relay, "broker": m.broker, "reason": "destination"}),
		publishLatency:    v.publishLatency.MustCurryWith(rl),
		commitLatency:     v.commitLatency.MustCurryWith(rl),
		gained:            v.gained.With(rl),
		lost:              v.lost.With(rl),
		refused:           v.refused.With(rl),
		pauses:            v.pauses.With(rl),
		fetchErrs:         v.fetchErrs.With(rl),
		recordErrs:        v.recordErrs.With(rl),
		publishBatch:      v.publishBatch.With(rl),
		fetchBatch:        v.fetchBatch.With(rl),
		fetchDur:          v.fetchDur.With(rl),
		recordDur:         v.recordDur.With(rl),
	}
}

// Running implements outbox.Observer. When the relay starts it learns the relay's ID
// (the relay label) and creates the relay's series, at zero where they count, so that
// rate() and increase() see them from the start.
func (m *Metrics) Running(e outbox.RunningEvent) {
	r := m.cur.Load()
	if r == nil || r.relay != e.RelayID {
		r = m.curry(e.RelayID)
		m.cur.Store(r)
	}
	if !e.Running {
		r.up.Set(0)
		r.shardsHeld.Set(0)
		if r.wal.Load() {
			m.vecs.walReading.WithLabelValues(r.relay).Set(0)
		}
		return
	}
	r.up.Set(1)
	r.shardsHeld.Set(0)
}

// FetchDone implements outbox.Observer.
func (m *Metrics) FetchDone(e outbox.FetchEvent) {
	r := m.relay()
	r.fetchDur.Observe(e.Took.Seconds())
	if e.Err != nil {
		r.fetchErrs.Inc()
		return
	}
	if e.Messages == 0 {
		return
	}
	r.fetchBatch.Observe(float64(e.Messages))
	now := m.now()
	m.mu.Lock()
	m.fetches[m.nfetch%fetchRing] = now
	m.nfetch++
	m.mu.Unlock()
}

// PublishDone implements outbox.Observer.
func (m *Metrics) PublishDone(e outbox.PublishEvent) {
	batch, errs, start := e.Batch, e.Errs, e.Start
	r := m.relay()
	r.publishBatch.Observe(float64(len(batch)))
	confirmed := start.Add(e.Took)
	m.mu.Lock()
	defer m.mu.Unlock()
	fetched := m.fetchedBefore(start)
	some := false
	for i, msg := range batch {
		var err error
		if errs != nil {
			err = errs[i]
		}
		topic := m.topic(msg.Topic)
		seen, ok := m.seen[msg.Seq]
		if !ok {
			seen = fetched
		}
		switch {
		case err == nil:
			some = true
			delete(m.seen, msg.Seq)
			r.published.WithLabelValues(topic).Inc()
			if !msg.CreatedAt.IsZero() {
				r.publishLatency.WithLabelValues(topic).Observe(max(confirmed.Sub(msg.CreatedAt), 0).Seconds())
			}
			r.commitLatency.WithLabelValues(topic).Observe(max(confirmed.Sub(seen), 0).Seconds())
		case outbox.IsOutage(err):
			r.failedOutage.WithLabelValues(topic).Inc()
			m.remember(msg.Seq, seen)
		case outbox.IsUnavailable(err): // not the broker's outage: its destination's
			r.failedDestination.WithLabelValues(topic).Inc()
			m.remember(msg.Seq, seen)
		default:
			r.failedRejected.WithLabelValues(topic).Inc()
			m.remember(msg.Seq, seen)
		}
	}
	if some && confirmed.After(m.lastPub) {
		m.lastPub = confirmed
		r.lastPublish.Set(float64(confirmed.UnixNano()) / 1e9)
	}
}

// fetchedBefore returns when the last non-empty fetch that returned before start
// returned: every message of a publish that started at start was committed by then.
// When the ring has nothing that old, start itself is the bound. Called with m.mu held.
func (m *Metrics) fetchedBefore(start time.Time) time.Time {
	for i := 1; i <= min(m.nfetch, fetchRing); i++ {
		if t := m.fetches[(m.nfetch-i)%fetchRing]; !t.After(start) {
			return t
		}
	}
	return start
}

// remember keeps the first-seen bound of a message that failed an attempt, for the
// commit latency of its eventual confirmation. Called with m.mu held.
func (m *Metrics) remember(seq int64, seen time.Time) {
	if _, ok := m.seen[seq]; ok {
		return
	}
	if len(m.seen) >= maxSeen {
		clear(m.seen)
	}
	m.seen[seq] = seen
}

// Rejected implements outbox.Observer.
func (m *Metrics) Rejected(e outbox.RejectEvent) {
	msg := e.Message
	r := m.relay()
	if e.Destination != "" {
		return // not an attempt: publish_failed_total{reason="destination"} counts it
	}
	if !e.Dead {
		r.retried.WithLabelValues(m.topic(msg.Topic)).Inc()
		return
	}
	r.dead.WithLabelValues(m.topic(msg.Topic)).Inc()
	m.mu.Lock()
	delete(m.seen, msg.Seq)
	m.mu.Unlock()
}

// RecordDone implements outbox.Observer.
func (m *Metrics) RecordDone(e outbox.RecordEvent) {
	r := m.relay()
	if e.Took > 0 { // 0: only outcomes refused without asking the store
		r.recordDur.Observe(e.Took.Seconds())
	}
	if e.Err != nil {
		r.recordErrs.Inc()
	}
	r.refused.Add(float64(e.Refused))
}

// LeasesChanged implements outbox.Observer.
func (m *Metrics) LeasesChanged(e outbox.LeaseEvent) {
	r := m.relay()
	r.shardsHeld.Set(float64(e.Held))
	r.gained.Add(float64(len(e.Gained)))
	r.lost.Add(float64(len(e.Lost)))
}

// Paused implements outbox.Observer.
func (m *Metrics) Paused(outbox.PauseEvent) { m.relay().pauses.Inc() }

var _ outbox.WALObserver = (*Metrics)(nil)

// WALStream implements outbox.WALObserver. The WAL series appear with the first event,
// so a polling relay has none.
func (m *Metrics) WALStream(e outbox.WALStreamEvent) {
	r := m.relay()
	v := m.vecs
	if !r.wal.Swap(true) { // the counters from zero, for increase()
		v.walSilent.WithLabelValues(r.relay)
		v.walRecreated.WithLabelValues(r.relay)
		v.walFromLog.WithLabelValues(r.relay)
	}
	reading := 0.0
	if e.Reading {
		reading = 1
	}
	v.walReading.WithLabelValues(r.relay).Set(reading)
	if !e.Beat.IsZero() {
		v.walBeat.WithLabelValues(r.relay).Set(float64(e.Beat.UnixNano()) / 1e9)
	}
	if e.Silent {
		v.walSilent.WithLabelValues(r.relay).Inc()
	}
	if e.Recreated {
		v.walRecreated.WithLabelValues(r.relay).Inc()
	}
	if e.FromLog > 0 {
		v.walFromLog.WithLabelValues(r.relay).Add(float64(e.FromLog))
	}
}
