package outbox

import (
	"github.com/outboxkit/outbox/internal/broken"
	"github.com/outboxkit/outbox/outboxdriver"
)

// walReadLimit is the number of unresolved seqs above which the relay stops reading the
// WAL stream: the walsender then waits on TCP, and the relay still acknowledges what it
// resolves. It bounds the tracker's memory (a seq costs about a hundred bytes).
const walReadLimit = 200_000

// walWant is what a stream batch asks of the fetch plan.
type walWant int

const (
	walWantNothing walWant = iota // every seq it brought is in hand, or it brought none
	walWantMore                   // seqs above the cursor: a continuation reads them
	walWantFull                   // a seq at or below the cursor not in hand, or a bulk transaction: a full fetch
)

// walFetch is a fetch as the tracker sees it, from sent to fetched.
type walFetch struct {
	gen     uint64  // the transactions added up to gen had arrived when it was sent
	after   int64   // a continuation's lower bound; 0 for a full fetch
	exclude []int64 // a full fetch's exclusions: the seqs in hand when it was sent
	// snap is the snapshot the fetch read in, when the store says (SnapshotFetcher): a
	// transaction counts as read only if the snapshot saw it finished, since its commit
	// can reach the stream before other sessions see it. nil: not checked.
	snap *outboxdriver.Snapshot
}

// walTracker holds what the relay read from the WAL stream until the slot may be
// acknowledged past it (docs/design-wal.md, section 2): the transactions in stream
// (commit) order, each with the seqs it inserted that are not yet resolved. The stream is
// a wake-up; messages still come only from the fetches into the hand, and the tracker
// decides how far the slot's confirmed position may move. It does no I/O and reads no
// clock.
//
// A seq a transaction inserted is resolved by an event sent after the transaction
// arrived, and by nothing else:
//   - (a) its outcome was recorded, refused, or dropped as stale (settled);
//   - (b) a full fetch reached it (came back short, or returned a seq at or above it),
//     did not return it, and did not exclude it as in hand; nor was it in hand when the
//     fetch returned; and the fetch's snapshot saw its transaction finished (the
//     walsender may send a commit before the committing session leaves the proc array).
//     The row was then recorded, not due, behind a waiting row of its key, or in a shard
//     not held: the polling path owns it (NextDue, the key's release, the shard's
//     holder);
//   - (d) a bulk transaction, of which only the range is known, is resolved as a whole by
//     a full fetch that reached its highest seq: it is handed to polling, whose fetches
//     go on reading that range in seq order.
//
// A message taken into hand is not resolved until its record; a row a fetch returned but
// the loop ignored (taint, a failed lane, a lease change) is not; a continuation never
// resolves, since it reads nothing below its start and skips keys it may not overtake.
// Events count by arrival (gen): a fetch or a record sent before a transaction arrived
// may have read or written the database before that transaction committed.
//
// (c) Repeats. A ring move inserts a pending row again under the same seq, and so does a
// replay of a dead letter; nothing in the stream tells them apart. Each occurrence is
// resolved on its own, and an event resolves every occurrence of the seq that arrived
// before it was sent: the row is one row, pending once, so a move that arrived while its
// row was in hand or awaiting a fetch is resolved with the first occurrence. A repeat that
// arrived after the record (or the fetch) was sent is kept: it may be a replay of the
// dead letter that record wrote, a row pending again that nothing has read yet, and
// settled and fetched say that a full fetch must look (again). Resolving a repeat at once
// would acknowledge such a replay on the strength of an event older than it.
//
// Invariants, kept by these methods:
//   - txns holds the transactions not yet popped, in stream order, with strictly rising
//     end positions; a transaction at or below the last end added is a redelivery (after
//     a reconnect the stream starts again from the slot's confirmed position) whose first
//     copy is held or was resolved, and is dropped;
//   - open[seq] lists, oldest first and each once, the held transactions in which seq is
//     unresolved; a transaction's open counts its seqs there, seqs is the sum of those
//     counts, and pending counts the held transactions not resolved;
//   - acked is the end of the longest resolved prefix of the transactions added, or, when
//     every one added is resolved, the highest idle position past all of them (never a
//     position received while a transaction was still to resolve); it never goes back.
//
// Why acknowledging acked is safe: every transaction at or below it had each of its rows
// recorded or owned by the polling path when it was resolved, and both stay true (a
// recorded row becomes pending again only by a replay, a new transaction; a row polling
// owns stays in the table until polling handles it). The slot never holds the only copy
// of a message; it holds the news that one is pending.
type walTracker struct {
	// gen counts the batches added. An event captures it when it is sent (a fetch
	// through sent, a record of outcomes by reading it), and resolves only transactions
	// added up to then.
	gen uint64

	txns    []*walTxn
	open    map[int64][]*walTxn
	seqs    int    // unresolved occurrences of seqs
	pending int    // transactions not resolved
	bulks   int    // bulk transactions not resolved
	handed  uint64 // seqs and bulk transactions a full fetch resolved by not returning them (b, d)
	peak    int    // the most seqs open has held since it was last made anew (compact)

	lastEnd uint64 // end of the last transaction added
	idle    uint64 // the highest idle position received
	acked   uint64
}

