package torture

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxkit/outbox"
)

// FaultSpan is one injected fault as the timing measurement sees it: its kind, when it
// was injected and when it was healed. A fault that heals itself at once (a terminated
// connection) has Heal at the moment the injection returned.
type FaultSpan struct {
	Kind        string
	Start, Heal time.Time
	// CannotBlock marks a kind that slows publishing at most (added latency, a snapshot
	// held open elsewhere): its heal-to-first-arrival is listed but left out of
	// Timing.Heal, since the first arrival after its heal says nothing about recovery.
	CannotBlock bool
}

// Dist summarises a sample of durations: its size and nearest-rank percentiles.
type Dist struct {
	N             int
	P50, P99, Max time.Duration
}

// NewDist summarises sample, which it sorts in place.
func NewDist(sample []time.Duration) Dist {
	slices.Sort(sample)
	if len(sample) == 0 {
		return Dist{}
	}
	return Dist{N: len(sample), P50: Percentile(sample, 50), P99: Percentile(sample, 99), Max: sample[len(sample)-1]}
}

// Percentile returns the p-th percentile (0 < p <= 100) of sorted by the nearest-rank
// method: the smallest value with at least p% of the sample at or below it, always a
// value of the sample (with fewer than 100 values, the 99th is the largest). It returns 0
// for an empty sample.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p * float64(len(sorted)) / 100)) // p*n is exact for whole p and n
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// KindTiming is the heal-to-first-arrival of one fault kind.
type KindTiming struct {
	Kind        string
	CannotBlock bool
	// Faults counts the faults of this kind that were healed.
	Faults int
	// Flowing counts those during whose hold's second half some copy still arrived
	// (another relay, or a fault that only slows): for them the heal is not the end of an
	// outage, and the time to the first arrival after it is not a recovery time. The first
	// half is left out so that copies the broker stored as the fault began do not count.
	Flowing int
	// NoArrival counts the faults after whose heal nothing arrived at all (the end of
	// the run): they have no value in Dist.
	NoArrival int
	// NextFault counts the faults whose first arrival after the heal came only after the
	// next fault had started (a relay killed, then its successor stopped before it
	// published anything): their value in Dist ends where the next fault began, which is
	// all that is known of their own recovery; the wait from there on is the next
	// fault's, measured from its own heal.
	NextFault int
	Dist      Dist
}

// Timing is what a run measured of latency and recovery, from the commit and arrival
// times of its history and delivery log and the nemesis' fault spans. Figures, never a
// verdict: no check depends on them, since they depend on the machine's speed.
type Timing struct {
	// Latency is commit-to-arrival over the whole run: for each event of a transaction
	// whose COMMIT returned success (not one Resolve settled, whose commit instant is
	// unknown), the earliest arrival of any of its copies minus the instant COMMIT
	// returned. Events never delivered have none. Latency.N is 0 when the broker's
	// read-back gives no arrival times.
	Latency Dist
	// Quiet is Latency over the events committed while no fault was in progress (between
	// a fault's start and its heal), and Faulted over the others: a relay slow in steady
	// state shows in Quiet, one slow to recover in Faulted.
	Quiet, Faulted Dist
	// Kinds is the heal-to-first-arrival per fault kind, sorted by kind: for each healed
	// fault, the time to the first arrival of any copy at or after its heal, counted from
	// the heal or, when no committed event was waiting then, from the first commit after
	// it (FaultTiming.Ready).
	Kinds []KindTiming
	// Heal is heal-to-first-arrival over every fault whose kind can block publishing.
	Heal Dist
	// Faults is each fault's own figure, in the order injected, for a closer look at one
	// (the runs keep it in their artifacts, timing.jsonl).
	Faults []FaultTiming
}

// FaultTiming is one fault's heal-to-first-arrival.
type FaultTiming struct {
	Kind  string    `json:"kind"`
	Start time.Time `json:"start"`
	Heal  time.Time `json:"heal"`
	// Ready is when something was first waiting to be published after the heal: the
	// heal, or the first commit after it when nothing committed was waiting.
	Ready   time.Time `json:"ready,omitzero"`
	First   time.Time `json:"first_arrival,omitzero"`    // zero: nothing arrived after the heal
	HealMS  float64   `json:"heal_to_first_ms,omitzero"` // First (or the next fault's start, if earlier) - Ready
	Flowing bool      `json:"flowing,omitempty"`         // copies still arrived in the hold's second half
}

