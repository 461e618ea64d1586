package outboxprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outbox"
)

// DestinationCollector exports the state and counters of each destination of a relay's
// outbox.Router, read from Router.Stats on each scrape. Register it with
// prometheus.Registerer.Register, next to the relay's Metrics.
//
//	relay, err := outbox.NewRelay(store, router, outbox.RelayConfig{ID: "relay-1", ...})
//	reg.MustRegister(outboxprom.NewDestinationCollector(router.Stats, outboxprom.DestinationConfig{Relay: relay.ID()}))
type DestinationCollector struct {
	stats                           func() []outbox.DestinationStats
	relay                           string
	up, published, failed, deferred *prometheus.Desc
}

var _ prometheus.Collector = (*DestinationCollector)(nil)

// DestinationConfig configures a DestinationCollector.
type DestinationConfig struct {
	// Relay is the relay's ID, the relay label of every series (as Metrics has it).
	Relay string
	// ConstLabels are added to every series (an outbox label, say).
	ConstLabels prometheus.Labels
}

// NewDestinationCollector returns a collector of stats, a Router's Stats method.
func NewDestinationCollector(stats func() []outbox.DestinationStats, c DestinationConfig) *DestinationCollector {
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("outbox", "destination", name), help, []string{"relay", "destination"}, c.ConstLabels)
	}
	return &DestinationCollector{
		stats: stats, relay: c.Relay,
		up:        desc("up", "1 while the destination is up, 0 from an outage of it until a message reaches it again or its connection comes back."),
		published: desc("published_total", "Messages the destination confirmed."),
		failed:    desc("failed_total", "Messages the destination rejected (an attempt counted toward the relay's MaxAttempts)."),
		deferred:  desc("deferred_total", "Messages held back by outages of the destination, no attempt counted: sent again later."),
	}
}

// Describe implements prometheus.Collector.
func (c *DestinationCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.published, c.failed, c.deferred} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *DestinationCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.stats() {
		up := 0.0
		if s.Up {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up, c.relay, s.Name)
		ch <- prometheus.MustNewConstMetric(c.published, prometheus.CounterValue, float64(s.Published), c.relay, s.Name)
		ch <- prometheus.MustNewConstMetric(c.failed, prometheus.CounterValue, float64(s.Failed), c.relay, s.Name)
		ch <- prometheus.MustNewConstMetric(c.deferred, prometheus.CounterValue, float64(s.Deferred), c.relay, s.Name)
	}
}
