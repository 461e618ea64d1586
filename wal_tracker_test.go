package outbox

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/outboxkit/outbox/outboxdriver"
)

func walTx(end uint64, seqs ...int64) outboxdriver.StreamTxn {
	return outboxdriver.StreamTxn{End: end, Seqs: seqs}
}

func walBulk(end uint64, lo, hi int64) outboxdriver.StreamTxn {
	return outboxdriver.StreamTxn{End: end, Bulk: true, Lo: lo, Hi: hi}
}

func walBatch(txns ...outboxdriver.StreamTxn) outboxdriver.StreamBatch {
	return outboxdriver.StreamBatch{Txns: txns}
}

// walKnown is a hand holding seqs.
func walKnown(seqs ...int64) map[int64]inHand {
	known := make(map[int64]inHand, len(seqs))
	for _, seq := range seqs {
		known[seq] = inHand{}
	}
	return known
}

func walRows(seqs ...int64) []*Message {
	rows := make([]*Message, len(seqs))
	for i, seq := range seqs {
		rows[i] = &Message{Seq: seq}
	}
	return rows
}

// walFull sends a full fetch with nothing in hand and takes in its answer.
func walFull(w *walTracker, short bool, rows ...int64) (again bool) {
	return w.fetched(w.sent(0, nil), walRows(rows...), short, in(nil))
}

func TestWALTrackerAddWants(t *testing.T) {
	for _, tc := range []struct {
		name  string
		batch outboxdriver.StreamBatch
		known map[int64]inHand
		want  walWant
	}{
		{name: "an idle position", batch: outboxdriver.StreamBatch{Idle: 90}, want: walWantNothing},
		{name: "a transaction without seqs", batch: walBatch(walTx(100)), want: walWantNothing},
		{name: "seqs above the cursor", batch: walBatch(walTx(100, 11, 12)), want: walWantMore},
		{name: "a seq at the cursor", batch: walBatch(walTx(100, 10)), want: walWantFull},
		{name: "a late commit behind new seqs", batch: walBatch(walTx(100, 11), walTx(200, 12, 3)), want: walWantFull},
		{name: "a seq below the cursor already in hand", batch: walBatch(walTx(100, 3)), known: walKnown(3), want: walWantNothing},
		{name: "in hand below, new above", batch: walBatch(walTx(100, 3, 11)), known: walKnown(3), want: walWantMore},
		{name: "a bulk transaction above the cursor", batch: walBatch(walBulk(100, 11, 2_000_000)), want: walWantFull},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWALTracker()
			if got := w.add(tc.batch, 10, in(tc.known)); got != tc.want {
				t.Fatalf("add = %d, want %d", got, tc.want)
			}
		})
	}
}

// walStep is one event in the life of a tracker, and the position it may acknowledge
// after it.
type walStep struct {
	what string
	do   func(w *walTracker)
	ack  uint64
}

func walAdd(b outboxdriver.StreamBatch) func(*walTracker) {
	return func(w *walTracker) { w.add(b, 0, in(nil)) }
}

// walSettle records seq's outcome with a record sent now.
func walSettle(seq int64) func(*walTracker) {
	return func(w *walTracker) { w.settled(seq, w.gen) }
}