// Measure computes the run's Timing. Arrival times come from the deliveries'
// Arrived, commit times from the transactions' End; a delivery without an arrival time
// counts in neither figure.
func Measure(h *History, log *DeliveryLog, faults []FaultSpan) Timing {
	committedAt := map[outbox.ID]time.Time{}
	for _, t := range h.Txns() {
		if t.Outcome != Committed || t.Resolved {
			continue
		}
		for _, e := range t.Events {
			committedAt[e.ID] = t.End
		}
	}
	deliveries, _ := log.snapshot()
	first := map[outbox.ID]time.Time{}
	arrivals := make([]time.Time, 0, len(deliveries))
	for _, d := range deliveries {
		if d.Arrived.IsZero() {
			continue
		}
		arrivals = append(arrivals, d.Arrived)
		if f, ok := first[d.ID]; !ok || d.Arrived.Before(f) {
			first[d.ID] = d.Arrived
		}
	}
	var lat []time.Duration
	var waits []wait
	for id, at := range first {
		if c, ok := committedAt[id]; ok {
			lat = append(lat, at.Sub(c))
			waits = append(waits, wait{c, at})
		}
	}
	slices.SortFunc(arrivals, func(a, b time.Time) int { return a.Compare(b) })

	var tm Timing
	tm.Latency = NewDist(lat)
	var quiet, faulted []time.Duration
	for _, w := range waits {
		during := slices.ContainsFunc(faults, func(f FaultSpan) bool { return !w.commit.Before(f.Start) && w.commit.Before(f.Heal) })
		if during {
			faulted = append(faulted, w.arrival.Sub(w.commit))
		} else {
			quiet = append(quiet, w.arrival.Sub(w.commit))
		}
	}
	tm.Quiet, tm.Faulted = NewDist(quiet), NewDist(faulted)
	if len(arrivals) == 0 {
		return tm // nothing to match heals against: not measured
	}
	byKind := map[string]*KindTiming{}
	samples := map[string][]time.Duration{}
	var all []time.Duration
	faults = slices.Clone(faults)
	slices.SortStableFunc(faults, func(a, b FaultSpan) int { return a.Start.Compare(b.Start) })
	for n, f := range faults {
		k := byKind[f.Kind]
		if k == nil {
			k = &KindTiming{Kind: f.Kind, CannotBlock: f.CannotBlock}
			byKind[f.Kind] = k
		}
		k.Faults++
		ft := FaultTiming{Kind: f.Kind, Start: f.Start, Heal: f.Heal}
		mid := f.Start.Add(f.Heal.Sub(f.Start) / 2)
		if i := firstAtOrAfter(arrivals, mid); i < len(arrivals) && arrivals[i].Before(f.Heal) {
			k.Flowing++
			ft.Flowing = true
		}
		i := firstAtOrAfter(arrivals, f.Heal)
		if i == len(arrivals) {
			k.NoArrival++
			tm.Faults = append(tm.Faults, ft)
			continue
		}
		ft.Ready = readyAfter(waits, f.Heal)
		end := arrivals[i]
		if n+1 < len(faults) && end.After(faults[n+1].Start) {
			k.NextFault++
			end = faults[n+1].Start // what came after is the next fault's
		}
		d := max(end.Sub(ft.Ready), 0) // a late copy of an older event can come first
		ft.First, ft.HealMS = arrivals[i], float64(d.Microseconds())/1000
		tm.Faults = append(tm.Faults, ft)
		samples[f.Kind] = append(samples[f.Kind], d)
		if !f.CannotBlock {
			all = append(all, d)
		}
	}
	for kind, k := range byKind {
		k.Dist = NewDist(samples[kind])
		tm.Kinds = append(tm.Kinds, *k)
	}
	slices.SortFunc(tm.Kinds, func(a, b KindTiming) int { return cmp.Compare(a.Kind, b.Kind) })
	tm.Heal = NewDist(all)
	return tm
}

