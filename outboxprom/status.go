package outboxprom

import (
	"cmp"
	"context"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults for StatusConfig.
const (
	StatusTimeoutDefault = 5 * time.Second
	StatusMaxAgeDefault  = time.Second
)

// maxTopics bounds the topics a StatusCollector remembers to report at zero.
const maxTopics = 10_000

// maxPriorities bounds the priorities a StatusCollector reports: the Writer allows 0 to
// outbox.MaxPriority, and an INSERT by hand may hold any number.
const maxPriorities = 100

// StatusConfig configures a StatusCollector. The zero value is usable.
type StatusConfig struct {
	// Timeout bounds one Admin.Status call. Defaults to StatusTimeoutDefault (5s); keep
	// it under Prometheus's scrape timeout (10s by default).
	Timeout time.Duration

	// MaxAge is how long a snapshot answers scrapes before the next scrape reads a new
	// one, so that several scrapers (or dashboards) cost the database one Status a
	// MaxAge. -1 reads a snapshot for every scrape. Defaults to StatusMaxAgeDefault (1s).
	MaxAge time.Duration

	// ConstLabels are added to every metric. Optional.
	ConstLabels prometheus.Labels

	// Logger hears when Status starts failing (with the error) and when it recovers.
	// Defaults to none: the failure shows only as outbox_status_up 0.
	Logger *slog.Logger
}

// StatusCollector is a prometheus.Collector of an outbox's state, read with Admin.Status
// when Prometheus scrapes: the pending, due, retrying and dead messages and the oldest
// pending age per topic, the live relays and the leased shards. Register it once per
// outbox, next to the relay's Metrics (every relay of an outbox reports the same figures:
// aggregate them with max, not sum).
//
// A topic, once seen, is reported with zeros after its last message is gone (until the
// process restarts), so that its series do not vanish from dashboards and alerts. When
// Status fails or times out, the scrape still succeeds: outbox_status_up is 0 and the
// other series are left out, never reported with stale values.
//
// StatusCollector is safe for concurrent use; concurrent scrapes share one Status call.
type StatusCollector struct {
	admin outboxdriver.Admin
	cfg   StatusConfig
	now   func() time.Time

	up, pending, due, retrying, dead, oldest *prometheus.Desc
	prioPending, prioOldest                  *prometheus.Desc
	relaysLive, routings                     *prometheus.Desc
	shards, shardsLeased                     *prometheus.Desc
	partitions, daysAhead, oldestTx          *prometheus.Desc
	ringRotations, ringRows                  *prometheus.Desc
	walSource, walExists, walActive          *prometheus.Desc
	walStatus, walLag, walRetained, walSafe  *prometheus.Desc

	mu     sync.Mutex // held during a Status call, so that concurrent scrapes wait for it
	at     time.Time  // when snap or err was read; zero before the first read
	snap   outboxdriver.Status
	err    error
	topics map[string]bool
	prios  map[int]bool // the priorities seen, reported at zero once their backlog is gone
}

var _ prometheus.Collector = (*StatusCollector)(nil)

// NewStatusCollector returns a collector that reads admin's Status on scrapes. Register
// it with prometheus.Registerer.Register.
func NewStatusCollector(admin outboxdriver.Admin, c StatusConfig) *StatusCollector {
	c.Timeout = cmp.Or(c.Timeout, StatusTimeoutDefault)
	c.MaxAge = cmp.Or(c.MaxAge, StatusMaxAgeDefault)
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("outbox", "", name), help, labels, c.ConstLabels)
	}
	return &StatusCollector{
		admin: admin, cfg: c, now: time.Now, topics: map[string]bool{}, prios: map[int]bool{},
		up:            desc("status_up", "1 when the last read of the outbox's status succeeded, 0 when it failed or timed out."),
		pending:       desc("pending", "Messages not yet published and not dead, due or not.", "topic"),
		due:           desc("due", "Pending messages due now (not waiting for a retry backoff or DeliverAt).", "topic"),
		retrying:      desc("retrying", "Pending messages rejected at least once, waiting for or due for another attempt.", "topic"),
		dead:          desc("dead", "Dead-lettered messages.", "topic"),
		oldest:        desc("oldest_pending_age_seconds", "Age of the oldest pending message, from its created_at, in database time (0 when none is pending).", "topic"),
		prioPending:   desc("priority_pending", "Pending messages of a priority (Message.Priority), once a message with a priority was pending.", "priority"),
		prioOldest:    desc("priority_oldest_pending_age_seconds", "Age of the oldest pending message of a priority, from its created_at, in database time (0 when none is pending).", "priority"),
		relaysLive:    desc("relays_live", "Relays with an unexpired heartbeat."),
		routings:      desc("relay_routings", "Different fingerprints of destinations and routing among the live relays that state one: above 1, the relays of one routing take no shards until those of the other stop (a rolling change of the routing, or relays configured differently)."),
		shards:        desc("shards", "Shards the outbox is divided into."),
		shardsLeased:  desc("shards_leased", "Shards with an unexpired lease."),
		partitions:    desc("partitions", "Daily partitions of the published history (PostgreSQL; absent for a store without them)."),
		daysAhead:     desc("partition_days_ahead", "Days after today (UTC) that already have a partition of the published history; below 0, recording outcomes fails until one is created."),
		ringRotations: desc("ring_rotations", "Times the pending ring moved on to its other bucket since it was created (PostgreSQL, schema version 4; absent for a store without a ring)."),
		ringRows:      desc("ring_rows_since_rotation", "Messages written since the pending ring last moved on. Far above the store's RotateRows, the other bucket holds over a thousand long-pending messages and cannot be emptied: the ring stops protecting fetches from a long-open snapshot."),
		walSource:     desc("wal_source", "WAL mode, per slot: 1 for the state the relay reading it recorded (starting, streaming, fallback: the relays poll), 0 for the others.", "slot", "state"),
		walExists:     desc("wal_slot_exists", "WAL mode: 1 when PostgreSQL has the recorded slot, 0 when it is gone (dropped, or lost in a failover): the relays poll.", "slot"),
		walActive:     desc("wal_slot_active", "WAL mode: 1 when a session reads the slot.", "slot"),
		walStatus:     desc("wal_slot_status", "WAL mode: 1 for the slot's wal_status (reserved, extended, unreserved, lost), 0 for the others.", "slot", "status"),
		walLag:        desc("wal_slot_lag_bytes", "WAL mode: how far the slot's confirmed position is behind the server's WAL.", "slot"),
		walRetained:   desc("wal_slot_retained_bytes", "WAL mode: WAL the slot keeps on the server's disk.", "slot"),
		walSafe:       desc("wal_slot_safe_wal_size_bytes", "WAL mode: WAL that may still be written before the slot is lost (absent when max_slot_wal_keep_size is -1, no limit).", "slot"),
		oldestTx:      desc("oldest_transaction_age_seconds", "Age of the oldest transaction holding a snapshot or transaction id in the outbox's database: while it is open, vacuum removes nothing deleted since it began (0 when none, or when the database does not show it)."),
	}
}