// walTxn is a transaction the tracker holds.
type walTxn struct {
	end  uint64
	xid  uint32
	gen  uint64
	open int   // its seqs not resolved
	bulk bool  // a bulk transaction no full fetch reached yet
	hi   int64 // a bulk transaction's highest seq
}

func (x *walTxn) resolved() bool { return x.open == 0 && !x.bulk }

func newWALTracker() *walTracker {
	return &walTracker{open: map[int64][]*walTxn{}}
}

// add takes in a stream batch, given the fetch cursor and the messages in hand, and says
// which fetch reads what it brought: a seq at or below the cursor that is not in hand is
// a late commit, a move or a replay, which only a full fetch finds. A seq in hand waits
// for its record. add never moves the acknowledged position: a transaction with a seq
// is unresolved when it arrives.
func (t *walTracker) add(b outboxdriver.StreamBatch, cursor int64, inHand func(seq int64) bool) walWant {
	t.gen++
	want := walWantNothing
	for _, st := range b.Txns {
		if st.End <= t.lastEnd {
			continue // redelivered
		}
		t.lastEnd = st.End
		x := &walTxn{end: st.End, xid: st.Xid, gen: t.gen}
		t.txns = append(t.txns, x)
		if st.Bulk {
			x.bulk, x.hi = true, st.Hi
			t.bulks++
			t.pending++
			want = walWantFull
			continue
		}
		for _, seq := range st.Seqs {
			occ := t.open[seq]
			if n := len(occ); n > 0 && occ[n-1] == x {
				continue // twice in one transaction: one row
			}
			t.open[seq] = append(occ, x)
			t.peak = max(t.peak, len(t.open))
			x.open++
			t.seqs++
			if !inHand(seq) {
				if seq <= cursor {
					want = walWantFull
				} else {
					want = max(want, walWantMore)
				}
			}
		}
		if x.open > 0 {
			t.pending++
		}
	}
	t.idle = max(t.idle, b.Idle)
	return want
}

// sent records a fetch being sent: after is a continuation's lower bound (0 for a full
// fetch), exclude the seqs a full fetch excludes as in hand. Pass the result to fetched
// when the fetch answers; a fetch that failed showed nothing and is forgotten.
func (t *walTracker) sent(after int64, exclude []int64) walFetch {
	return walFetch{gen: t.gen, after: after, exclude: exclude}
}

// fetched takes in a fetch's answer: its rows, whether it came back short (fewer rows than
// its limit), and inHand, whether a message is in hand after the hand took the rows in. It
// resolves what a full fetch showed to be the polling path's, and reports again when a
// seq this fetch reached is still unresolved and not in hand: returned but ignored, left
// hand while the fetch ran, or skipped by a continuation; or when a bulk transaction it
// could have covered is not yet covered. Only a full fetch finds those. It reads every
// unresolved seq once: its cost is bounded by walReadLimit.
func (t *walTracker) fetched(f walFetch, rows []*Message, short bool, inHand func(seq int64) bool) (again bool) {
	var top int64
	returned := make(map[int64]bool, len(rows))
	for _, m := range rows {
		returned[m.Seq] = true
		top = max(top, m.Seq)
	}
	full := f.after == 0
	var excluded map[int64]bool
	if full {
		excluded = make(map[int64]bool, len(f.exclude))
		for _, seq := range f.exclude {
			excluded[seq] = true
		}
	}
	for seq, occ := range t.open {
		if !short && seq > top {
			continue // not reached: the fetch stopped at its limit below it
		}
		if inHand(seq) {
			continue // in hand: its record resolves it
		}
		n := 0 // the occurrences that had arrived when the fetch was sent
		for n < len(occ) && occ[n].gen <= f.gen {
			n++
		}
		if n == 0 {
			continue
		}
		if !full {
			return true // a continuation resolves nothing: one such seq says it all
		}
		if returned[seq] || excluded[seq] {
			again = true
			continue
		}
		seen := 0 // of those, the leading ones whose transaction the snapshot saw finished
		for seen < n && f.sawFinished(occ[seen]) {
			seen++
		}
		if seen < n {
			again = true
		}
		if seen > 0 {
			t.resolve(seq, seen)
			t.handed++
		}
	}
	if t.bulks > 0 {
		for _, x := range t.txns {
			if !x.bulk || x.gen > f.gen {
				continue
			}
			if full && (short || top >= x.hi) && f.sawFinished(x) {
				x.bulk = false
				t.bulks--
				t.handed++
				if x.resolved() {
					t.pending--
				}
			} else {
				again = true
			}
		}
	}
	t.compact()
	return again
}

