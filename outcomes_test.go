package outbox

import (
	"testing"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

func TestOutcomeBuffer(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var b outcomeBuffer
	if !b.idle() || b.ready(t0) {
		t.Fatal("an empty buffer is not idle")
	}
	ln := &lane{key: "k"}
	b.confirmed(outboxdriver.Outcome{Seq: 1, Token: 7})
	b.confirmed(outboxdriver.Outcome{Seq: 2, Token: 8})
	b.rejected(outboxdriver.Failure{Outcome: outboxdriver.Outcome{Seq: 3, Token: 7}, Error: "no"}, ln)
	if b.unrecorded != 3 || b.idle() || !b.ready(t0) {
		t.Fatalf("after 3 outcomes: unrecorded %d, idle %v, ready %v", b.unrecorded, b.idle(), b.ready(t0))
	}
	// Outcomes under a lease token no longer held are dropped, and no longer count.
	if n := b.dropStale(func(o outboxdriver.Outcome) bool { return o.Token == 8 }); n != 1 || b.unrecorded != 2 {
		t.Fatalf("dropStale = %d, unrecorded %d", n, b.unrecorded)
	}
	pub, failed, lanes := b.take()
	if len(pub) != 1 || len(failed) != 1 || len(lanes) != 1 || b.ready(t0) || b.idle() {
		t.Fatalf("take: %v %v %v; ready %v, idle %v", pub, failed, lanes, b.ready(t0), b.idle())
	}
	// More outcomes arrive while it runs; the recording fails: its outcomes go back in
	// front, still counted, and the next try waits dbRetry(1), then longer.
	b.confirmed(outboxdriver.Outcome{Seq: 4, Token: 7})
	c := outboxdriver.Completion{Published: pub, Failed: failed}
	b.failedAt(c, lanes, t0)
	if b.unrecorded != 3 || b.published[0].Seq != 1 || b.published[1].Seq != 4 || b.lanes[0] != ln {
		t.Fatalf("after a failed recording: unrecorded %d, published %v, lanes %v", b.unrecorded, b.published, b.lanes)
	}
	if b.ready(t0.Add(dbRetry(1)-1)) || !b.ready(t0.Add(dbRetry(1))) {
		t.Fatal("a failed recording is not retried after dbRetry(1)")
	}
	pub, failed, lanes = b.take()
	b.failedAt(outboxdriver.Completion{Published: pub, Failed: failed}, lanes, t0)
	if b.ready(t0.Add(dbRetry(2)-1)) || !b.ready(t0.Add(dbRetry(2))) || dbRetry(2) <= dbRetry(1) {
		t.Fatal("a second failure in a row is not retried after the longer dbRetry(2)")
	}
	pub, failed, _ = b.take()
	b.recorded(outboxdriver.Completion{Published: pub, Failed: failed})
	if b.unrecorded != 0 || !b.idle() || b.ready(t0.Add(time.Hour)) {
		t.Fatalf("after the recording: unrecorded %d, idle %v", b.unrecorded, b.idle())
	}
}
