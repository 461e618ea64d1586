package outbox

import (
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