// sawFinished reports whether the fetch's snapshot saw x's transaction finished (true
// when the store gave no snapshot).
func (f walFetch) sawFinished(x *walTxn) bool { return f.snap == nil || f.snap.Finished(x.xid) }

// settled records that seq's outcome was recorded, refused, or dropped as stale; gen is
// the tracker's gen when that record was sent (or now, for a drop). It reports again when
// an occurrence of seq that arrived later is still unresolved: a move or a replay no
// event has covered yet, which a full fetch must look for. An unknown seq is ignored.
func (t *walTracker) settled(seq int64, gen uint64) (again bool) {
	occ := t.open[seq]
	n := 0
	for n < len(occ) && occ[n].gen <= gen {
		n++
	}
	if n > 0 {
		t.resolve(seq, n)
		t.compact()
	}
	return n < len(occ)
}

// resolve resolves the first n occurrences of seq.
func (t *walTracker) resolve(seq int64, n int) {
	occ := t.open[seq]
	for _, x := range occ[:n] {
		x.open--
		if x.resolved() {
			t.pending--
		}
	}
	t.seqs -= n
	if n == len(occ) {
		delete(t.open, seq)
		return
	}
	clear(occ[:n])
	t.open[seq] = occ[n:]
}

// compactMin is the fewest seqs open must have held before compact makes it anew.
const compactMin = 1024

// compact makes open anew once it holds a sixteenth of what it held: a Go map keeps its
// room after deletes, and fetched looks through all of it. After a backlog of 100,000
// announced rows, each full fetch of the trickle that followed spent about a millisecond
// on an all but empty map.
func (t *walTracker) compact() {
	if t.peak < compactMin || len(t.open) > t.peak/16 {
		return
	}
	m := make(map[int64][]*walTxn, len(t.open))
	for seq, occ := range t.open {
		m[seq] = occ
	}
	t.open, t.peak = m, len(m)
}

// ackable returns the position the slot may be acknowledged to, 0 before there is one:
// the end of the longest resolved prefix of the transactions (a low watermark), or an
// idle position past every transaction added once all are resolved. It never goes back;
// the loop sends it when it rose.
func (t *walTracker) ackable() uint64 {
	if broken.Has(broken.WALAckOnReceipt) { // canary: whatever arrived
		t.acked = max(t.acked, t.lastEnd, t.idle)
	}
	if broken.Has(broken.WALAckMax) { // canary: the latest resolved, not the prefix
		for _, x := range t.txns {
			if x.resolved() {
				t.acked = max(t.acked, x.end)
			}
		}
	}
	for len(t.txns) > 0 && t.txns[0].resolved() {
		t.acked = max(t.acked, t.txns[0].end)
		t.txns[0] = nil
		t.txns = t.txns[1:]
	}
	if len(t.txns) == 0 && t.idle > t.lastEnd {
		t.acked = max(t.acked, t.idle)
	}
	return t.acked
}

// unresolved returns the number of transactions not resolved (the
// outbox_wal_unresolved_txns gauge) and of their unresolved seqs, against walReadLimit.
// A bulk transaction counts no seqs: it holds only its range.
func (t *walTracker) unresolved() (txns, seqs int) { return t.pending, t.seqs }

// isOpen reports whether seq is unresolved in a transaction the tracker holds.
func (t *walTracker) isOpen(seq int64) bool { return len(t.open[seq]) > 0 }
