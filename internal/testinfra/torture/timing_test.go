package torture

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
)

func msd(n ...float64) []time.Duration {
	out := make([]time.Duration, len(n))
	for i, v := range n {
		out[i] = time.Duration(v * float64(time.Millisecond))
	}
	return out
}

// upTo returns 1ms, 2ms, ... n ms.
func upTo(n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = time.Duration(i+1) * time.Millisecond
	}
	return out
}

func TestPercentile(t *testing.T) {
	hundred := upTo(100)
	for _, tc := range []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one value is every percentile", msd(7), 99, 7 * time.Millisecond},
		{"one value, p50", msd(7), 50, 7 * time.Millisecond},
		{"p50 of four is the second", msd(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{"p50 of five is the middle", msd(1, 2, 3, 4, 5), 50, 3 * time.Millisecond},
		{"p99 of fewer than 100 is the largest", msd(1, 2, 3, 4, 50), 99, 50 * time.Millisecond},
		{"p99 of 100 is the 99th", hundred, 99, 99 * time.Millisecond},
		{"p99 of 101 is the 100th", append(append([]time.Duration(nil), hundred...), time.Second), 99, 100 * time.Millisecond},
		{"p99 of 200 is the 198th", upTo(200), 99, 198 * time.Millisecond},
		{"p100 is the largest", msd(1, 2, 3), 100, 3 * time.Millisecond},
		{"a tiny p is the smallest", msd(1, 2, 3), 0.1, time.Millisecond},
		{"negative values (arrival before COMMIT returned)", msd(-2, -1, 4), 50, -time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percentile(tc.sorted, tc.p); got != tc.want {
				t.Fatalf("Percentile(%v, %v) = %v, want %v", tc.sorted, tc.p, got, tc.want)
			}
		})
	}
}

func TestNewDist(t *testing.T) {
	for _, tc := range []struct {
		sample []time.Duration
		want   Dist
	}{
		{nil, Dist{}},
		{msd(30, 10, 20), Dist{N: 3, P50: 20 * time.Millisecond, P99: 30 * time.Millisecond, Max: 30 * time.Millisecond}},
		{msd(5, 5, 5, 900), Dist{N: 4, P50: 5 * time.Millisecond, P99: 900 * time.Millisecond, Max: 900 * time.Millisecond}},
	} {
		if got := NewDist(tc.sample); got != tc.want {
			t.Errorf("NewDist(%v) = %+v, want %+v", tc.sample, got, tc.want)
		}
	}
}

// timeline builds a hand-made history and delivery log on a clock of milliseconds from
// base.
type timeline struct {
	base time.Time
	h    History
	log  DeliveryLog
	ids  map[string]outbox.ID
}

func newTimeline() *timeline {
	return &timeline{base: time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC), ids: map[string]outbox.ID{}}
}

func (tl *timeline) at(ms float64) time.Time {
	return tl.base.Add(time.Duration(ms * float64(time.Millisecond)))
}

// txn records a transaction of the named events that ended (COMMIT returned) at ms.
func (tl *timeline) txn(o Outcome, resolved bool, ms float64, names ...string) {
	t := Txn{Outcome: o, Resolved: resolved, Start: tl.at(ms - 1), End: tl.at(ms)}
	for _, n := range names {
		id := outbox.NewID()
		tl.ids[n] = id
		t.Events = append(t.Events, Event{ID: id, Key: "k", Seq: 1})
	}
	tl.h.Record(t)
}

// arrive adds a copy of the named event that arrived at ms; a negative ms adds a copy
// with no arrival time.
func (tl *timeline) arrive(name string, ms float64) {
	d := Delivery{ID: tl.ids[name], Key: "k", Seq: 1}
	if ms >= 0 {
		d.Arrived = tl.at(ms)
	}
	tl.log.Add(d)
}

func (tl *timeline) fault(kind string, start, heal float64, cannotBlock bool) FaultSpan {
	return FaultSpan{Kind: kind, Start: tl.at(start), Heal: tl.at(heal), CannotBlock: cannotBlock}
}