func TestWALTrackerAck(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []walStep
	}{
		{
			name: "a low watermark under out-of-order resolution",
			steps: []walStep{
				{"T1 and T2 arrive", walAdd(walBatch(walTx(100, 1), walTx(200, 2))), 0},
				{"T2 resolved first", walSettle(2), 0},
				{"T1 resolved: up to T2", walSettle(1), 200},
			},
		},
		{
			name: "never on receipt",
			steps: []walStep{
				{"T1 arrives", walAdd(walBatch(walTx(100, 1))), 0},
				{"T1 resolved", walSettle(1), 100},
				{"T2 arrives", walAdd(walBatch(walTx(200, 2))), 100},
				{"T3 arrives", walAdd(walBatch(walTx(300, 3))), 100},
				{"T3 resolved, not T2", walSettle(3), 100},
				{"T2 resolved", walSettle(2), 300},
			},
		},
		{
			name: "idle positions only when every transaction is resolved",
			steps: []walStep{
				{"T1 and an idle position", walAdd(outboxdriver.StreamBatch{Txns: []outboxdriver.StreamTxn{walTx(100, 1)}, Idle: 150}), 0},
				{"T2 arrives", walAdd(walBatch(walTx(200, 2))), 0},
				{"T1 resolved: the idle position is behind T2", walSettle(1), 100},
				{"an idle position while T2 is open", walAdd(outboxdriver.StreamBatch{Idle: 250}), 100},
				{"T2 resolved: the idle position", walSettle(2), 250},
				{"an idle position alone", walAdd(outboxdriver.StreamBatch{Idle: 300}), 300},
			},
		},
		{
			name: "an idle position from before a transaction is not past it",
			steps: []walStep{
				{"an idle position", walAdd(outboxdriver.StreamBatch{Idle: 50}), 50},
				{"T1 arrives", walAdd(walBatch(walTx(100, 1))), 50},
				{"an older idle position, redelivered", walAdd(outboxdriver.StreamBatch{Idle: 90}), 50},
				{"T1 resolved", walSettle(1), 100},
			},
		},
		{
			name: "a transaction without seqs waits only for those before it",
			steps: []walStep{
				{"T1 arrives", walAdd(walBatch(walTx(100, 1))), 0},
				{"an empty T2 arrives", walAdd(walBatch(walTx(200))), 0},
				{"T1 resolved", walSettle(1), 200},
			},
		},
		{
			name: "a redelivery after a reconnect is not a new transaction",
			steps: []walStep{
				{"T1 and T2 arrive", walAdd(walBatch(walTx(100, 1), walTx(200, 2))), 0},
				{"T1 resolved", walSettle(1), 100},
				{"T1 and T2 again", walAdd(walBatch(walTx(100, 1), walTx(200, 2))), 100},
				{"T2 resolved", walSettle(2), 200},
			},
		},
		{
			name: "a full fetch resolves what it did not return",
			steps: []walStep{
				{"T1 and T2 arrive", walAdd(walBatch(walTx(100, 1, 2), walTx(200, 3))), 0},
				{"a full fetch returns 2", func(w *walTracker) { walFull(w, true, 2) }, 0},
				{"2 recorded", walSettle(2), 200},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWALTracker()
			for _, s := range tc.steps {
				s.do(w)
				if got := w.ackable(); got != s.ack {
					t.Fatalf("%s: ackable = %d, want %d", s.what, got, s.ack)
				}
			}
			if txns, seqs := w.unresolved(); txns != 0 || seqs != 0 {
				t.Fatalf("at the end: %d transactions, %d seqs unresolved", txns, seqs)
			}
		})
	}
}

