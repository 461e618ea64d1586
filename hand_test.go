package outbox

import (
	"slices"
	"testing"
)

func handMsg(seq int64, shard int, key string) *Message {
	return &Message{Seq: seq, Shard: shard, Key: key}
}

// admitAll admits every row under token 7.
func admitAll(*Message) (int64, bool) { return 7, true }

func always(int) bool { return true }

// seqsOf returns the seqs of items.
func seqsOf(items []*item) []int64 {
	var out []int64
	for _, it := range items {
		out = append(out, it.m.Seq)
	}
	return out
}

// fill brings msgs into h as one fetch.
func fill(h *hand, msgs ...*Message) {
	h.fetchStarted()
	h.fetched(msgs, admitAll)
}

func TestHandFetchedAdmits(t *testing.T) {
	tests := []struct {
		name  string
		setup func(h *hand) // runs while the fetch is running
		admit func(*Message) (int64, bool)
		rows  []*Message
		want  []int64 // seqs in hand afterwards, sorted
	}{
		{
			name: "new rows",
			rows: []*Message{handMsg(1, 0, "a"), handMsg(2, 0, "a"), handMsg(3, 1, "b")},
			want: []int64{1, 2, 3},
		},
		{
			name:  "rows the lease no longer covers",
			admit: func(m *Message) (int64, bool) { return 7, m.Shard != 1 },
			rows:  []*Message{handMsg(1, 0, "a"), handMsg(3, 1, "b")},
			want:  []int64{1},
		},
		{
			name: "a row already in hand is not taken twice",
			setup: func(h *hand) {
				h.fetched([]*Message{handMsg(1, 0, "a")}, admitAll)
				h.fetchStarted()
			},
			rows: []*Message{handMsg(1, 0, "a"), handMsg(2, 0, "a")},
			want: []int64{1, 2},
		},
		{
			name: "a row recorded while the fetch ran",
			setup: func(h *hand) {
				h.fetched([]*Message{handMsg(1, 0, "a")}, admitAll)
				h.fetchStarted()
				h.settle(1)
			},
			rows: []*Message{handMsg(1, 0, "a"), handMsg(2, 0, "a")},
			want: []int64{2},
		},
		{
			name: "a key dropped unsent while the fetch ran",
			setup: func(h *hand) {
				h.fetched([]*Message{handMsg(1, 0, "a")}, admitAll)
				h.fetchStarted()
				h.dropUnsent(func(*lane) bool { return true })
			},
			rows: []*Message{handMsg(2, 0, "a"), handMsg(3, 0, "b")},
			want: []int64{3},
		},
		{
			name: "a key whose failure is not yet recorded",
			setup: func(h *hand) {
				h.fetched([]*Message{handMsg(1, 0, "a"), handMsg(2, 0, "a")}, admitAll)
				h.rejected(h.takeReady(1, always)[0])
				h.fetchStarted()
			},
			rows: []*Message{handMsg(2, 0, "a"), handMsg(5, 0, "a"), handMsg(6, 0, "b")},
			want: []int64{1, 2, 6}, // 2 was dropped from the lane but stays known until the failure is recorded
		},
		{
			name: "a key whose failure was recorded while the fetch ran",
			setup: func(h *hand) {
				h.fetched([]*Message{handMsg(1, 0, "a")}, admitAll)
				ln := h.rejected(h.takeReady(1, always)[0])
				h.fetchStarted()
				h.settle(1)
				h.failureRecorded([]*lane{ln})
			},
			rows: []*Message{handMsg(4, 0, "a"), handMsg(6, 0, "b")},
			want: []int64{6},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHand()
			h.fetchStarted()
			if tc.setup != nil {
				tc.setup(h)
			}
			admit := tc.admit
			if admit == nil {
				admit = admitAll
			}
			h.fetched(tc.rows, admit)
			got := h.seqs()
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("in hand %v, want %v", got, tc.want)
			}
			if h.fetching || len(h.taint) > 0 || len(h.settled) > 0 {
				t.Fatalf("fetch state left behind: fetching %v, taint %v, settled %v", h.fetching, h.taint, h.settled)
			}
			perShard := 0
			for _, n := range h.perShard {
				perShard += n
			}
			if perShard != h.size() {
				t.Fatalf("perShard counts %d messages, known %d", perShard, h.size())
			}
		})
	}
}

func TestHandOneHeadPerKeyInOrder(t *testing.T) {
	h := newHand()
	fill(h, handMsg(1, 0, "a"), handMsg(2, 1, "b"), handMsg(3, 0, "a"), handMsg(4, 0, ""), handMsg(5, 0, ""))
	first := h.takeReady(10, always)
	if got := seqsOf(first); !slices.Equal(got, []int64{1, 2, 4, 5}) {
		t.Fatalf("first batch %v, want the heads 1, 2 and the keyless 4, 5", got)
	}
	if got := h.takeReady(10, always); len(got) != 0 {
		t.Fatalf("second batch %v while every head is in flight", seqsOf(got))
	}
	h.confirmed(first[0], always) // a's head: 3 comes next
	if got := seqsOf(h.takeReady(10, always)); !slices.Equal(got, []int64{3}) {
		t.Fatalf("after a's head was confirmed: %v, want [3]", got)
	}
	if h.size() != 5 {
		t.Fatalf("%d in hand, want 5: confirmed messages stay until recorded", h.size())
	}
	for _, seq := range []int64{1, 2, 3, 4, 5} {
		h.settle(seq)
	}
	if h.size() != 0 || len(h.perShard) != 0 {
		t.Fatalf("after every outcome was recorded: %d in hand, perShard %v", h.size(), h.perShard)
	}
}

