package outbox

import "time"

// fullFetchEvery spaces full fetches while a backlog is drained by continuations.
const fullFetchEvery = 100 * time.Millisecond

// fetchPlan decides when the relay fetches and which kind of fetch, and keeps the
// cursor. It does no I/O and reads no clock.
//
// A full fetch scans the pending messages from the oldest, excluding those in hand; it
// finds everything: late commits, retries come due, messages of shards just gained. While
// the last fetch came back full (a backlog), the next one continues above the cursor, a
// range scan that does not re-read what is in hand; wake-ups and polls still get a full
// fetch at least every fullFetchEvery.
//
// Invariant: every due message at or below the cursor is in hand or held back by its
// key's gate (floors.go); a continuation starts above it. A full fetch that came back
// full covers every due message up to the highest seq it returned; one that came back
// short covers everything, so the cursor may jump to the highest seq seen; a
// continuation extends the coverage it started from. Gaining shards resets the cursor
// (their messages below it were never seen), and so does nothing else: a failed fetch
// leaves it, and only ends the backlog mode.
type fetchPlan struct {
	want       bool      // a wake-up, poll or lease change asked for a full fetch
	paced      bool      // a full fetch is wanted, no sooner than fullFetchEvery after the last
	more       bool      // messages above the cursor were announced (WAL mode): a continuation reads them
	moreLikely bool      // the last fetch came back full: a backlog
	cursor     int64     // 0: the next fetch is full
	maxSeq     int64     // highest seq any fetch returned
	lastFull   time.Time // when the last full fetch started
	retryAt    time.Time // after a failed fetch: no fetch before it
	failures   int       // fetches failed in a row

	// Priority fetches (the store keeps priorities) read a backlog's higher-priority
	// messages ahead of it: while the fetches come back full, a priority fetch goes
	// first every fullFetchEvery (backing off to prioIdleEvery while they find nothing),
	// and at once again while the last one came back full. It neither reads nor moves the cursor: what it brings into hand is
	// excluded from full fetches, and ignored when a continuation returns it again.
	prio      bool
	prioMore  bool          // the last priority fetch came back full
	prioLast  time.Time     // when the last priority fetch started
	prioEvery time.Duration // the interval between priority fetches: longer while they find nothing
}

// Priority fetches run every fullFetchEvery while they find messages, and back off to
// prioIdleEvery, doubling, while they find none.
const prioIdleEvery = time.Second

// next says whether to fetch at now, given room for that many messages in hand against
// a batch size, and whether that fetch is full; after is the continuation's lower bound.
// The loop calls started when it sends the fetch.
func (p *fetchPlan) next(now time.Time, room, batch int) (fetch, full bool, after int64) {
	want := p.want || (p.paced && now.Sub(p.lastFull) >= fullFetchEvery)
	if !(want || p.moreLikely || p.more) || room < batch/2 || now.Before(p.retryAt) {
		return false, false, 0
	}
	full = p.cursor == 0 || !(p.moreLikely || p.more) || (want && now.Sub(p.lastFull) >= fullFetchEvery)
	if full {
		return true, true, 0
	}
	return true, false, p.cursor
}

// nextPriority says whether the fetch to send at now, with room for that many messages
// in hand against a batch size, and that many with a priority in hand already, is a
// priority fetch. Messages with a priority take at most about a batch of the hand: a
// key's messages go one at a time, so more of a few keys' would keep the rest of the
// backlog waiting without reaching the broker any sooner. The loop calls
// priorityStarted when it sends it.
func (p *fetchPlan) nextPriority(now time.Time, room, batch, prioritized int) bool {
	return p.prio && p.moreLikely && room >= batch/2 && prioritized < batch && !now.Before(p.retryAt) &&
		(p.prioMore || now.Sub(p.prioLast) >= max(p.prioEvery, fullFetchEvery))
}

// priorityStarted records a priority fetch sent at now.
func (p *fetchPlan) priorityStarted(now time.Time) { p.prioLast = now }