// TestWALTrackerFullFetch covers rule (b): a fetch resolves T1's seq 5 only if it was a
// full fetch sent after T1 arrived that reached 5, did not return it, and did not find it
// in hand when sent or when it returned.
func TestWALTrackerFullFetch(t *testing.T) {
	for _, tc := range []struct {
		name       string
		sentBefore bool  // the fetch was sent before T1 arrived
		after      int64 // a continuation's lower bound
		atSend     bool  // 5 in hand when the fetch was sent
		atReturn   bool  // 5 in hand when it returned
		rows       []int64
		short      bool
		open       bool // 5 still unresolved
		again      bool
	}{
		{name: "short, without it", rows: []int64{3}, short: true},
		{name: "came back full above it, without it", rows: []int64{3, 7}},
		{name: "came back full below it", rows: []int64{3, 4}, open: true},
		{name: "sent before the transaction arrived", sentBefore: true, short: true, open: true},
		{name: "returned and taken", rows: []int64{5}, short: true, atReturn: true, open: true},
		{name: "returned and ignored", rows: []int64{5}, short: true, open: true, again: true},
		{name: "in hand when sent and when it returned", atSend: true, atReturn: true, short: true, open: true},
		{name: "dropped from hand while it ran", atSend: true, short: true, open: true, again: true},
		{name: "continuation, short, without it", after: 2, short: true, open: true, again: true},
		{name: "continuation, returned and taken", after: 2, rows: []int64{5}, short: true, atReturn: true, open: true},
		{name: "continuation, came back full below it", after: 2, rows: []int64{3, 4}, open: true},
		{name: "continuation starting above it", after: 6, rows: []int64{7}, short: true, open: true, again: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWALTracker()
			known := walKnown()
			if !tc.sentBefore {
				w.add(walBatch(walTx(100, 5)), 10, in(known))
			}
			if tc.atSend {
				known[5] = inHand{}
			}
			var exclude []int64
			if tc.after == 0 {
				exclude = slices.Collect(func(yield func(int64) bool) {
					for seq := range known {
						yield(seq)
					}
				})
			}
			f := w.sent(tc.after, exclude)
			if tc.sentBefore {
				w.add(walBatch(walTx(100, 5)), 10, in(known))
			}
			delete(known, 5)
			if tc.atReturn {
				known[5] = inHand{}
			}
			again := w.fetched(f, walRows(tc.rows...), tc.short, in(known))
			if w.isOpen(5) != tc.open || again != tc.again {
				t.Fatalf("open %v, again %v; want open %v, again %v", w.isOpen(5), again, tc.open, tc.again)
			}
			if ack := w.ackable(); (ack == 100) == tc.open {
				t.Fatalf("ackable = %d with 5 open %v", ack, tc.open)
			}
		})
	}
}

func TestWALTrackerSettled(t *testing.T) {
	t.Run("an unknown seq is harmless", func(t *testing.T) {
		w := newWALTracker()
		if w.settled(99, w.gen) {
			t.Fatal("settled an unknown seq in an empty tracker: again")
		}
		w.add(walBatch(walTx(100, 1)), 0, in(nil))
		if w.settled(99, w.gen) || !w.isOpen(1) || w.ackable() != 0 {
			t.Fatal("settling an unknown seq changed the tracker")
		}
		if txns, seqs := w.unresolved(); txns != 1 || seqs != 1 {
			t.Fatalf("unresolved = %d, %d; want 1, 1", txns, seqs)
		}
		w.settled(1, w.gen)
		if w.settled(1, w.gen) || w.ackable() != 100 {
			t.Fatal("settling a seq twice")
		}
	})
	t.Run("a record sent before the transaction arrived", func(t *testing.T) {
		// The commit of 5 arrives late, after 5 was fetched and its record sent: the
		// record may predate it (nothing tells a late first insert from a replay), so a
		// full fetch must look.
		w := newWALTracker()
		sentAt := w.gen
		w.add(walBatch(walTx(100, 5)), 10, in(walKnown(5)))
		if !w.settled(5, sentAt) || !w.isOpen(5) || w.ackable() != 0 {
			t.Fatal("a record sent before the transaction arrived resolved it")
		}
		if walFull(w, true) || w.ackable() != 100 {
			t.Fatal("a full fetch after the record did not resolve it")
		}
	})
}