func TestHandTakeReadyLimitAndSendable(t *testing.T) {
	h := newHand()
	fill(h, handMsg(1, 0, "a"), handMsg(2, 1, "b"), handMsg(3, 0, "c"), handMsg(4, 0, "d"))
	notShard1 := func(s int) bool { return s != 1 }
	if got := seqsOf(h.takeReady(2, notShard1)); !slices.Equal(got, []int64{1, 3}) {
		t.Fatalf("batch of 2 without shard 1: %v, want [1 3]", got)
	}
	if got := seqsOf(h.takeReady(2, notShard1)); !slices.Equal(got, []int64{4}) {
		t.Fatalf("next batch: %v, want [4]: b was passed over and left ready", got)
	}
	if got := h.takeReady(2, always); len(got) != 0 {
		t.Fatalf("b sent %v before a lease round re-queued it", seqsOf(got))
	}
	h.requeue(always)
	if got := seqsOf(h.takeReady(2, always)); !slices.Equal(got, []int64{2}) {
		t.Fatalf("after requeue: %v, want [2]", got)
	}
}

func TestHandRejectedHoldsTheKey(t *testing.T) {
	h := newHand()
	fill(h, handMsg(1, 0, "a"), handMsg(2, 0, "a"), handMsg(3, 0, "a"))
	ln := h.rejected(h.takeReady(1, always)[0])
	if !ln.failed || len(ln.queue) != 1 || !slices.Equal(ln.dropped, []int64{2, 3}) {
		t.Fatalf("failed lane: failed %v, queue %d, dropped %v", ln.failed, len(ln.queue), ln.dropped)
	}
	if got := h.takeReady(10, always); len(got) != 0 {
		t.Fatalf("a failed lane sent %v", seqsOf(got))
	}
	fill(h, handMsg(4, 0, "a"))
	if h.size() != 3 {
		t.Fatalf("%d in hand, want 3: a row of a failed key was admitted", h.size())
	}
	h.settle(1)
	h.failureRecorded([]*lane{ln})
	if h.size() != 0 || len(h.lanes) != 0 {
		t.Fatalf("after the failure was recorded: %d in hand, %d lanes", h.size(), len(h.lanes))
	}
	fill(h, handMsg(2, 0, "a"))
	if got := seqsOf(h.takeReady(1, always)); !slices.Equal(got, []int64{2}) {
		t.Fatalf("after the failure was recorded the key's next row: %v, want [2]", got)
	}
}

func TestHandDropKeepsTheHeadInFlight(t *testing.T) {
	h := newHand()
	fill(h, handMsg(1, 0, "a"), handMsg(2, 0, "a"), handMsg(3, 1, "b"))
	head := h.takeReady(1, always)[0]
	h.dropUnsent(func(ln *lane) bool { return ln.shard == 0 })
	if got := h.seqs(); !slices.Contains(got, 1) || slices.Contains(got, 2) || !slices.Contains(got, 3) {
		t.Fatalf("after dropping shard 0: in hand %v, want 1 (in flight) and 3", got)
	}
	h.confirmed(head, always)
	if _, ok := h.lanes["a"]; ok {
		t.Fatal("lane a kept after its in-flight head was confirmed and the rest dropped")
	}
	// An outage puts the head back; with its shard no longer sendable it is dropped.
	b := h.takeReady(1, always)[0]
	h.unsent(b, func(int) bool { return false })
	if h.idle(1) != true {
		t.Fatalf("shard 1 still has %d in hand after its lane was dropped", h.perShard[1])
	}
}

// A row from the WAL stream joins the end of its key's lane, and only there: not twice,
// not behind a higher seq, not into a failed lane, not while the running fetch saw its key
// released.
func TestHandStreamed(t *testing.T) {
	h := newHand()
	fill(h, handMsg(5, 0, "a"))
	for _, tc := range []struct {
		m    *Message
		want bool
	}{
		{handMsg(5, 0, "a"), false}, // in hand
		{handMsg(4, 0, "a"), false}, // below the lane's last seq
		{handMsg(6, 0, "a"), true},
		{handMsg(3, 1, "b"), true}, // a lane of its own
		{handMsg(2, 1, ""), true},  // keyless
	} {
		if got := h.streamed(tc.m, 7); got != tc.want {
			t.Errorf("streamed(%d, %q) = %v, want %v", tc.m.Seq, tc.m.Key, got, tc.want)
		}
	}
	if got := seqsOf(h.takeReady(10, always)); !slices.Equal(got, []int64{5, 3, 2}) {
		t.Fatalf("heads %v, want [5 3 2]", got)
	}
	h.rejected(h.lanes["a"].queue[0])
	if h.streamed(handMsg(7, 0, "a"), 7) {
		t.Error("a row joined a failed lane")
	}
	if !h.streamed(handMsg(4, 1, "b"), 7) {
		t.Fatal("a row did not join its lane behind the head in flight")
	}
	h.fetchStarted()
	h.dropUnsent(func(ln *lane) bool { return ln.key == "b" }) // 4, unsent
	if h.streamed(handMsg(8, 1, "b"), 7) {
		t.Error("a row joined a key released while a fetch ran")
	}
}