// TestMeasureLatency: commit-to-arrival counts each event once, from the COMMIT's return
// to its earliest copy, and only events whose commit instant is known and that arrived.
func TestMeasureLatency(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(tl *timeline)
		want  Dist
	}{
		{"nothing delivered", func(tl *timeline) {
			tl.txn(Committed, false, 0, "a")
		}, Dist{}},
		{"one event", func(tl *timeline) {
			tl.txn(Committed, false, 100, "a")
			tl.arrive("a", 112)
		}, Dist{N: 1, P50: 12 * time.Millisecond, P99: 12 * time.Millisecond, Max: 12 * time.Millisecond}},
		{"events of one transaction share its commit", func(tl *timeline) {
			tl.txn(Committed, false, 100, "a", "b", "c")
			tl.arrive("a", 110)
			tl.arrive("b", 120)
			tl.arrive("c", 4100)
		}, Dist{N: 3, P50: 20 * time.Millisecond, P99: 4000 * time.Millisecond, Max: 4000 * time.Millisecond}},
		{"a duplicate counts once, from the earliest copy", func(tl *timeline) {
			tl.txn(Committed, false, 100, "a")
			tl.arrive("a", 900)
			tl.arrive("a", 150) // read back later, stored earlier
			tl.arrive("a", 3000)
		}, Dist{N: 1, P50: 50 * time.Millisecond, P99: 50 * time.Millisecond, Max: 50 * time.Millisecond}},
		{"copies without an arrival time are left out", func(tl *timeline) {
			tl.txn(Committed, false, 100, "a", "b")
			tl.arrive("a", -1)
			tl.arrive("b", 130)
		}, Dist{N: 1, P50: 30 * time.Millisecond, P99: 30 * time.Millisecond, Max: 30 * time.Millisecond}},
		{"resolved, rolled-back and undelivered events are left out", func(tl *timeline) {
			tl.txn(Committed, true, 100, "resolved")
			tl.txn(RolledBack, false, 100, "phantom")
			tl.txn(Committed, false, 100, "lost")
			tl.txn(Committed, false, 200, "a")
			tl.arrive("resolved", 5000)
			tl.arrive("phantom", 6000)
			tl.arrive("a", 205)
		}, Dist{N: 1, P50: 5 * time.Millisecond, P99: 5 * time.Millisecond, Max: 5 * time.Millisecond}},
		{"an arrival before COMMIT returned is a negative latency", func(tl *timeline) {
			tl.txn(Committed, false, 100, "a", "b")
			tl.arrive("a", 99)
			tl.arrive("b", 101)
		}, Dist{N: 2, P50: -time.Millisecond, P99: time.Millisecond, Max: time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := newTimeline()
			tc.build(tl)
			if got := Measure(&tl.h, &tl.log, nil).Latency; got != tc.want {
				t.Fatalf("latency %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestMeasureQuietAndFaulted splits commit-to-arrival by whether a fault was in
// progress at the commit: from its start (included) to its heal (excluded).
func TestMeasureQuietAndFaulted(t *testing.T) {
	tl := newTimeline()
	tl.txn(Committed, false, 100, "before")
	tl.txn(Committed, false, 1000, "at-start")
	tl.txn(Committed, false, 1500, "during")
	tl.txn(Committed, false, 2000, "at-heal")
	tl.arrive("before", 110)
	tl.arrive("at-start", 2010)
	tl.arrive("during", 2020)
	tl.arrive("at-heal", 2030)
	tm := Measure(&tl.h, &tl.log, []FaultSpan{tl.fault("db-cut", 1000, 2000, false)})
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	if want := (Dist{N: 2, P50: ms(10), P99: ms(30), Max: ms(30)}); tm.Quiet != want {
		t.Errorf("quiet %+v, want %+v", tm.Quiet, want)
	}
	if want := (Dist{N: 2, P50: ms(520), P99: ms(1010), Max: ms(1010)}); tm.Faulted != want {
		t.Errorf("faulted %+v, want %+v", tm.Faulted, want)
	}
}

// TestMeasureHeal matches each fault's heal with the first arrival at or after it.
func TestMeasureHeal(t *testing.T) {
	// Arrivals (ms): a steady flow until 1000, an outage, then 2300, 2310, 5000, 5001.
	arrivals := []float64{0, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 2300, 2310, 5000, 5001}
	type kind struct {
		kind                                  string
		faults, flowing, noArrival, nextFault int
		dist                                  Dist
	}
	d := func(n int, p50, p99, mx float64) Dist {
		return Dist{N: n, P50: time.Duration(p50 * 1e6), P99: time.Duration(p99 * 1e6), Max: time.Duration(mx * 1e6)}
	}
	for _, tc := range []struct {
		name   string
		faults func(tl *timeline) []FaultSpan
		kinds  []kind
		heal   Dist
	}{
		{"no faults", func(*timeline) []FaultSpan { return nil }, nil, Dist{}},
		{"heal during an outage: the wait for the first arrival", func(tl *timeline) []FaultSpan {
			return []FaultSpan{tl.fault("relay-kill", 1000, 2000, false)}
		}, []kind{{"relay-kill", 1, 0, 0, 0, d(1, 300, 300, 300)}}, d(1, 300, 300, 300)},
		{"an arrival exactly at the heal counts, as zero", func(tl *timeline) []FaultSpan {
			return []FaultSpan{tl.fault("pg-terminate", 2300, 2300, false)}
		}, []kind{{"pg-terminate", 1, 0, 0, 0, d(1, 0, 0, 0)}}, d(1, 0, 0, 0)},
		{"arrivals in the second half of the hold: flowing", func(tl *timeline) []FaultSpan {
			return []FaultSpan{tl.fault("relay-stop", 0, 950, false)}
		}, []kind{{"relay-stop", 1, 1, 0, 0, d(1, 50, 50, 50)}}, d(1, 50, 50, 50)},
		{"arrivals only in the first half of the hold: not flowing", func(tl *timeline) []FaultSpan {
			return []FaultSpan{tl.fault("broker-restart", 950, 2200, false)}
		}, []kind{{"broker-restart", 1, 0, 0, 0, d(1, 100, 100, 100)}}, d(1, 100, 100, 100)},
		{"nothing after the heal: no arrival, no value", func(tl *timeline) []FaultSpan {
			return []FaultSpan{tl.fault("broker-cut", 5002, 6000, false), tl.fault("broker-cut", 1000, 2000, false)}
		}, []kind{{"broker-cut", 2, 0, 1, 0, d(1, 300, 300, 300)}}, d(1, 300, 300, 300)},
		{"per kind, sorted; the overall figure over every kind that can block", func(tl *timeline) []FaultSpan {
			return []FaultSpan{
				tl.fault("relay-kill", 1000, 2000, false),       // 300
				tl.fault("relay-kill", 2311, 3000, false),       // 2000
				tl.fault("broker-restart", 2305, 2306, false),   // 4
				tl.fault("db-latency", 50, 60, true),            // 40, not counted overall
				tl.fault("broker-restart", 5000, 5000.5, false), // 0.5
			}
		}, []kind{
			{"broker-restart", 2, 0, 0, 0, d(2, 0.5, 4, 4)},
			{"db-latency", 1, 0, 0, 0, d(1, 40, 40, 40)},
			{"relay-kill", 2, 0, 0, 0, d(2, 300, 2000, 2000)},
		}, d(4, 4, 2000, 2000)},
		{"the next fault started before the first arrival: counted up to its start", func(tl *timeline) []FaultSpan {
			return []FaultSpan{
				tl.fault("relay-stop", 1600, 2200, false), // 100
				tl.fault("relay-kill", 1000, 1500, false), // 100: the stop began then
			}
		}, []kind{
			{"relay-kill", 1, 0, 0, 1, d(1, 100, 100, 100)},
			{"relay-stop", 1, 0, 0, 0, d(1, 100, 100, 100)},
		}, d(2, 100, 100, 100)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := newTimeline()
			var names []string
			for i := range arrivals {
				names = append(names, fmt.Sprint("e", i))
			}
			tl.txn(Committed, false, 0, names...)
			for i, ms := range arrivals {
				tl.arrive(names[len(names)-1-i], ms) // broker order differs from time order
			}
			tm := Measure(&tl.h, &tl.log, tc.faults(tl))
			var got []kind
			for _, k := range tm.Kinds {
				got = append(got, kind{k.Kind, k.Faults, k.Flowing, k.NoArrival, k.NextFault, k.Dist})
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.kinds) {
				t.Errorf("kinds\n got %+v\nwant %+v", got, tc.kinds)
			}
			if tm.Heal != tc.heal {
				t.Errorf("heal %+v, want %+v", tm.Heal, tc.heal)
			}
		})
	}
}

// TestMeasureNoArrivalTimes: a broker whose read-back has no arrival times measures
// nothing, and the summary line carries no timing field.
func TestMeasureNoArrivalTimes(t *testing.T) {
	tl := newTimeline()
	tl.txn(Committed, false, 0, "a")
	tl.arrive("a", -1)
	tm := Measure(&tl.h, &tl.log, []FaultSpan{tl.fault("relay-kill", 0, 10, false)})
	if tm.Latency.N != 0 || tm.Heal.N != 0 || len(tm.Kinds) != 0 {
		t.Fatalf("measured without arrival times: %+v", tm)
	}
	if line := (Report{Timing: tm}).String(); strings.Contains(line, "_ms=") {
		t.Errorf("summary line has timing fields: %s", line)
	}
	if !strings.Contains(tm.Table(), "not measured") {
		t.Errorf("table does not say it measured nothing:\n%s", tm.Table())
	}
}

// TestTimingSummaryAndTable: the summary line carries lat_p50_ms, lat_p99_ms and
// heal_p99_ms after rss_mib, and the table lists every kind, marking the ones left out.
func TestTimingSummaryAndTable(t *testing.T) {
	tl := newTimeline()
	tl.txn(Committed, false, 1000, "a", "b")
	tl.arrive("a", 1004.25)
	tl.arrive("b", 3500)
	tm := Measure(&tl.h, &tl.log, []FaultSpan{
		tl.fault("relay-kill", 1500, 2000, false),
		tl.fault("pg-snapshot", 1005, 1010, true),
	})
	r := Report{Label: "chaos nats relays=1", Seed: 7, Timing: tm}
	want := "chaos nats relays=1 seed=7 events=0 committed=0 faults=0 lost=0 phantom=0 order=0 dup=0 dup_bound=0 dead=0 poison=0 mismatch=0 recovery_s=0.0 rss_mib=0 lat_p50_ms=4.2 lat_p99_ms=2500.0 heal_p99_ms=1500.0 result=ok"
	if got := r.String(); got != want {
		t.Errorf("summary line\n got %s\nwant %s", got, want)
	}
	table := tm.Table()
	for _, s := range []string{"events=2 p50_ms=4.2 p99_ms=2500.0", "relay-kill ", "pg-snapshot *", "all blocking", "cannot block"} {
		if !strings.Contains(table, s) {
			t.Errorf("table lacks %q:\n%s", s, table)
		}
	}
	t.Log("\n" + table)
}

// TestReadyAfter: a fault's recovery is counted from its heal when an event was waiting
// then, and from the first commit after the heal when none was (the writers stalled too).
func TestReadyAfter(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	heal := at(1000)
	for _, c := range []struct {
		name  string
		waits []wait
		want  time.Time
	}{
		{"one waiting across the heal", []wait{{at(900), at(1100)}, {at(1050), at(1060)}}, heal},
		{"none waiting: the first commit after", []wait{{at(500), at(600)}, {at(1200), at(1210)}, {at(1150), at(1300)}}, at(1150)},
		{"published before the heal only", []wait{{at(500), at(600)}}, heal},
		{"nothing", nil, heal},
	} {
		if got := readyAfter(c.waits, heal); !got.Equal(c.want) {
			t.Errorf("%s: ready %v after the heal, want %v", c.name, got.Sub(heal), c.want.Sub(heal))
		}
	}
}