// TestWALTrackerRepeats covers rule (c): a ring move or a replay inserts a seq again.
func TestWALTrackerRepeats(t *testing.T) {
	t.Run("a move while the row is in hand resolves with its record", func(t *testing.T) {
		w := newWALTracker()
		w.add(walBatch(walTx(100, 5)), 10, in(walKnown(5)))
		if got := w.add(walBatch(walTx(200, 5)), 10, in(walKnown(5))); got != walWantNothing {
			t.Fatalf("a move of a row in hand wants %d", got)
		}
		if _, seqs := w.unresolved(); seqs != 2 {
			t.Fatalf("%d seqs unresolved, want 2 (two occurrences)", seqs)
		}
		if w.settled(5, w.gen) || w.isOpen(5) || w.ackable() != 200 {
			t.Fatal("the row's record did not resolve its move")
		}
	})
	t.Run("a repeat that arrived after the record was sent", func(t *testing.T) {
		w := newWALTracker()
		w.add(walBatch(walTx(100, 5)), 10, in(walKnown(5)))
		sentAt := w.gen
		w.add(walBatch(walTx(200, 5)), 10, in(walKnown(5))) // perhaps the replay of a dead letter just recorded
		if !w.settled(5, sentAt) {
			t.Fatal("settled does not ask for a full fetch")
		}
		if !w.isOpen(5) || w.ackable() != 100 {
			t.Fatalf("the repeat was resolved by an older record: ackable %d", w.ackable())
		}
		if walFull(w, true) || w.ackable() != 200 {
			t.Fatal("a full fetch after the repeat did not resolve it")
		}
	})
	t.Run("a repeat that arrived while a full fetch ran", func(t *testing.T) {
		w := newWALTracker()
		w.add(walBatch(walTx(100, 5)), 10, in(nil))
		f := w.sent(0, nil)
		if got := w.add(walBatch(walTx(200, 5)), 10, in(nil)); got != walWantFull {
			t.Fatalf("a repeat below the cursor wants %d", got)
		}
		if w.fetched(f, nil, true, in(nil)) || w.ackable() != 100 || !w.isOpen(5) {
			t.Fatalf("after the older fetch: ackable %d, open %v", w.ackable(), w.isOpen(5))
		}
		if walFull(w, true) || w.ackable() != 200 {
			t.Fatal("the full fetch the repeat asked for did not resolve it")
		}
	})
	t.Run("a seq twice in one transaction is one row", func(t *testing.T) {
		w := newWALTracker()
		w.add(walBatch(walTx(100, 5, 5)), 10, in(nil))
		if _, seqs := w.unresolved(); seqs != 1 {
			t.Fatalf("%d seqs unresolved, want 1", seqs)
		}
		w.settled(5, w.gen)
		if w.ackable() != 100 {
			t.Fatal("not resolved")
		}
	})
}

// TestWALTrackerBulk covers rule (d): a bulk transaction is handed to polling, and
// resolved by a full fetch, sent after it arrived, that reached its highest seq.
func TestWALTrackerBulk(t *testing.T) {
	const hi = 2_000_000
	w := newWALTracker()
	before := w.sent(0, nil)
	if got := w.add(walBatch(walTx(100, 1), walBulk(200, 2, hi), walTx(300, hi+1)), 0, in(nil)); got != walWantFull {
		t.Fatalf("a bulk transaction wants %d", got)
	}
	if txns, seqs := w.unresolved(); txns != 3 || seqs != 2 {
		t.Fatalf("unresolved = %d transactions, %d seqs; want 3, 2 (a bulk one holds no seqs)", txns, seqs)
	}
	if w.fetched(before, nil, true, in(nil)) {
		t.Fatal("a fetch sent before the bulk transaction arrived asks for more")
	}
	if w.ackable() != 0 {
		t.Fatal("a fetch sent before the transactions arrived resolved them")
	}
	w.settled(1, w.gen)
	if w.ackable() != 100 {
		t.Fatal("T1 not resolved")
	}
	if !w.fetched(w.sent(500, nil), walRows(501, 502), false, in(walKnown(501, 502))) || w.ackable() != 100 {
		t.Fatal("a continuation resolved the bulk transaction, or did not ask for a full fetch")
	}
	if !w.fetched(w.sent(0, nil), walRows(2, 3), false, in(walKnown(2, 3))) || w.ackable() != 100 {
		t.Fatal("a full fetch that stopped below the bulk transaction's end resolved it, or did not ask for another")
	}
	if w.fetched(w.sent(0, nil), walRows(hi), false, in(nil)) || w.ackable() != 200 {
		t.Fatalf("a full fetch past the bulk transaction: ackable %d", w.ackable())
	}
	if txns, seqs := w.unresolved(); txns != 1 || seqs != 1 {
		t.Fatalf("unresolved = %d, %d; want 1, 1", txns, seqs)
	}
}

