package outbox

import (
	"testing"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// The gate's states as the loop drives them: asked when a fetch comes back empty, a
// fetch again soon instead when it found messages, a full fetch after the gate is held,
// a retry after a busy answer, backing off while writers keep it busy, and nothing to
// ask where the listener cannot hold it.
func TestWakeGate(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var g wakeGate
	if g.short() {
		t.Fatal("asked with no listener")
	}
	g.listening(true)
	if !g.short() {
		t.Fatal("a short fetch with the gate open did not ask")
	}
	if g.short() {
		t.Fatal("asked twice")
	}
	if !g.answered(outboxdriver.GateArmed, t0) {
		t.Fatal("armed, but no full fetch")
	}
	if g.short() || !g.wakeAt().IsZero() {
		t.Fatalf("armed: asked again or a retry planned: %+v", g)
	}
	if g.recheck() || g.short() { // a poll: this relay's own hold stands
		t.Fatal("asked again while holding the gate")
	}
	g.woken()
	// A fetch that found messages: writers are active; fetch again soon, do not ask.
	g.found(t0)
	if g.short() || g.wakeAt() != t0.Add(gateRetryMax) {
		t.Fatalf("writers active: asked, or no fetch at gateRetryMax: %+v", g)
	}
	if !g.due(t0.Add(gateRetryMax)) || !g.short() {
		t.Fatal("the next fetch came back empty, yet no ask")
	}

	// Busy: retry after 1, 2, 4 ms, at most gateRetryMax; due once.
	for i, want := range []time.Duration{1, 2, 4, 4} {
		now := t0.Add(time.Duration(i) * time.Second)
		if g.answered(outboxdriver.GateBusy, now) {
			t.Fatal("busy, yet a full fetch")
		}
		if got := g.wakeAt().Sub(now); got != want*time.Millisecond {
			t.Fatalf("busy answer %d: retry after %v, want %v", i+1, got, want*time.Millisecond)
		}
		if g.short() || g.due(now) {
			t.Fatalf("busy answer %d: asked or due at once", i+1)
		}
		if !g.due(g.wakeAt()) || g.due(g.wakeAt()) {
			t.Fatalf("busy answer %d: not due once at its time", i+1)
		}
		if !g.short() {
			t.Fatalf("busy answer %d: the retry's short fetch did not ask", i+1)
		}
	}
	if !g.answered(outboxdriver.GateCovered, t0) {
		t.Fatal("covered, but no full fetch")
	}
	if g.answered(outboxdriver.GateBusy, t0); g.wakeAt().Sub(t0) != gateRetryMin {
		t.Fatalf("the backoff did not start over after the gate was held: %v", g.wakeAt().Sub(t0))
	}
	g.due(g.wakeAt())
	g.short()
	g.answered(outboxdriver.GateCovered, t0)
	if !g.recheck() || g.short() { // a poll: another relay's hold may have ended unseen
		t.Fatal("covered, then a poll: no ask, or two")
	}

	for _, a := range []outboxdriver.GateState{outboxdriver.GateAlways, outboxdriver.GateUnavailable} {
		g.listening(true)
		g.short()
		g.answered(a, t0)
		g.woken()
		if g.recheck() || g.short() {
			t.Fatalf("answer %d: asked again before the listener restarted", a)
		}
	}
	g.listening(false)
	g.listening(true)
	if !g.short() {
		t.Fatal("the listener restarted, yet no ask")
	}
}

// TestWakeGateCoveredRechecked: a covered answer is asked once more after
// gateCoveredRecheck (the holder may have been letting go of the gate on the very
// notification that woke this relay); a covered answer to that ask stands until the next
// notification, after which a covered answer is rechecked again.
func TestWakeGateCoveredRechecked(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var g wakeGate
	g.listening(true)
	g.short()
	if !g.answered(outboxdriver.GateCovered, t0) {
		t.Fatal("covered, but no full fetch")
	}
	if g.wakeAt() != t0.Add(gateCoveredRecheck) || g.recheckDue(t0.Add(gateCoveredRecheck-1)) {
		t.Fatalf("covered: want a recheck at %v, not before: %+v", t0.Add(gateCoveredRecheck), g)
	}
	if !g.recheckDue(t0.Add(gateCoveredRecheck)) || g.recheckDue(t0.Add(gateCoveredRecheck)) {
		t.Fatal("the recheck did not ask once")
	}
	g.answered(outboxdriver.GateCovered, t0.Add(gateCoveredRecheck))
	if !g.wakeAt().IsZero() || g.recheckDue(t0.Add(time.Hour)) {
		t.Fatalf("a covered answer to the recheck did not stand: %+v", g)
	}
	g.woken()
	g.short()
	g.answered(outboxdriver.GateCovered, t0.Add(time.Hour))
	if !g.recheckDue(t0.Add(time.Hour + gateCoveredRecheck)) {
		t.Fatal("no recheck of a covered answer after the next notification")
	}
}
