package outbox

import (
	"github.com/outboxkit/outbox/outboxdriver"
	"testing"
	"time"
)

func TestFetchPlan(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var p fetchPlan
	type want struct {
		fetch, full bool
		after       int64
	}
	check := func(step string, now time.Time, room int, w want) {
		t.Helper()
		fetch, full, after := p.next(now, room, 100)
		if (want{fetch, full, after}) != w {
			t.Fatalf("%s: next = fetch %v, full %v, after %d; want %+v (plan %+v)", step, fetch, full, after, w, p)
		}
		if fetch {
			p.started(full, now)
		}
	}

	check("nothing asked", t0, 1000, want{})
	p.want = true
	check("a wake-up", t0, 1000, want{fetch: true, full: true})
	check("the wake-up is used up", t0, 1000, want{})

	// A full fetch came back full: a backlog. Continuations follow from its top.
	p.done(500, true, 0)
	check("backlog", t0, 1000, want{fetch: true, after: 500})
	check("no room", t0, 49, want{})
	p.done(600, true, 500)
	// A wake-up within fullFetchEvery of the last full fetch waits; after it, a full one.
	p.want = true
	check("wake-up in a backlog, too soon", t0.Add(fullFetchEvery-1), 1000, want{fetch: true, after: 600})
	check("wake-up in a backlog", t0.Add(fullFetchEvery), 1000, want{fetch: true, full: true})
	// That full fetch came back full below the cursor (late commits, retries): the cursor
	// goes down to what it covered.
	p.done(550, true, 0)
	check("after a full fetch below the cursor", t0, 1000, want{fetch: true, after: 550})
	// The continuation comes back short: the backlog is over; the next fetch waits for a
	// wake-up and is full.
	p.done(700, false, 550)
	check("backlog drained", t0, 1000, want{})
	if p.cursor != 700 || p.maxSeq != 700 {
		t.Fatalf("cursor %d, maxSeq %d; want 700, 700", p.cursor, p.maxSeq)
	}
	// A short full fetch covers everything: the cursor jumps to the highest seq seen.
	p.want = true
	check("poll", t0.Add(time.Second), 1000, want{fetch: true, full: true})
	p.done(20, false, 0)
	if p.cursor != 700 {
		t.Fatalf("cursor after a short full fetch = %d, want 700", p.cursor)
	}
	// A failed fetch ends the backlog mode, keeps the cursor, and is tried again, full,
	// after dbRetry (not at the next poll), longer after each failure in a row.
	p.moreLikely = true
	p.failed(t0.Add(time.Second))
	check("right after a failure", t0.Add(time.Second), 1000, want{})
	if p.cursor != 700 || !p.wakeAt(t0.Add(time.Second)).Equal(t0.Add(time.Second+dbRetry(1))) {
		t.Fatalf("after a failure: cursor %d, wake %v", p.cursor, p.wakeAt(t0.Add(time.Second)))
	}
	check("retry after a failure", t0.Add(time.Second+dbRetry(1)), 1000, want{fetch: true, full: true})
	if !p.wakeAt(t0.Add(time.Second + dbRetry(1))).IsZero() {
		t.Fatal("a fetch retry that came due still wakes the loop")
	}
	p.failed(t0.Add(2 * time.Second))
	check("second failure", t0.Add(2*time.Second+dbRetry(1)), 1000, want{})
	check("retry after the second failure", t0.Add(2*time.Second+dbRetry(2)), 1000, want{fetch: true, full: true})
	p.started(true, t0.Add(2*time.Second+dbRetry(2)))
	p.done(700, false, 0)
	if p.failures != 0 || !p.wakeAt(t0).IsZero() {
		t.Fatalf("after a fetch succeeded: failures %d, wake %v", p.failures, p.wakeAt(t0))
	}
	// New shards: a full fetch, and the cursor starts over.
	p.moreLikely = true
	p.gained()
	check("shards gained", t0.Add(time.Second), 1000, want{fetch: true, full: true})
	if p.cursor != 0 {
		t.Fatalf("cursor after gaining shards = %d", p.cursor)
	}
}