// TestWALTrackerModel drives the tracker with random events and checks it against
// walModel, the rules written out plainly: every event kept, every occurrence's
// resolution decided from scratch.
func TestWALTrackerModel(t *testing.T) {
	const seqs = 12 // few, so that seqs repeat
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 13))
		w, m := newWALTracker(), &walModel{}
		known := map[int64]inHand{}
		knownSet := func() map[int64]bool {
			out := make(map[int64]bool, len(known))
			for seq := range known {
				out[seq] = true
			}
			return out
		}
		var (
			end      uint64
			fetching bool
			f        walFetch
			mf       walModelFetch
			recordAt uint64 // gen when the current record of outcomes was sent
		)
		for step := range 400 {
			fail := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("seed %d, step %d: "+format, append([]any{seed, step}, args...)...)
			}
			switch op := rng.IntN(10); {
			case op < 3: // a stream batch
				var b outboxdriver.StreamBatch
				for range rng.IntN(3) {
					if rng.IntN(10) == 0 && end > 20 {
						b.Txns = append(b.Txns, walTx(end-uint64(rng.IntN(20)), 1)) // redelivered
						continue
					}
					end += 10
					if rng.IntN(15) == 0 {
						lo := 1 + rng.Int64N(seqs)
						b.Txns = append(b.Txns, walBulk(end, lo, lo+rng.Int64N(seqs)))
						continue
					}
					var tx []int64
					for range rng.IntN(4) {
						tx = append(tx, 1+rng.Int64N(seqs))
					}
					b.Txns = append(b.Txns, walTx(end, tx...))
				}
				if rng.IntN(3) == 0 {
					b.Idle = end + uint64(rng.IntN(3))*3
					if rng.IntN(4) == 0 && end > 20 {
						b.Idle = end - 15 // from before a transaction already added
					}
				}
				cursor := rng.Int64N(seqs + 1)
				want := m.add(b, cursor, knownSet())
				if got := w.add(b, cursor, in(known)); got != want {
					fail("add = %d, model %d", got, want)
				}
			case op < 5 && !fetching: // send a fetch
				fetching = true
				var after int64
				var exclude []int64
				if rng.IntN(2) == 0 {
					after = 1 + rng.Int64N(seqs)
				} else {
					for seq := range known {
						exclude = append(exclude, seq)
					}
				}
				f = w.sent(after, exclude)
				mf = walModelFetch{gen: m.gen, full: after == 0, excluded: knownSet()}
			case op < 5: // the fetch returns
				fetching = false
				var rows []int64
				for seq := int64(1); seq <= seqs; seq++ {
					if rng.IntN(4) == 0 && (f.after == 0 && !mf.excluded[seq] || f.after > 0 && seq > f.after) {
						rows = append(rows, seq)
						if _, ok := known[seq]; !ok && rng.IntN(3) > 0 {
							known[seq] = inHand{} // taken; the others ignored
						}
					}
				}
				mf.short = rng.IntN(2) == 0
				mf.top = slices.Max(append([]int64{0}, rows...))
				mf.returned = map[int64]bool{}
				for _, seq := range rows {
					mf.returned[seq] = true
				}
				mf.known = knownSet()
				want := m.fetched(mf)
				if got := w.fetched(f, walRows(rows...), mf.short, in(known)); got != want {
					fail("fetched = %v, model %v", got, want)
				}
			case op < 7: // an outcome recorded, refused or dropped as stale
				seq := 1 + rng.Int64N(seqs)
				if rng.IntN(2) == 0 {
					recordAt = w.gen // a new record sent
				}
				delete(known, seq)
				want := m.settled(seq, recordAt)
				if got := w.settled(seq, recordAt); got != want {
					fail("settled(%d) = %v, model %v", seq, got, want)
				}
			case op < 8: // dropped from hand unsent
				delete(known, 1+rng.Int64N(seqs))
			default: // the loop checks after each event; nothing else happens
			}
			if got, want := w.ackable(), m.ack(); got != want {
				fail("ackable = %d, model %d", got, want)
			}
			gotTxns, gotSeqs := w.unresolved()
			if wantTxns, wantSeqs := m.unresolved(); gotTxns != wantTxns || gotSeqs != wantSeqs {
				fail("unresolved = %d, %d; model %d, %d", gotTxns, gotSeqs, wantTxns, wantSeqs)
			}
			for seq := int64(1); seq <= seqs; seq++ {
				if w.isOpen(seq) != m.isOpen(seq) {
					fail("isOpen(%d) = %v, model %v", seq, w.isOpen(seq), m.isOpen(seq))
				}
			}
		}
	}
}

