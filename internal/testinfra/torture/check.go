package torture

import (
	"fmt"
	"strings"

	"github.com/outboxkit/outbox"
)

// Bounds are what a run may show and still pass.
type Bounds struct {
	// InFlight is the most unacknowledged messages one relay can have in flight (its
	// publish window). With Faults it bounds duplicates: InFlight x Faults.
	InFlight int
	// Faults counts the disruptive events the nemesis injected (relay kills, stops past
	// the lease, broker restarts, connection resets during publish, database restarts).
	// For NATS with Msg-Id dedup, count only recoveries slower than the duplicate window.
	Faults int
	// MaxRecoverySeconds fails the run when Report.RecoverySeconds exceeds it. Zero means
	// no limit.
	MaxRecoverySeconds float64
	// MaxRSSMiB fails the run when Report.RSSMiB exceeds it. Zero means no limit.
	MaxRSSMiB float64
}

// Report is the checker's verdict on one run. Check fills the counts; the runner fills
// Label, Seed, RecoverySeconds, RSSMiB and Timing (and Faults comes from Bounds).
type Report struct {
	Label string // "chaos nats"
	Seed  uint64

	Events     int // events attempted, whatever their outcome
	Committed  int // events committed (after Resolve)
	RolledBack int // events rolled back
	Unresolved int // events whose outcome is still Unknown: the run is invalid
	Delivered  int // distinct events delivered
	Copies     int // copies delivered

	Lost           int // committed, neither delivered nor dead-lettered
	Phantom        int // delivered but rolled back or never written (distinct events)
	PhantomAborted int // of Phantom: events of rolled-back transactions
	Order          int // first copies of a key delivered after a higher seq of that key
	Mismatch       int // copies whose checksum, key or seq differ from what was written
	Dup            int // copies beyond the first, summed over events
	DupBound       int // InFlight x Faults
	Dead           int // events in the dead-letter table
	Poison         int // committed poison events
	DeadUnexpected int // dead-lettered events that are not committed poison
	PoisonAlive    int // committed poison events not dead-lettered
	// LeaseSteals counts shards that changed owner before their lease expired in
	// database time (filled by the runner, which watches the lease table).
	LeaseSteals int
	// Crossed counts copies read back from another outbox's destination than the one
	// that wrote them, or from a destination of no outbox (filled by the runner, in runs
	// of several outboxes).
	Crossed int
	// Misrouted counts copies read back from another destination than the one their
	// key's routing rule names (filled by the runner, in runs of several destinations).
	Misrouted int
	// Destinations is the number of destinations the relays route to (0: one); with
	// several, String prints it and Misrouted.
	Destinations int
	// SlotAhead counts transactions that WAL mode's slot acknowledged while one of their
	// messages was not recorded yet (filled by the runner's slot audit, in WAL runs with
	// one relay).
	SlotAhead int

	// Outboxes is the number of outboxes the run wrote to (0: one); with several,
	// String prints it and Crossed.
	Outboxes int

	Faults          int
	RecoverySeconds float64
	RSSMiB          float64
	Bounds          Bounds
	// Timing is commit-to-arrival and heal-to-first-arrival (filled by the runner with
	// Measure): figures for the summary line, never part of OK.
	Timing Timing

	// Examples lists the first anomalies found, one line each, for the test log.
	Examples []string
}

const maxExamples = 20

func (r *Report) example(format string, args ...any) {
	if len(r.Examples) < maxExamples {
		r.Examples = append(r.Examples, fmt.Sprintf(format, args...))
	}
}

// Example adds an anomaly's line for the test log, while the report has room for one
// (for the runner's own checks).
func (r *Report) Example(format string, args ...any) { r.example(format, args...) }

// DupWithinBound reports whether duplicates stayed within InFlight x Faults.
func (r Report) DupWithinBound() bool { return r.Dup <= r.DupBound }

