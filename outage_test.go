package outbox

import (
	"errors"
	"testing"
	"time"
)

func TestOutageGate(t *testing.T) {
	t0 := time.Unix(1000, 0)
	g := newOutageGate(time.Second, time.Minute)
	g.backoff = func(n int, min, _ time.Duration) time.Duration { return time.Duration(n) * min } // no jitter
	at := func(d time.Duration) time.Time { return t0.Add(d) }

	if !g.open() || !g.wakeAt().IsZero() || g.due(t0) {
		t.Fatal("a new gate is not open")
	}
	// A batch meets an outage: paused 1s. Another outage reported meanwhile (a batch sent
	// before) changes nothing.
	if d := g.outage(t0); d != time.Second || g.open() || !g.wakeAt().Equal(at(time.Second)) {
		t.Fatalf("first outage: pause %v, open %v, wake %v", d, g.open(), g.wakeAt())
	}
	if d := g.outage(at(time.Millisecond)); d != 0 || g.streak != 1 {
		t.Fatalf("outage while paused: pause %v, streak %d", d, g.streak)
	}
	if g.due(at(time.Second - 1)) {
		t.Fatal("due before the pause ends")
	}
	// The pause ends: a ping goes out; while it is out, nothing wakes the loop and the
	// gate stays closed.
	if !g.due(at(time.Second)) {
		t.Fatal("not due at the end of the pause")
	}
	g.ping()
	if g.due(at(2*time.Second)) || !g.wakeAt().IsZero() || g.open() {
		t.Fatal("pinging: due again, or woken, or open")
	}
	// The ping fails: a longer pause.
	if d := g.pinged(errors.New("refused"), at(2*time.Second)); d != 2*time.Second || !g.wakeAt().Equal(at(4*time.Second)) {
		t.Fatalf("failed ping: pause %v, wake %v", d, g.wakeAt())
	}
	// The next ping answers: open; the streak lasts until a publish is confirmed.
	g.ping()
	if d := g.pinged(nil, at(4*time.Second)); d != 0 || !g.open() {
		t.Fatalf("good ping: pause %v, open %v", d, g.open())
	}
	if d := g.outage(at(5 * time.Second)); d != 3*time.Second {
		t.Fatalf("outage right after reopening: pause %v, want the third of the streak", d)
	}
	g.reopen() // a publisher without Ping
	g.confirmed()
	if d := g.outage(at(9 * time.Second)); d != time.Second {
		t.Fatalf("outage after a confirmed publish: pause %v, want the first of a new streak", d)
	}
}

func TestOutageGateReconnected(t *testing.T) {
	t0 := time.Unix(1000, 0)
	g := newOutageGate(time.Second, time.Minute)
	g.backoff = func(n int, min, _ time.Duration) time.Duration { return time.Duration(n) * min }

	if g.reconnected(t0) {
		t.Fatal("an open gate is due after a reconnection")
	}
	g.outage(t0)
	g.ping()
	g.pinged(errors.New("refused"), t0.Add(time.Second)) // paused until t0+3s
	// The connection is back 100 ms into the pause: due now, not at the pause's end.
	now := t0.Add(1100 * time.Millisecond)
	if !g.reconnected(now) || !g.due(now) {
		t.Fatalf("reconnected during a pause: due %v, wake %v", g.due(now), g.wakeAt())
	}
	g.ping()
	if g.reconnected(now) {
		t.Fatal("a reconnection while a ping is out asks for another ping")
	}
	if d := g.pinged(nil, now); d != 0 || !g.open() {
		t.Fatalf("ping after the reconnection: pause %v, open %v", d, g.open())
	}
}

func TestDestBackoff(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := newDestBackoff(time.Second, 8*time.Second)
	b.backoff = func(n int, lo, hi time.Duration) time.Duration { return min(time.Duration(1<<(n-1))*lo, hi) } // no jitter
	at := func(d time.Duration) time.Time { return t0.Add(d) }

	// A round: every message of the destination that fails before the round's retries
	// come due waits for the same moment; only the first is logged.
	if d, log := b.deferral("q", t0); d != time.Second || !log {
		t.Fatalf("first deferral: %v, log %v", d, log)
	}
	if d, log := b.deferral("q", at(300*time.Millisecond)); d != 700*time.Millisecond || log {
		t.Fatalf("same round: %v, log %v", d, log)
	}
	// Another destination is its own.
	if d, _ := b.deferral("other", at(300*time.Millisecond)); d != time.Second {
		t.Fatalf("another destination: %v", d)
	}
	// The retries failed again: the next round waits twice as long, up to max.
	if d, log := b.deferral("q", at(time.Second)); d != 2*time.Second || !log {
		t.Fatalf("second round: %v, log %v", d, log)
	}
	b.deferral("q", at(3*time.Second))
	b.deferral("q", at(7*time.Second))
	if d, _ := b.deferral("q", at(15*time.Second)); d != 8*time.Second {
		t.Fatalf("fifth round: %v, want the 8 s ceiling", d)
	}
	// Quiet for more than twice max: it starts over.
	if d, _ := b.deferral("q", at(40*time.Second)); d != time.Second {
		t.Fatalf("after a quiet spell: %v, want a new streak", d)
	}
}