// walModel is section 2's rules written out plainly. It keeps every transaction and
// every event, and decides each occurrence of a seq from scratch.
type walModel struct {
	gen     uint64
	txns    []walModelTxn
	fetches []walModelFetch
	records []walModelRecord
	lastEnd uint64
	idle    uint64
	acked   uint64
}

type walModelTxn struct {
	end, gen uint64
	seqs     []int64 // each once
	bulk     bool
	hi       int64
}

type walModelFetch struct {
	gen         uint64 // transactions added up to gen had arrived when it was sent
	full, short bool
	top         int64
	returned    map[int64]bool
	excluded    map[int64]bool // in hand when sent
	known       map[int64]bool // in hand when it returned
}

type walModelRecord struct {
	seq int64
	gen uint64
}

func (m *walModel) add(b outboxdriver.StreamBatch, cursor int64, known map[int64]bool) walWant {
	m.gen++
	want := walWantNothing
	for _, st := range b.Txns {
		if st.End <= m.lastEnd {
			continue
		}
		m.lastEnd = st.End
		x := walModelTxn{end: st.End, gen: m.gen, bulk: st.Bulk, hi: st.Hi}
		if st.Bulk {
			want = walWantFull
		}
		for _, seq := range st.Seqs {
			if slices.Contains(x.seqs, seq) {
				continue
			}
			x.seqs = append(x.seqs, seq)
			switch {
			case known[seq]:
			case seq <= cursor:
				want = walWantFull
			default:
				want = max(want, walWantMore)
			}
		}
		m.txns = append(m.txns, x)
	}
	m.idle = max(m.idle, b.Idle)
	return want
}

// resolved reports whether x's seq is resolved: (a) a record sent after x arrived, or (b)
// a full fetch sent after x arrived that reached seq and neither returned it nor found it
// in hand.
func (m *walModel) resolved(x walModelTxn, seq int64) bool {
	for _, r := range m.records {
		if r.seq == seq && r.gen >= x.gen {
			return true
		}
	}
	for _, f := range m.fetches {
		if f.full && f.gen >= x.gen && (f.short || seq <= f.top) &&
			!f.returned[seq] && !f.excluded[seq] && !f.known[seq] {
			return true
		}
	}
	return false
}

// txnResolved: every seq resolved, or (d) for a bulk transaction, a full fetch sent after
// it arrived that reached its highest seq.
func (m *walModel) txnResolved(x walModelTxn) bool {
	if x.bulk {
		for _, f := range m.fetches {
			if f.full && f.gen >= x.gen && (f.short || f.top >= x.hi) {
				return true
			}
		}
		return false
	}
	for _, seq := range x.seqs {
		if !m.resolved(x, seq) {
			return false
		}
	}
	return true
}

// ack: the end of the longest resolved prefix; with none unresolved, an idle position
// past every transaction.
func (m *walModel) ack() uint64 {
	ack, all := uint64(0), true
	for _, x := range m.txns {
		if !m.txnResolved(x) {
			all = false
			break
		}
		ack = x.end
	}
	if all && m.idle > m.lastEnd {
		ack = m.idle
	}
	m.acked = max(m.acked, ack)
	return m.acked
}

// fetched keeps f, and says whether a seq it reached is unresolved and not in hand, or a
// bulk transaction it could have covered is unresolved.
func (m *walModel) fetched(f walModelFetch) (again bool) {
	m.fetches = append(m.fetches, f)
	for _, x := range m.txns {
		if x.gen > f.gen {
			continue
		}
		if x.bulk && !m.txnResolved(x) {
			again = true
		}
		for _, seq := range x.seqs {
			if (f.short || seq <= f.top) && !f.known[seq] && !m.resolved(x, seq) {
				again = true
			}
		}
	}
	return again
}

