package outboxprom

import (
	"errors"
	"flag"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/refdocs"
	"github.com/outboxkit/outbox/outboxdriver"
)

var update = flag.Bool("update", false, "rewrite docs/reference/metrics.md from the registered metrics")

// TestReferenceDocs renders docs/reference/metrics.md from what Metrics and
// StatusCollector register and fails when the checked-in page differs: a metric added
// or reworded without regenerating would leave the reference wrong.
func TestReferenceDocs(t *testing.T) {
	relay, err := relayReference()
	if err != nil {
		t.Fatal(err)
	}
	status, err := statusReference()
	if err != nil {
		t.Fatal(err)
	}
	dests, err := destinationReference()
	if err != nil {
		t.Fatal(err)
	}
	page := refdocs.Metrics([]refdocs.MetricSet{
		{
			Title: "The relay's work (outboxprom.Metrics)",
			Intro: "An outbox.Observer that counts what one relay does. Every series carries `relay`, the relay's ID; " +
				"`topic` is the message's topic (at most Config.MaxTopics of them, the rest as `" + OtherTopic + "`); " +
				"`broker` is Config.Broker.",
			Metrics: relay,
		},
		{
			Title: "A relay's destinations (outboxprom.DestinationCollector)",
			Intro: "Read from an outbox.Router's Stats on each scrape, for a relay with several destinations " +
				"(`outbox relay` with a config file's `destinations`): `relay` is the relay's ID, `destination` the destination's name.",
			Metrics: dests,
		},
		{
			Title: "The outbox's state (outboxprom.StatusCollector)",
			Intro: "Read from the store (outboxdriver.Admin.Status) on each scrape: the same figures on every relay " +
				"of an outbox, so aggregate them with max, not sum.",
			Metrics: status,
		},
	})
	if err := refdocs.Check("..", "docs/reference/metrics.md", page, *update); err != nil {
		t.Error(err)
	}
}

// relayReference returns the metrics New registers. A vector shows in a scrape only once
// it has a series, so every observer event is played once; a metric registered but left
// without a series is an error, naming it, rather than a gap in the docs.
func relayReference() ([]refdocs.Metric, error) {
	reg := prometheus.NewRegistry()
	rec := &recordingRegisterer{Registerer: reg}
	m := New(Config{Registerer: rec, Broker: "nats"})
	now := time.Now()
	msg := &outbox.Message{Seq: 1, Topic: "orders", CreatedAt: now}
	m.Running(outbox.RunningEvent{RelayID: "relay-1", Running: true})
	m.FetchDone(outbox.FetchEvent{Messages: 1, Took: time.Millisecond})
	m.PublishDone(outbox.PublishEvent{Batch: []*outbox.Message{msg}, Start: now, Took: time.Millisecond})
	m.PublishDone(outbox.PublishEvent{Batch: []*outbox.Message{msg}, Errs: []error{errors.New("rejected")}, Start: now, Took: time.Millisecond})
	m.Rejected(outbox.RejectEvent{Message: msg, Err: errors.New("rejected"), Attempt: 1})
	m.Rejected(outbox.RejectEvent{Message: msg, Err: errors.New("rejected"), Attempt: 2, Dead: true})
	m.RecordDone(outbox.RecordEvent{Published: 1, Took: time.Millisecond})
	m.LeasesChanged(outbox.LeaseEvent{Held: 1, Gained: []int{0}, Live: 1})
	m.Paused(outbox.PauseEvent{Pause: time.Second})
	m.WALStream(outbox.WALStreamEvent{Reading: true, Beat: now})
	return gather(reg, rec.collectors)
}

// statusReference returns the metrics a StatusCollector reports for a status in which
// every part is present: a topic, partitions, the ring and a WAL slot.
func statusReference() ([]refdocs.Metric, error) {
	safe := int64(1 << 30)
	admin := &fakeAdmin{}
	admin.set(outboxdriver.Status{
		Topics:     []outboxdriver.TopicStatus{{Topic: "orders"}},
		Priorities: []outboxdriver.PriorityStatus{{Priority: 5, Pending: 1}, {Priority: 0}},
		Partitions: &outboxdriver.PartitionStatus{Count: 8, DaysAhead: 7},
		Ring:       &outboxdriver.RingStatus{},
		WAL:        []outboxdriver.WALSlotStatus{{Slot: "outbox_wal", State: "streaming", Exists: true, WALStatus: "reserved", SafeWALSizeBytes: &safe}},
	}, nil)
	reg := prometheus.NewRegistry()
	c := NewStatusCollector(admin, StatusConfig{})
	reg.MustRegister(c)
	return gather(reg, []prometheus.Collector{c})
}

// destinationReference returns the metrics a DestinationCollector reports.
func destinationReference() ([]refdocs.Metric, error) {
	reg := prometheus.NewRegistry()
	c := NewDestinationCollector(func() []outbox.DestinationStats {
		return []outbox.DestinationStats{{Name: "audit", Up: true, Published: 1}}
	}, DestinationConfig{Relay: "relay-1"})
	reg.MustRegister(c)
	return gather(reg, []prometheus.Collector{c})
}

// recordingRegisterer keeps the collectors registered through it, so that what they
// describe can be matched against what a scrape shows.
type recordingRegisterer struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (r *recordingRegisterer) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return r.Registerer.Register(c)
}

func (r *recordingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// descName reads the metric name out of a Desc, which has no accessor for it.
var descName = regexp.MustCompile(`fqName: "([^"]+)"`)

// gather scrapes reg and returns its metrics, sorted by name. Every metric the
// collectors describe must be in the scrape.
func gather(reg *prometheus.Registry, collectors []prometheus.Collector) ([]refdocs.Metric, error) {
	families, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	var out []refdocs.Metric
	seen := map[string]bool{}
	for _, f := range families {
		var labels []string
		if ms := f.GetMetric(); len(ms) > 0 {
			for _, l := range ms[0].GetLabel() {
				labels = append(labels, l.GetName())
			}
		}
		seen[f.GetName()] = true
		out = append(out, refdocs.Metric{Name: f.GetName(), Type: strings.ToLower(f.GetType().String()),
			Labels: labels, Help: f.GetHelp()})
	}
	var missing []string
	for _, c := range collectors {
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := descName.FindStringSubmatch(d.String())
			if m == nil {
				return nil, fmt.Errorf("cannot read the name of %s", d)
			}
			if !seen[m[1]] {
				missing = append(missing, m[1])
			}
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("registered but without a series to document: %s; give them one in reference_test.go", strings.Join(missing, ", "))
	}
	slices.SortFunc(out, func(a, b refdocs.Metric) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}