// OK reports whether the run passed: every outcome known, nothing lost, no phantom, no
// order violation, no payload mismatch, duplicates within the bound, exactly the
// injected poison dead, and recovery time and RSS within their limits.
func (r Report) OK() bool {
	return r.Unresolved == 0 && r.Lost == 0 && r.Phantom == 0 && r.Order == 0 && r.Mismatch == 0 &&
		r.DupWithinBound() && r.DeadUnexpected == 0 && r.PoisonAlive == 0 && r.LeaseSteals == 0 && r.SlotAhead == 0 && r.Crossed == 0 && r.Misrouted == 0 &&
		(r.Bounds.MaxRecoverySeconds == 0 || r.RecoverySeconds <= r.Bounds.MaxRecoverySeconds) &&
		(r.Bounds.MaxRSSMiB == 0 || r.RSSMiB <= r.Bounds.MaxRSSMiB)
}

// String is the run's one summary line (format in TESTING.md). The timing fields follow
// rss_mib when they were measured (Timing.fields: lat_p50_ms, lat_p99_ms, heal_p99_ms).
// Fields that are zero on a passing run and only name a failure (unresolved,
// dead_unexpected, poison_alive) are appended only when non-zero; the line always ends
// with result=ok or result=FAIL.
func (r Report) String() string {
	var b strings.Builder
	if r.Label != "" {
		b.WriteString(r.Label)
		b.WriteByte(' ')
	}
	fmt.Fprintf(&b, "seed=%d events=%d committed=%d faults=%d lost=%d phantom=%d order=%d dup=%d dup_bound=%d dead=%d poison=%d mismatch=%d recovery_s=%.1f rss_mib=%.0f",
		r.Seed, r.Events, r.Committed, r.Faults, r.Lost, r.Phantom, r.Order, r.Dup, r.DupBound, r.Dead, r.Poison, r.Mismatch, r.RecoverySeconds, r.RSSMiB)
	b.WriteString(r.Timing.fields())
	if r.Outboxes > 1 {
		fmt.Fprintf(&b, " outboxes=%d crossed=%d", r.Outboxes, r.Crossed)
	}
	if r.Destinations > 1 {
		fmt.Fprintf(&b, " destinations=%d misrouted=%d", r.Destinations, r.Misrouted)
	}
	if r.Unresolved > 0 {
		fmt.Fprintf(&b, " unresolved=%d", r.Unresolved)
	}
	if r.DeadUnexpected > 0 {
		fmt.Fprintf(&b, " dead_unexpected=%d", r.DeadUnexpected)
	}
	if r.PoisonAlive > 0 {
		fmt.Fprintf(&b, " poison_alive=%d", r.PoisonAlive)
	}
	if r.LeaseSteals > 0 {
		fmt.Fprintf(&b, " lease_steals=%d", r.LeaseSteals)
	}
	if r.SlotAhead > 0 {
		fmt.Fprintf(&b, " slot_ahead=%d", r.SlotAhead)
	}
	if r.OK() {
		b.WriteString(" result=ok")
	} else {
		b.WriteString(" result=FAIL")
	}
	return b.String()
}

// Add adds the counts of o, the check of another outbox of the same run, to r: events,
// outcomes, copies, anomalies and the duplicate bound (each outbox's relays have their
// own in-flight window), and o's examples while r has room for them.
func (r *Report) Add(o Report) {
	r.Events += o.Events
	r.Committed += o.Committed
	r.RolledBack += o.RolledBack
	r.Unresolved += o.Unresolved
	r.Delivered += o.Delivered
	r.Copies += o.Copies
	r.Lost += o.Lost
	r.Phantom += o.Phantom
	r.PhantomAborted += o.PhantomAborted
	r.Order += o.Order
	r.Mismatch += o.Mismatch
	r.Dup += o.Dup
	r.DupBound += o.DupBound
	r.Dead += o.Dead
	r.Poison += o.Poison
	r.DeadUnexpected += o.DeadUnexpected
	r.PoisonAlive += o.PoisonAlive
	r.LeaseSteals += o.LeaseSteals
	r.SlotAhead += o.SlotAhead
	r.Crossed += o.Crossed
	r.Misrouted += o.Misrouted
	for _, ex := range o.Examples {
		r.example("%s", ex)
	}
}