// A notification that says where its transaction's messages start is read by a
// continuation when they all lie above the cursor, with a full fetch no later than
// fullFetchEvery after the last; one at or below the cursor, or one that does not say,
// asks for a full fetch at once.
func TestFetchPlanNotified(t *testing.T) {
	t0 := time.Unix(1000, 0)
	p := fetchPlan{cursor: 700, maxSeq: 700, lastFull: t0}
	next := func(step string, now time.Time, full bool, after int64) {
		t.Helper()
		fetch, gotFull, gotAfter := p.next(now, 1000, 100)
		if !fetch || gotFull != full || gotAfter != after {
			t.Fatalf("%s: next = fetch %v, full %v, after %d; want full %v, after %d (plan %+v)", step, fetch, gotFull, gotAfter, full, after, p)
		}
		p.started(full, now)
	}
	p.notified(701)
	next("written above the cursor", t0.Add(time.Millisecond), false, 700)
	p.done(703, false, 700)
	if p.cursor != 703 {
		t.Fatalf("cursor after the continuation = %d, want 703", p.cursor)
	}
	if fetch, _, _ := p.next(t0.Add(2*time.Millisecond), 1000, 100); fetch {
		t.Fatal("a continuation with nothing more to read fetches again at once")
	}
	if !p.wakeAt(t0.Add(2 * time.Millisecond)).Equal(t0.Add(fullFetchEvery)) {
		t.Fatalf("the paced full fetch wakes the loop at %v, want %v", p.wakeAt(t0), t0.Add(fullFetchEvery))
	}
	next("paced full fetch", t0.Add(fullFetchEvery), true, 0)
	p.done(0, false, 0)

	p.notified(703)
	next("a late commit at the cursor", t0.Add(fullFetchEvery+time.Millisecond), true, 0)
	p.done(703, false, 0)
	p.notified(0)
	next("a notification that does not say", t0.Add(fullFetchEvery+2*time.Millisecond), true, 0)
	p.done(0, false, 0)

	// Without a cursor (the relay's first fetch, shards just gained) the fetch is full.
	p.gained()
	p.want = false
	p.notified(900)
	next("no cursor yet", t0.Add(time.Second), true, 0)
}

func TestListenNews(t *testing.T) {
	var w listenNews
	if froms, unknown, started, gate, full := w.take(); froms != nil || unknown || started || gate.kind != newsNone || full {
		t.Fatalf("nothing gathered: %v, %v, %v, %v, %v", froms, unknown, started, gate, full)
	}
	w.written(9)
	w.written(4)
	if froms, unknown, _, gate, _ := w.take(); len(froms) != 2 || froms[0] != 9 || froms[1] != 4 || unknown || gate.kind != newsWritten {
		t.Fatalf("two seqs: %v, %v, %v", froms, unknown, gate)
	}
	w.written(5)
	w.written(0)
	if _, unknown, _, _, _ := w.take(); !unknown {
		t.Fatal("a notification that did not say is lost")
	}
	for i := range maxGathered + 1 {
		w.written(int64(i + 1))
	}
	if froms, unknown, _, _, _ := w.take(); len(froms) != maxGathered || !unknown {
		t.Fatalf("more than kept: %d seqs, unknown %v", len(froms), unknown)
	}
	// The gate's news in the order said: an answer, then a notification, is an open gate;
	// the full fetch an armed answer calls for is kept all the same.
	w.answered(outboxdriver.GateArmed)
	w.written(7)
	if _, _, _, gate, full := w.take(); gate.kind != newsWritten || !full {
		t.Fatalf("armed, then a notification: %v, full %v", gate, full)
	}
	w.written(8)
	w.answered(outboxdriver.GateBusy)
	if _, _, _, gate, full := w.take(); gate.kind != newsAnswer || gate.answer != outboxdriver.GateBusy || full {
		t.Fatalf("a notification, then busy: %v, full %v", gate, full)
	}
	w.answered(outboxdriver.GateCovered)
	w.listening(false)
	w.listening(true)
	w.written(9)
	if _, _, started, gate, _ := w.take(); !started || gate.kind != newsWritten {
		t.Fatalf("the listener stopped, started and woke: started %v, %v", started, gate)
	}
	w.answered(outboxdriver.GateCovered)
	w.listening(false)
	if _, _, _, gate, full := w.take(); gate.kind != newsStopped || !full {
		t.Fatalf("covered, then the listener stopped: %v, full %v", gate, full)
	}
}

