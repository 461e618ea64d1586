package outbox

import (
	"slices"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// dbRetry is how long the relay waits before trying a store call again after n failures
// of it in a row: 25 ms doubling up to 200 ms. A database that is down is then asked
// about five times a second per relay (a refused connection each), and a relay resumes
// within about 200 ms of its return. Connections the server closed are replaced within
// the call by the pgx store (outboxpgx's onLiveConn), so they seldom get here.
func dbRetry(n int) time.Duration {
	return min(25*time.Millisecond<<min(max(n-1, 0), 3), 200*time.Millisecond)
}

// outcomeBuffer holds the broker's answers until the store records them: the confirmed
// messages, the rejected ones, and the lanes whose failure the recording settles. It does
// no I/O and reads no clock.
//
// Invariants:
//   - unrecorded counts every outcome buffered or in the running recording; the relay
//     counts it against MaxInFlight with the messages in flight, so that if recording
//     stalls, sending stops and the duplicates a takeover can cause stay bounded;
//   - at most one recording runs (running); take hands over everything buffered;
//   - a recording that failed is put back in front of what was buffered since, and the
//     next one waits dbRetry(failures) (retryAt): the messages stay in hand meanwhile.
type outcomeBuffer struct {
	published  []outboxdriver.Outcome
	failed     []outboxdriver.Failure
	lanes      []*lane // failed lanes whose failure a recording settles
	unrecorded int
	running    bool
	retryAt    time.Time // zero, or when a failed recording may be tried again
	failures   int       // recordings failed in a row
}

// inHand is the number of outcomes not yet recorded (buffered or being recorded).
func (b *outcomeBuffer) inHand() int { return b.unrecorded }

// retryTime is when a failed recording may be tried again; zero when none waits.
func (b *outcomeBuffer) retryTime() time.Time { return b.retryAt }

// confirmed buffers the outcome of a message the broker confirmed.
func (b *outcomeBuffer) confirmed(o outboxdriver.Outcome) {
	b.published = append(b.published, o)
	b.unrecorded++
}

// rejected buffers a rejection, and the lane it settles.
func (b *outcomeBuffer) rejected(f outboxdriver.Failure, ln *lane) {
	b.failed = append(b.failed, f)
	b.unrecorded++
	b.lanes = append(b.lanes, ln)
}

// idle reports whether nothing is buffered or being recorded (failed lanes without an
// outcome left, their failures dropped as stale, do not count).
func (b *outcomeBuffer) idle() bool {
	return !b.running && len(b.published) == 0 && len(b.failed) == 0
}

// ready reports whether a recording should start at now: nothing running, no retry
// pending, something buffered.
func (b *outcomeBuffer) ready(now time.Time) bool {
	if b.running || now.Before(b.retryAt) {
		return false
	}
	return len(b.published) > 0 || len(b.failed) > 0 || len(b.lanes) > 0
}

// dropStale removes the outcomes stale reports (fetched under a lease token the relay no
// longer holds) and returns how many.
func (b *outcomeBuffer) dropStale(stale func(outboxdriver.Outcome) bool) int {
	n := len(b.published) + len(b.failed)
	b.published = slices.DeleteFunc(b.published, stale)
	b.failed = slices.DeleteFunc(b.failed, func(f outboxdriver.Failure) bool { return stale(f.Outcome) })
	dropped := n - len(b.published) - len(b.failed)
	b.unrecorded -= dropped
	return dropped
}

// take hands everything buffered to a recording, which then runs.
func (b *outcomeBuffer) take() (published []outboxdriver.Outcome, failed []outboxdriver.Failure, lanes []*lane) {
	published, failed, lanes = b.published, b.failed, b.lanes
	b.published, b.failed, b.lanes = nil, nil, nil
	b.running, b.retryAt = true, time.Time{}
	return published, failed, lanes
}

// recorded ends a recording that the store took (refusals included).
func (b *outcomeBuffer) recorded(c outboxdriver.Completion) {
	b.running, b.failures = false, 0
	b.unrecorded -= len(c.Published) + len(c.Failed)
}

// again buffers outcomes a recording refused, to record them again at at: the messages
// stay in hand meanwhile.
func (b *outcomeBuffer) again(published []outboxdriver.Outcome, at time.Time) {
	b.published = append(published, b.published...)
	b.unrecorded += len(published)
	b.retryAt = at
}

// failedAt ends a recording that failed at now: its outcomes go back in front, and the
// next recording waits dbRetry, longer after each failure in a row.
func (b *outcomeBuffer) failedAt(c outboxdriver.Completion, lanes []*lane, now time.Time) {
	b.running = false
	b.published = append(c.Published, b.published...)
	b.failed = append(c.Failed, b.failed...)
	b.lanes = append(lanes, b.lanes...)
	b.failures++
	b.retryAt = now.Add(dbRetry(b.failures))
}