// Check compares what was written (h, after Resolve) with what was read back (log).
// Event counts in the report are events, not transactions. See the package doc for the
// exact definitions.
func Check(h *History, log *DeliveryLog, b Bounds) Report {
	r := Report{Bounds: b, Faults: b.Faults, DupBound: b.InFlight * b.Faults}
	type written struct {
		ev      Event
		outcome Outcome
	}
	events := map[outbox.ID]written{}
	for _, t := range h.Txns() {
		for _, e := range t.Events {
			events[e.ID] = written{e, t.Outcome}
			r.Events++
			switch t.Outcome {
			case Committed:
				r.Committed++
				if e.Poison {
					r.Poison++
				}
			case RolledBack:
				r.RolledBack++
			default:
				r.Unresolved++
			}
		}
	}
	if r.Unresolved > 0 {
		r.example("%d events have an unknown outcome: call History.Resolve before Check", r.Unresolved)
	}

	deliveries, dead := log.snapshot()
	copies := map[outbox.ID]int{}
	maxSeq := map[string]int64{} // per key, the highest seq among first copies so far
	maxID := map[string]outbox.ID{}
	for _, d := range deliveries {
		r.Copies++
		copies[d.ID]++
		w, known := events[d.ID]
		if copies[d.ID] > 1 {
			r.Dup++
		}
		if !known || w.outcome != Committed {
			if copies[d.ID] == 1 && (!known || w.outcome == RolledBack) {
				r.Phantom++
				if known {
					r.PhantomAborted++
					r.example("phantom: event %s (key %s seq %d) of a rolled-back transaction delivered", d.ID, d.Key, d.Seq)
				} else {
					r.example("phantom: event %s (key %s) delivered but never written", d.ID, d.Key)
				}
			}
			continue
		}
		e := w.ev
		if d.Sum != e.Sum || d.Key != e.Key || d.Seq != e.Seq {
			r.Mismatch++
			r.example("mismatch: event %s delivered as key %s seq %d (checksum equal: %t), written as key %s seq %d",
				d.ID, d.Key, d.Seq, d.Sum == e.Sum, e.Key, e.Seq)
		}
		if copies[d.ID] > 1 {
			continue // a later copy is a duplicate, never an order violation
		}
		if m, ok := maxSeq[e.Key]; ok && e.Seq <= m {
			r.Order++
			r.example("order: key %s seq %d (event %s) first delivered after seq %d (event %s)", e.Key, e.Seq, e.ID, m, maxID[e.Key])
			continue
		}
		maxSeq[e.Key], maxID[e.Key] = e.Seq, e.ID
	}
	r.Delivered = len(copies)
	if r.Dup > r.DupBound {
		r.example("dup: %d duplicate copies, over the bound %d (in-flight %d x faults %d)", r.Dup, r.DupBound, b.InFlight, b.Faults)
	}

	r.Dead = len(dead)
	for id, reason := range dead {
		w, known := events[id]
		if !known || w.outcome != Committed || !w.ev.Poison {
			r.DeadUnexpected++
			r.example("dead: event %s dead-lettered but it is not committed poison (known %t, %s): %s", id, known, w.outcome, reason)
		}
	}
	for id, w := range events {
		if w.outcome != Committed {
			continue
		}
		_, isDead := dead[id]
		if w.ev.Poison && !isDead {
			r.PoisonAlive++
			r.example("poison: event %s (key %s seq %d) is poison but not dead-lettered (%d copies delivered)", id, w.ev.Key, w.ev.Seq, copies[id])
		}
		if copies[id] == 0 && !isDead {
			r.Lost++
			r.example("lost: event %s (key %s seq %d) committed, never delivered", id, w.ev.Key, w.ev.Seq)
		}
	}
	return r
}
