package outbox

import "time"

// outageGate stops the relay's sending while the broker is unreachable. It does no I/O
// and reads no clock: the loop tells it what the publisher and the pings answered, and
// the time.
//
// States: open (until is zero: sending); paused (until set, not pinging: nothing is sent
// before until); pinging (until passed, and a ping to the broker is out: its answer either
// opens the gate or pauses again). Each outage in a row pauses longer (backoff between
// OutageMinDelay and OutageMaxDelay, with jitter); a confirmed publish ends the streak.
// The backoff spaces the probes, not the reaction: a publisher that reports its
// connection back (Reconnector) ends a pause at once.
// An outage reported while paused or pinging (a batch sent before the pause) changes
// nothing.
type outageGate struct {
	min, max time.Duration
	until    time.Time // end of the current pause; zero when open
	pinging  bool
	streak   int       // outages in a row
	began    time.Time // when the current outage began (the first pause of the streak)
	// backoff returns the pause after n outages in a row; backoff() outside tests.
	backoff func(n int, min, max time.Duration) time.Duration
}

// current returns the outages in a row and when the first of them began.
func (g *outageGate) current() (streak int, began time.Time) { return g.streak, g.began }

func newOutageGate(min, max time.Duration) *outageGate {
	return &outageGate{min: min, max: max, backoff: backoff}
}

// open reports whether messages may be sent.
func (g *outageGate) open() bool { return g.until.IsZero() }

// confirmed records a publish the broker confirmed: the outage streak ends.
func (g *outageGate) confirmed() { g.streak = 0 }

// outage records a batch that found the broker unreachable. It returns the pause it
// began, or 0 when the gate was already closed.
func (g *outageGate) outage(now time.Time) time.Duration {
	if !g.open() {
		return 0
	}
	if g.streak == 0 {
		g.began = now
	}
	return g.pause(now)
}

func (g *outageGate) pause(now time.Time) time.Duration {
	g.streak++
	d := g.backoff(g.streak, g.min, g.max)
	g.until = now.Add(d)
	return d
}

// wakeAt is when the loop must call due next: the end of the pause, or zero (open, or
// waiting for a ping's answer).
func (g *outageGate) wakeAt() time.Time {
	if g.pinging {
		return time.Time{}
	}
	return g.until
}

// due reports whether the pause is over at now and the broker should be checked; the
// loop then calls ping (and sends a ping) or, when the publisher cannot be pinged,
// reopen.
func (g *outageGate) due(now time.Time) bool {
	return !g.open() && !g.pinging && !now.Before(g.until)
}

// reconnected records that the publisher's connection came back at now: a pause ends at
// once. It reports whether the gate is due (the loop then pings, as after a pause).
func (g *outageGate) reconnected(now time.Time) bool {
	if g.open() || g.pinging {
		return false
	}
	g.until = now
	return true
}

// ping records that a ping to the broker is out.
func (g *outageGate) ping() { g.pinging = true }

// reopen opens the gate without a ping.
func (g *outageGate) reopen() { g.until, g.pinging = time.Time{}, false }

// pinged records the ping's answer: nil opens the gate; an error pauses again, longer,
// and returns the pause.
func (g *outageGate) pinged(err error, now time.Time) time.Duration {
	g.pinging = false
	if err == nil {
		g.until = time.Time{}
		return 0
	}
	return g.pause(now)
}

// destBackoff spaces the retries of messages whose destination is unavailable
// (DestinationOutage). It does no I/O and reads no clock.
//
// A round is the messages of one destination that failed together: every deferral until
// the round's delay has passed gets the same streak. Each round in a row waits longer,
// from min to max (with jitter); a destination with no deferral for twice max starts
// over. At most maxDests destinations are remembered: forgetting one only shortens its
// next wait.
type destBackoff struct {
	min, max time.Duration
	dests    map[string]*destRound
	backoff  func(n int, min, max time.Duration) time.Duration // backoff() outside tests
}

type destRound struct {
	streak int
	due    time.Time // when this round's messages are tried again
	last   time.Time // the last deferral
	logged time.Time // the last log line about this destination
}

const maxDests = 1000

func newDestBackoff(min, max time.Duration) *destBackoff {
	return &destBackoff{min: min, max: max, dests: map[string]*destRound{}, backoff: backoff}
}

// deferral records a message of dest deferred at now and returns its delay, and whether
// to log it (once a second per destination).
func (b *destBackoff) deferral(dest string, now time.Time) (delay time.Duration, log bool) {
	r := b.dests[dest]
	if r != nil && now.Sub(r.last) > 2*b.max {
		r = nil // quiet for long: start over
	}
	if r == nil {
		if len(b.dests) >= maxDests {
			clear(b.dests)
		}
		r = &destRound{}
		b.dests[dest] = r
	}
	if r.streak == 0 || !now.Before(r.due) {
		r.streak++ // a new round: the last one's retries failed again
		r.due = now.Add(b.backoff(r.streak, b.min, b.max))
	}
	r.last = now
	if log = now.Sub(r.logged) >= time.Second; log {
		r.logged = now
	}
	return max(r.due.Sub(now), 0), log
}