// Describe implements prometheus.Collector.
func (s *StatusCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{s.up, s.pending, s.due, s.retrying, s.dead, s.oldest, s.prioPending, s.prioOldest, s.relaysLive, s.routings, s.shards, s.shardsLeased,
		s.partitions, s.daysAhead, s.oldestTx, s.ringRotations, s.ringRows,
		s.walSource, s.walExists, s.walActive, s.walStatus, s.walLag, s.walRetained, s.walSafe} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *StatusCollector) Collect(ch chan<- prometheus.Metric) {
	st, topics, prios, err := s.read()
	if err != nil {
		ch <- prometheus.MustNewConstMetric(s.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(s.up, prometheus.GaugeValue, 1)
	byTopic := make(map[string]outboxdriver.TopicStatus, len(st.Topics))
	for _, t := range st.Topics {
		byTopic[t.Topic] = t
	}
	for _, name := range topics {
		t := byTopic[name] // zero for a topic gone quiet
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, name)
		}
		gauge(s.pending, float64(t.Pending))
		gauge(s.due, float64(t.Due))
		gauge(s.retrying, float64(t.Retrying))
		gauge(s.dead, float64(t.Dead))
		gauge(s.oldest, t.OldestPendingAge.Seconds())
	}
	byPriority := make(map[int]outboxdriver.PriorityStatus, len(st.Priorities))
	for _, p := range st.Priorities {
		byPriority[p.Priority] = p
	}
	for _, prio := range prios {
		p, label := byPriority[prio], strconv.Itoa(prio) // zero for a priority gone quiet
		ch <- prometheus.MustNewConstMetric(s.prioPending, prometheus.GaugeValue, float64(p.Pending), label)
		ch <- prometheus.MustNewConstMetric(s.prioOldest, prometheus.GaugeValue, p.OldestPendingAge.Seconds(), label)
	}
	live := 0
	for _, r := range st.Relays {
		if r.Live {
			live++
		}
	}
	ch <- prometheus.MustNewConstMetric(s.relaysLive, prometheus.GaugeValue, float64(live))
	ch <- prometheus.MustNewConstMetric(s.routings, prometheus.GaugeValue, float64(len(st.Fingerprints())))
	ch <- prometheus.MustNewConstMetric(s.shards, prometheus.GaugeValue, float64(st.Shards))
	ch <- prometheus.MustNewConstMetric(s.shardsLeased, prometheus.GaugeValue, float64(st.ShardsLeased))
	ch <- prometheus.MustNewConstMetric(s.oldestTx, prometheus.GaugeValue, st.OldestTransactionAge.Seconds())
	if p := st.Partitions; p != nil {
		ch <- prometheus.MustNewConstMetric(s.partitions, prometheus.GaugeValue, float64(p.Count))
		ch <- prometheus.MustNewConstMetric(s.daysAhead, prometheus.GaugeValue, float64(p.DaysAhead))
	}
	if r := st.Ring; r != nil {
		ch <- prometheus.MustNewConstMetric(s.ringRotations, prometheus.GaugeValue, float64(r.Rotations))
		ch <- prometheus.MustNewConstMetric(s.ringRows, prometheus.GaugeValue, float64(r.RowsSinceRotation))
	}
	for _, w := range st.WAL {
		s.collectWAL(ch, w)
	}
}