// A transaction whose lowest message the relay holds at or below its cursor needs no
// fetch; any other asks for the fetch its seq calls for.
func TestLoopNotified(t *testing.T) {
	l := &loop{hand: newHand(), fetch: fetchPlan{cursor: 50}}
	l.hand.known[40] = inHand{key: "k"}
	l.notified([]int64{40}, false)
	if l.fetch.want || l.fetch.more {
		t.Fatalf("a transaction already read: plan %+v", l.fetch)
	}
	l.notified([]int64{40, 60}, false)
	if l.fetch.want || !l.fetch.more {
		t.Fatalf("one transaction read, one above the cursor: plan %+v", l.fetch)
	}
	l.notified([]int64{45}, false)
	if !l.fetch.want {
		t.Fatalf("a late commit not in hand: plan %+v", l.fetch)
	}
	l.fetch = fetchPlan{cursor: 50}
	l.notified([]int64{40}, true)
	if !l.fetch.want {
		t.Fatalf("a notification that did not say: plan %+v", l.fetch)
	}
}

// TestFetchPlanPriority: priority fetches go only through a backlog, at once again while
// they come back full, every fullFetchEvery while they find messages, backing off to
// prioIdleEvery while they find none, and never while a batch of prioritized messages is
// in hand; they leave the cursor alone.
func TestFetchPlanPriority(t *testing.T) {
	t0 := time.Unix(1000, 0)
	p := fetchPlan{prio: true}
	next := func(now time.Time, prioritized int) bool { return p.nextPriority(now, 1000, 100, prioritized) }
	if next(t0, 0) {
		t.Fatal("a priority fetch without a backlog")
	}
	p.done(500, true, 0) // a full fetch came back full: a backlog
	if !next(t0, 0) {
		t.Fatal("no priority fetch in a backlog")
	}
	p.priorityStarted(t0)
	p.priorityDone(100, true)
	if !next(t0, 0) || next(t0, 100) {
		t.Fatal("after a full priority fetch: want another at once, unless a batch of prioritized messages is in hand")
	}
	if p.at() != 500 {
		t.Fatalf("cursor %d after priority fetches, want the full fetch's 500", p.at())
	}
	p.priorityStarted(t0)
	p.priorityDone(10, false)
	if next(t0.Add(fullFetchEvery-1), 0) || !next(t0.Add(fullFetchEvery), 0) {
		t.Fatal("after a short priority fetch that found messages: want the next after fullFetchEvery")
	}
	at := t0
	for range 10 { // nothing found: the interval doubles up to prioIdleEvery
		at = at.Add(time.Hour)
		p.priorityStarted(at)
		p.priorityDone(0, false)
	}
	if next(at.Add(prioIdleEvery-1), 0) || !next(at.Add(prioIdleEvery), 0) {
		t.Fatalf("after empty priority fetches: want the next after %v (every %v)", prioIdleEvery, p.prioEvery)
	}
	p.priorityDone(1, false)
	if !next(at.Add(fullFetchEvery), 0) {
		t.Fatal("a priority fetch that found a message did not bring the interval back")
	}
	p.prio = false
	if next(at.Add(time.Hour), 0) {
		t.Fatal("a priority fetch on a store without priorities")
	}
}