// settled keeps the record, and says whether an occurrence of seq is still unresolved.
func (m *walModel) settled(seq int64, gen uint64) (again bool) {
	m.records = append(m.records, walModelRecord{seq: seq, gen: gen})
	return m.isOpen(seq)
}

func (m *walModel) isOpen(seq int64) bool {
	for _, x := range m.txns {
		if slices.Contains(x.seqs, seq) && !m.resolved(x, seq) {
			return true
		}
	}
	return false
}

func (m *walModel) unresolved() (txns, seqs int) {
	for _, x := range m.txns {
		if !m.txnResolved(x) {
			txns++
		}
		for _, seq := range x.seqs {
			if !m.resolved(x, seq) {
				seqs++
			}
		}
	}
	return txns, seqs
}

// TestWALTrackerSnapshot: a full fetch counts as having read a transaction only if its
// snapshot saw the transaction finished. The walsender may send a commit before the
// committing session leaves the proc array, and a fetch sent at once can miss its rows.
func TestWALTrackerSnapshot(t *testing.T) {
	const epoch = uint64(7) << 32
	running := &outboxdriver.Snapshot{Xmin: epoch + 40, Xmax: epoch + 60, Xip: []uint64{epoch + 50}}
	done := &outboxdriver.Snapshot{Xmin: epoch + 61, Xmax: epoch + 61}
	for _, bulk := range []bool{false, true} {
		w := newWALTracker()
		tx := outboxdriver.StreamTxn{End: 100, Xid: 50, Seqs: []int64{5}}
		if bulk {
			tx = outboxdriver.StreamTxn{End: 100, Xid: 50, Bulk: true, Lo: 5, Hi: 5}
		}
		w.add(walBatch(tx), 0, in(nil))
		f := w.sent(0, nil)
		f.snap = running
		if again := w.fetched(f, nil, true, in(nil)); !again || w.ackable() != 0 {
			t.Fatalf("bulk %v: a fetch whose snapshot saw the transaction running: again %v, ack %d; want again, no ack", bulk, again, w.ackable())
		}
		f = w.sent(0, nil)
		f.snap = done
		if again := w.fetched(f, nil, true, in(nil)); again || w.ackable() != 100 {
			t.Fatalf("bulk %v: a fetch whose snapshot saw it finished: again %v, ack %d; want no again, ack 100", bulk, again, w.ackable())
		}
	}
}

// TestWALTrackerCompacts: once a backlog's seqs are resolved, the map of open seqs is made
// anew, small, and what is still open stays open.
func TestWALTrackerCompacts(t *testing.T) {
	w := newWALTracker()
	const n = 10 * compactMin
	var txns []outboxdriver.StreamTxn
	for i := int64(1); i <= n; i++ {
		txns = append(txns, walTx(uint64(100*i), i))
	}
	w.add(walBatch(txns...), 0, in(nil))
	if w.peak != n {
		t.Fatalf("peak = %d after %d seqs; want %d", w.peak, n, n)
	}
	for seq := int64(1); seq < n; seq++ { // all but the last
		w.settled(seq, w.gen)
	}
	if w.peak >= compactMin || len(w.open) != 1 || !w.isOpen(n) {
		t.Fatalf("after settling all but one: peak %d, %d open (open %d: %v); want a map made anew with %d in it", w.peak, len(w.open), n, w.isOpen(n), n)
	}
	if w.ackable() != uint64(100*(n-1)) {
		t.Fatalf("ackable %d; want the end of the last transaction resolved, %d", w.ackable(), 100*(n-1))
	}
	w.settled(n, w.gen)
	if w.ackable() != uint64(100*n) {
		t.Fatalf("ackable %d after the last; want %d", w.ackable(), 100*n)
	}
}

// in is the tracker's view of a hand holding known (nil: an empty hand).
func in(known map[int64]inHand) func(seq int64) bool {
	return func(seq int64) bool {
		_, ok := known[seq]
		return ok
	}
}
