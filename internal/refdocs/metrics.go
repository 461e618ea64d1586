package refdocs

import (
	"fmt"
	"strings"
)

// Metric is one metric family as a Prometheus scrape shows it.
type Metric struct {
	Name   string // outbox_published_total
	Type   string // counter, gauge, histogram
	Labels []string
	Help   string // the HELP line
}

// MetricSet is the metrics one collector registers.
type MetricSet struct {
	Title   string // the section's heading
	Intro   string // a paragraph on where the series come from
	Metrics []Metric
}

// Metrics renders metrics.md: every metric of every set, with its type, labels and help.
func Metrics(sets []MetricSet) []byte {
	var b strings.Builder
	header(&b, "Metrics reference", "the collectors of package outboxprom")
	b.WriteString("Every metric outboxprom registers, with its type, labels and help text as a scrape shows them. " +
		"`outbox relay --metrics-addr :9187` serves both sets. What the figures mean, the latencies, " +
		"health endpoints and PromQL are in [observability.md](../observability.md); the alerts on them in " +
		"[operations.md](../operations.md#alerts-and-runbooks).\n")
	for _, s := range sets {
		fmt.Fprintf(&b, "\n## %s\n\n%s\n\n", s.Title, s.Intro)
		b.WriteString("| Metric | Type | Labels | Help |\n|---|---|---|---|\n")
		for _, m := range s.Metrics {
			labels := make([]string, len(m.Labels))
			for i, l := range m.Labels {
				labels[i] = code(l)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", code(m.Name), m.Type, strings.Join(labels, ", "), cell(m.Help))
		}
	}
	return []byte(b.String())
}