// wait is one event's time between its commit and its first arrival.
type wait struct{ commit, arrival time.Time }

// readyAfter returns the first moment at or after heal at which an event was waiting to
// be published: heal itself if one committed before it arrived after it, otherwise the
// first commit after heal (of an event that arrived at all). A fault can stall the
// writers as well (terminating the relays' sessions held the writers' commits up for
// 160 ms in one run), and the relay cannot publish before there is something to publish.
func readyAfter(waits []wait, heal time.Time) time.Time {
	var ready time.Time
	for _, w := range waits {
		if w.arrival.Before(heal) {
			continue
		}
		r := w.commit
		if r.Before(heal) {
			return heal
		}
		if ready.IsZero() || r.Before(ready) {
			ready = r
		}
	}
	if ready.IsZero() {
		return heal
	}
	return ready
}

// firstAtOrAfter returns the index of the first of sorted at or after t.
func firstAtOrAfter(sorted []time.Time, t time.Time) int {
	i, _ := slices.BinarySearchFunc(sorted, t, func(a, t time.Time) int {
		if a.Before(t) {
			return -1
		}
		return 1 // at or after t: search left of it
	})
	return i
}

// ms formats d in milliseconds with one decimal.
func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }

// fields returns the summary line's timing fields: lat_p50_ms and lat_p99_ms when
// arrival times were measured, heal_p99_ms when some blocking fault had an arrival
// after its heal.
func (tm Timing) fields() string {
	var b strings.Builder
	if tm.Latency.N > 0 {
		fmt.Fprintf(&b, " lat_p50_ms=%s lat_p99_ms=%s", ms(tm.Latency.P50), ms(tm.Latency.P99))
	}
	if tm.Heal.N > 0 {
		fmt.Fprintf(&b, " heal_p99_ms=%s", ms(tm.Heal.P99))
	}
	return b.String()
}

// Table renders the timing for the end of a run: commit-to-arrival, then one row per
// fault kind. Figures only: they say how the relay recovered on this machine, this time.
func (tm Timing) Table() string {
	var b strings.Builder
	if tm.Latency.N == 0 {
		b.WriteString("commit-to-arrival: not measured (the broker's read-back gives no arrival times)\n")
		return b.String()
	}
	fmt.Fprintf(&b, "commit-to-arrival: events=%d p50_ms=%s p99_ms=%s max_ms=%s\n",
		tm.Latency.N, ms(tm.Latency.P50), ms(tm.Latency.P99), ms(tm.Latency.Max))
	for _, d := range []struct {
		name string
		Dist
	}{{"committed with no fault in progress", tm.Quiet}, {"committed during a fault", tm.Faulted}} {
		if d.N > 0 {
			fmt.Fprintf(&b, "  %s: events=%d p50_ms=%s p99_ms=%s max_ms=%s\n", d.name, d.N, ms(d.P50), ms(d.P99), ms(d.Max))
		}
	}
	if len(tm.Kinds) == 0 {
		return b.String()
	}
	b.WriteString("heal to first arrival, per fault kind:\n")
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "kind\tfaults\tflowing\tno_arrival\tnext_fault\tp50_ms\tp99_ms\tmax_ms")
	row := func(kind string, k KindTiming, d Dist) {
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t", kind, k.Faults, k.Flowing, k.NoArrival, k.NextFault)
		if d.N == 0 {
			fmt.Fprintf(w, "-\t-\t-\n")
			return
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", ms(d.P50), ms(d.P99), ms(d.Max))
	}
	var sum KindTiming
	excluded := false
	for _, k := range tm.Kinds {
		name := k.Kind
		if k.CannotBlock {
			name += " *"
			excluded = true
		} else {
			sum.Faults, sum.Flowing, sum.NoArrival, sum.NextFault = sum.Faults+k.Faults, sum.Flowing+k.Flowing, sum.NoArrival+k.NoArrival, sum.NextFault+k.NextFault
		}
		row(name, k, k.Dist)
	}
	row("all blocking", sum, tm.Heal)
	_ = w.Flush()
	if excluded {
		b.WriteString("* cannot block publishing (it slows it at most): not in \"all blocking\" nor heal_p99_ms\n")
	}
	return b.String()
}