// collectWAL reports one WAL-mode slot.
func (s *StatusCollector) collectWAL(ch chan<- prometheus.Metric, w outboxdriver.WALSlotStatus) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{w.Slot}, labels...)...)
	}
	one := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	for _, state := range []string{"starting", "streaming", "fallback"} {
		gauge(s.walSource, one(w.State == state), state)
	}
	gauge(s.walExists, one(w.Exists))
	if !w.Exists {
		return
	}
	gauge(s.walActive, one(w.Active))
	for _, status := range []string{"reserved", "extended", "unreserved", "lost"} {
		gauge(s.walStatus, one(w.WALStatus == status), status)
	}
	gauge(s.walLag, float64(w.LagBytes))
	gauge(s.walRetained, float64(w.RetainedBytes))
	if w.SafeWALSizeBytes != nil {
		gauge(s.walSafe, float64(*w.SafeWALSizeBytes))
	}
}

// read returns a snapshot no older than MaxAge, reading a new one if needed, and the
// topics and priorities to report, sorted.
func (s *StatusCollector) read() (outboxdriver.Status, []string, []int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.at.IsZero() || s.cfg.MaxAge < 0 || s.now().Sub(s.at) >= s.cfg.MaxAge {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
		st, err := s.admin.Status(ctx)
		cancel()
		if log := s.cfg.Logger; log != nil {
			switch {
			case err != nil && (s.err == nil || s.at.IsZero()):
				log.Warn("outbox status unavailable: outbox_status_up is 0 until it recovers", "err", err)
			case err == nil && s.err != nil:
				log.Info("outbox status available again")
			}
		}
		s.snap, s.err, s.at = st, err, s.now()
		if err == nil {
			for _, t := range st.Topics {
				if len(s.topics) < maxTopics {
					s.topics[t.Topic] = true
				}
			}
			for _, p := range st.Priorities {
				if len(s.prios) < maxPriorities {
					s.prios[p.Priority] = true
				}
			}
		}
	}
	if s.err != nil {
		return outboxdriver.Status{}, nil, nil, s.err
	}
	prios := slices.Sorted(maps.Keys(s.prios))
	topics := make([]string, 0, len(s.topics))
	for t := range s.topics {
		topics = append(topics, t)
	}
	// A topic over the limit is still reported while it has messages.
	for _, t := range s.snap.Topics {
		if !s.topics[t.Topic] {
			topics = append(topics, t.Topic)
		}
	}
	sort.Strings(topics)
	return s.snap, topics, prios, nil
}