// priorityDone records a priority fetch's answer: how many messages it returned, and
// whether it came back full.
func (p *fetchPlan) priorityDone(n int, full bool) {
	p.prioMore = full
	switch {
	case n > 0:
		p.prioEvery = fullFetchEvery
	default:
		p.prioEvery = min(max(2*p.prioEvery, fullFetchEvery), prioIdleEvery)
	}
}

// started records a fetch sent at now.
func (p *fetchPlan) started(full bool, now time.Time) {
	p.more = false
	if full {
		p.want, p.paced = false, false
		p.lastFull = now
	}
}

// done records a fetch's answer: the highest seq it returned (0 for none), whether it
// came back full, and the lower bound it continued from (0 for a full fetch).
func (p *fetchPlan) done(top int64, full bool, after int64) {
	p.moreLikely = full
	p.failures, p.retryAt = 0, time.Time{}
	p.maxSeq = max(p.maxSeq, top)
	switch {
	case after > 0:
		p.cursor = max(p.cursor, top)
	case full:
		p.cursor = top
	default:
		p.cursor = p.maxSeq
	}
}

// wakeAt is when a fetch held back may go, for the loop's timer (after a failure, or a
// paced full fetch): zero when none is held back at now.
func (p *fetchPlan) wakeAt(now time.Time) time.Time {
	if now.Before(p.retryAt) {
		return p.retryAt
	}
	if p.paced {
		return p.lastFull.Add(fullFetchEvery)
	}
	return time.Time{}
}

// failed records a fetch that failed at now: the next one is full, and goes after
// dbRetry, longer after each failure in a row, rather than at the next poll.
func (p *fetchPlan) failed(now time.Time) {
	p.moreLikely, p.want = false, true
	p.failures++
	p.retryAt = now.Add(dbRetry(p.failures))
}

// notified records a notification that messages were written, from seq from on (0: it
// does not say). When they all lie above the cursor, a continuation reads them: it starts
// at the cursor and walks none of the rows already published, which a full fetch walks
// from the oldest while a snapshot keeps them. A full fetch still follows within
// fullFetchEvery (paced) for what no notification announces: retries come due, and a
// key's messages that a continuation held back behind an older one. Anything else (a
// late commit at or below the cursor, a notification that does not say, no cursor yet)
// asks for a full fetch now.
func (p *fetchPlan) notified(from int64) {
	if from <= p.cursor {
		p.want = true
		return
	}
	p.poke()
}

// planned reports whether a fetch is planned now, or once there is room (a paced full
// fetch may be up to fullFetchEvery away: it does not count).
func (p *fetchPlan) planned() bool { return p.want || p.more || p.moreLikely }

// wantFull asks for a full fetch now: a poll, or the gate just taken (gate.go), after
// which rows committed by writers that did not notify may lie anywhere.
func (p *fetchPlan) wantFull() { p.want = true }

// poke asks for a continuation now, with a full fetch within fullFetchEvery (paced):
// messages may have been written above the cursor (a notification said so, or writers
// that do not notify are active: gate.go).
func (p *fetchPlan) poke() { p.more, p.paced = true, true }

// wantMore asks for a continuation now: messages above the cursor were announced.
func (p *fetchPlan) wantMore() { p.more = true }

// pace asks for a full fetch no sooner than fullFetchEvery after the last one.
func (p *fetchPlan) pace() { p.paced = true }

// cursorPolling is the canary broken.CursorPolling's plan: "id > cursor" polling, never
// below the highest seq seen, once a fetch returned any. It returns the continuation's
// lower bound.
func (p *fetchPlan) cursorPolling() (after int64, ok bool) {
	if p.maxSeq == 0 {
		return 0, false
	}
	p.cursor, p.want = p.maxSeq, false
	return p.maxSeq, true
}

// at is the cursor: a continuation reads above it; 0 before the first fetch that set it.
func (p *fetchPlan) at() int64 { return p.cursor }

// backlog reports whether the last fetch came back full: more is likely waiting.
func (p *fetchPlan) backlog() bool { return p.moreLikely }

// pacing reports whether a paced full fetch is wanted.
func (p *fetchPlan) pacing() bool { return p.paced }

// gained records new shards: the next fetch is full and starts over.
func (p *fetchPlan) gained() { p.want, p.cursor = true, 0 }
