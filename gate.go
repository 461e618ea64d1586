package outbox

import (
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// gateRetryMin and gateRetryMax bound how soon the relay fetches again while writers
// are active and the gate stays open: after a busy answer (writers between their insert
// and their commit), from gateRetryMin doubling with each busy answer in a row, and
// after a fetch that found messages, gateRetryMax. A relay whose writers never stop
// fetches about every gateRetryMax, in batches, and never makes them notify.
const (
	gateRetryMin = time.Millisecond
	gateRetryMax = 4 * time.Millisecond
)

// gateCoveredRecheck is how long after a covered answer the relay asks once more. The
// holder lets go of the gate when a notification comes, and a relay woken by the same
// notification may ask before the holder has let go: its covered answer is then stale,
// and no writer notifies while nobody holds the gate. Asking again once, after the
// holder has had time to let go, finds the gate free (or held anew, by a holder that
// took it after that notification: then the answer stands).
const gateCoveredRecheck = 50 * time.Millisecond

// wakeGate decides when the relay asks its listener for the outbox's gate
// (outboxdriver.Gate), and what the answer means for fetching. Writers notify only
// while some relay holds the gate, so a relay that holds none must find new messages
// itself. It does no I/O and reads no clock.
//
// States:
//   - open: writers may not notify. When a fetch comes back empty (the relay would
//     wait) the relay asks for the gate: asking. When it comes back short but not
//     empty, writers are active: the relay fetches again at gateRetryMax (retrying)
//     rather than ask, since while the gate is held every writer's commit notifies,
//     and notifying commits are serialised server-wide.
//   - asking: an ask is out. The relay polls meanwhile, as before any answer.
//   - armed: this relay holds the gate; covered: another relay does. Writers notify:
//     the relay waits for a notification (and its polls). The first notification makes
//     the listener let go, and the gate open again. A covered answer is checked once
//     more after gateCoveredRecheck: the holder may have been letting go.
//   - retrying: the gate was busy, or writers are active. At retryAt the relay fetches
//     above its cursor, then asks when that fetch comes back empty.
//   - always: writers notify on every commit (an outbox before the gate); off: the
//     listener cannot hold the gate, or is not listening. Nothing to ask: the relay
//     waits for notifications and polls, until the listener starts again.
//
// Invariant: the relay goes without fetching until its next poll only in armed,
// covered, always and off, or with an ask out: in open and retrying it has a fetch
// planned or asks. After an armed or covered answer the relay makes a full fetch
// (answered says so): rows committed before it by writers that did not notify may lie
// below its cursor, where a continuation does not look.
type wakeGate struct {
	state   gateState
	busy    int       // busy answers in a row
	retryAt time.Time // retrying: when to fetch again; covered: when to ask once more
	// rechecked: the covered answer being waited on is the answer to the recheck.
	rechecked bool
}

type gateState uint8

const (
	gateOff gateState = iota
	gateOpen
	gateAsking
	gateArmed
	gateCovered
	gateRetrying
	gateAlways
)

// found records, at now, a fetch that came back short with messages: writers are
// active, so the relay fetches again at gateRetryMax rather than ask for the gate.
func (g *wakeGate) found(now time.Time) {
	if g.state == gateOpen {
		g.state, g.retryAt = gateRetrying, now.Add(gateRetryMax)
	}
}

// short records that the relay has nothing more to fetch (a fetch came back empty),
// and says whether to ask for the gate.
func (g *wakeGate) short() (ask bool) {
	if g.state != gateOpen {
		return false
	}
	g.state = gateAsking
	return true
}

// answered records the listener's answer at now, and says whether the relay fetches
// in full at once.
func (g *wakeGate) answered(a outboxdriver.GateState, now time.Time) (full bool) {
	switch a {
	case outboxdriver.GateArmed:
		g.state, g.busy = gateArmed, 0
		return true
	case outboxdriver.GateCovered:
		g.state, g.busy = gateCovered, 0
		if !g.rechecked {
			g.retryAt = now.Add(gateCoveredRecheck)
		}
		return true
	case outboxdriver.GateBusy:
		g.busy++
		g.state = gateRetrying
		g.retryAt = now.Add(min(gateRetryMin<<min(g.busy-1, 10), gateRetryMax))
	case outboxdriver.GateAlways:
		g.state = gateAlways
	default: // GateUnavailable
		g.state = gateOff
	}
	return false
}

// woken records a notification: the listener let go of the gate, if it held it.
func (g *wakeGate) woken() {
	if g.state != gateAlways && g.state != gateOff {
		g.state, g.rechecked = gateOpen, false
	}
}

// recheckDue says whether to ask once more at now after a covered answer
// (gateCoveredRecheck): then the relay asks, and a covered answer to that ask stands.
func (g *wakeGate) recheckDue(now time.Time) bool {
	if g.state != gateCovered || g.rechecked || now.Before(g.retryAt) {
		return false
	}
	g.state, g.rechecked = gateAsking, true
	return true
}

// recheck records a poll, or a relay that gave shards back, and says whether to ask
// for the gate. Another relay's hold on the gate is not watched: it may have ended
// without a notification (that relay stopped or died), so the relay asks again.
func (g *wakeGate) recheck() (ask bool) {
	if g.state != gateCovered {
		return false
	}
	g.state = gateAsking
	return true
}

// listening records that the listener started (open: ask again) or stopped (off).
func (g *wakeGate) listening(on bool) {
	g.state, g.busy = gateOff, 0
	if on {
		g.state = gateOpen
	}
}

// due says whether the next fetch while the gate is open is due at now (retrying); if
// so the relay fetches above its cursor.
func (g *wakeGate) due(now time.Time) bool {
	if g.state != gateRetrying || now.Before(g.retryAt) {
		return false
	}
	g.state = gateOpen
	return true
}

// wakeAt is when the next fetch while the gate is open is due, or the recheck of a
// covered answer, for the loop's timer: zero when none is planned.
func (g *wakeGate) wakeAt() time.Time {
	if g.state == gateRetrying || (g.state == gateCovered && !g.rechecked) {
		return g.retryAt
	}
	return time.Time{}
}
