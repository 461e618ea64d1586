package outbox

import (
	"slices"
	"testing"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// logRow is a fresh row as the stream brings it.
func logRow(seq int64, key string) *Message {
	return &Message{Seq: seq, Key: key, Topic: "t", Payload: []byte("p")}
}

// logTxn is a transaction ending at end with rows.
func logTxn(end uint64, rows ...*Message) outboxdriver.StreamTxn {
	x := outboxdriver.StreamTxn{End: end, Rows: rows}
	for _, m := range rows {
		x.Seqs = append(x.Seqs, m.Seq)
	}
	return x
}

// onLog returns a log path on since arming at from, with waiting as the rows that wait.
func onLog(t *testing.T, from uint64, waiting ...outboxdriver.WaitingRow) *walLog {
	t.Helper()
	g := newWALLog()
	gen := g.arm()
	g.fetchSent(true)
	g.fetched(nil, true)
	g.waitsRead(gen, waiting, from, true)
	if !g.on() {
		t.Fatal("the log path is not on after its catch-up")
	}
	return g
}

// takeSeqs runs take on txns with an admit that takes every message but those of
// refused, and returns the seqs taken.
func takeSeqs(g *walLog, refused map[int64]bool, txns ...outboxdriver.StreamTxn) (taken []int64, rearm bool) {
	_, rearm = g.take(outboxdriver.StreamBatch{Txns: txns}, func(m *Message) bool {
		if refused[m.Seq] {
			return false
		}
		taken = append(taken, m.Seq)
		return true
	})
	return taken, rearm
}

func TestWALLogTakes(t *testing.T) {
	delayed := logRow(5, "d")
	delayed.DeliverAt = time.Unix(1e9, 0)
	retried := logRow(6, "r")
	retried.Attempts = 1
	failed := logRow(7, "f")
	failed.LastError = "boom"
	for _, tc := range []struct {
		name    string
		g       func(t *testing.T) *walLog
		refused map[int64]bool
		txns    []outboxdriver.StreamTxn
		want    []int64
		rearm   bool
	}{
		{name: "fresh rows of clear keys, after arming: taken in stream order",
			g:    func(t *testing.T) *walLog { return onLog(t, 100) },
			txns: []outboxdriver.StreamTxn{logTxn(200, logRow(1, "a"), logRow(2, "b")), logTxn(300, logRow(3, "a"), logRow(4, ""))},
			want: []int64{1, 2, 3, 4}},
		{name: "off: nothing",
			g:    func(*testing.T) *walLog { return newWALLog() },
			txns: []outboxdriver.StreamTxn{logTxn(200, logRow(1, "a"))}},
		{name: "arming: nothing, until the catch-up",
			g:    func(*testing.T) *walLog { g := newWALLog(); g.arm(); return g },
			txns: []outboxdriver.StreamTxn{logTxn(200, logRow(1, "a"))}},
		{name: "a transaction ending at or before the arming position: left to the fetch path",
			g:    func(t *testing.T) *walLog { return onLog(t, 100) },
			txns: []outboxdriver.StreamTxn{logTxn(100, logRow(1, "a")), logTxn(200, logRow(2, "b"))},
			want: []int64{2}},
		{name: "not fresh (delayed, retried, failed): left, and their keys' later rows too",
			g: func(t *testing.T) *walLog { return onLog(t, 100) },
			txns: []outboxdriver.StreamTxn{logTxn(200, delayed, retried, failed),
				logTxn(300, logRow(8, "d"), logRow(9, "r"), logRow(10, "f"), logRow(11, "x"))},
			want: []int64{11}},
		{name: "a seq announced before: left (a move, a replay); one never seen below it: taken (concurrent writers)",
			g:    func(t *testing.T) *walLog { return onLog(t, 100) },
			txns: []outboxdriver.StreamTxn{logTxn(200, logRow(10, "a")), logTxn(300, logRow(9, "b"), logRow(10, "c"), logRow(11, "d"))},
			want: []int64{10, 9, 11}},
		{name: "a seq at or below the highest the catch-up read: left (a late commit against it)",
			g: func(t *testing.T) *walLog {
				g := newWALLog()
				gen := g.arm()
				g.fetchSent(true)
				g.fetched([]*Message{logRow(50, "z")}, true)
				g.waitsRead(gen, nil, 100, true)
				return g
			},
			txns: []outboxdriver.StreamTxn{logTxn(200, logRow(40, "a"), logRow(60, "b"))},
			want: []int64{60}},
		{name: "a seq a fetch brought before the stream: left",
			g: func(t *testing.T) *walLog {
				g := onLog(t, 100)
				g.fetched([]*Message{logRow(12, "z")}, false)
				return g
			},
			txns: []outboxdriver.StreamTxn{logTxn(200, logRow(11, "a"), logRow(12, "b"), logRow(13, "c"))},
			want: []int64{11, 13}},
		{name: "a key with a row that waits in the table: left; keyless rows are not held",
			g:    func(t *testing.T) *walLog { return onLog(t, 100, outboxdriver.WaitingRow{Seq: 1, Key: "a"}) },
			txns: []outboxdriver.StreamTxn{logTxn(200, logRow(5, "a"), logRow(6, "b"), logRow(7, ""))},
			want: []int64{6, 7}},
		{name: "a row the hand refuses (shard not held, lane failed): its key's later rows left too",
			g:       func(t *testing.T) *walLog { return onLog(t, 100) },
			refused: map[int64]bool{5: true},
			txns:    []outboxdriver.StreamTxn{logTxn(200, logRow(5, "a"), logRow(6, "b")), logTxn(300, logRow(7, "a"), logRow(8, "b"))},
			want:    []int64{6, 8}},
		{name: "keys only (decoded while the log path was off): left, and their keys' later rows too",
			g: func(t *testing.T) *walLog { return onLog(t, 100) },
			txns: []outboxdriver.StreamTxn{{End: 200, Seqs: []int64{1, 2}, Rows: []*Message{{Seq: 1, Key: "a"}, {Seq: 2, Key: "b"}}, KeysOnly: true},
				logTxn(300, logRow(3, "a"), logRow(4, "c"))},
			want: []int64{4}},
		{name: "a transaction without its rows: arms again; what follows it is left",
			g: func(t *testing.T) *walLog { return onLog(t, 100) },
			txns: []outboxdriver.StreamTxn{logTxn(200, logRow(1, "a")), {End: 300, Seqs: []int64{2, 3}, Lo: 2, Hi: 3},
				logTxn(400, logRow(4, "b"))},
			want: []int64{1}, rearm: true},
		{name: "a bulk transaction: arms again",
			g:     func(t *testing.T) *walLog { return onLog(t, 100) },
			txns:  []outboxdriver.StreamTxn{{End: 300, Bulk: true, Lo: 2, Hi: 3}, logTxn(400, logRow(4, "b"))},
			rearm: true},
		{name: "an unreadable row: arms again",
			g:    func(t *testing.T) *walLog { return onLog(t, 100) },
			txns: []outboxdriver.StreamTxn{{End: 300, Seqs: []int64{2, 3}, Rows: []*Message{logRow(2, "a"), nil}}},
			want: []int64{2}, rearm: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := tc.g(t)
			got, rearm := takeSeqs(g, tc.refused, tc.txns...)
			if !slices.Equal(got, tc.want) || rearm != tc.rearm {
				t.Errorf("taken %v, rearm %v; want %v, %v", got, rearm, tc.want, tc.rearm)
			}
		})
	}
}

// A key left to the fetch path is clear again once that row's outcome is recorded.
func TestWALLogSettledClears(t *testing.T) {
	g := onLog(t, 100, outboxdriver.WaitingRow{Seq: 1, Key: "a"}, outboxdriver.WaitingRow{Seq: 2, Key: "a"})
	if got, _ := takeSeqs(g, nil, logTxn(200, logRow(3, "a"))); len(got) != 0 {
		t.Fatalf("taken %v with two rows of the key waiting", got)
	}
	g.settled(1)
	g.settled(2)
	if got, _ := takeSeqs(g, nil, logTxn(300, logRow(4, "a"))); len(got) != 0 {
		t.Fatalf("taken %v with row 3, left to the fetch path, not recorded", got)
	}
	g.settled(3)
	if got, _ := takeSeqs(g, nil, logTxn(350, logRow(6, "b"))); !slices.Equal(got, []int64{6}) {
		t.Fatalf("taken %v; want [6], of another key", got)
	}
	g.settled(3)
	g.settled(4)
	if got, _ := takeSeqs(g, nil, logTxn(400, logRow(7, "a"))); !slices.Equal(got, []int64{7}) {
		t.Fatalf("taken %v, want [7] once every earlier row of the key is recorded", got)
	}
}

// The catch-up counts only a full fetch sent after arming, and the read of the rows that
// wait of the latest arming; a row recorded while that read was out is not counted as
// waiting.
func TestWALLogCatchUp(t *testing.T) {
	g := newWALLog()
	first := g.arm()
	g.fetched(nil, true) // a fetch sent before arming
	g.waitsRead(first, nil, 100, true)
	if g.on() {
		t.Fatal("on without a full fetch sent after arming")
	}
	g.fetchSent(false)
	g.fetched(nil, true)
	if g.on() {
		t.Fatal("on after a continuation")
	}
	second := g.arm()
	g.fetchSent(true)
	g.fetched(nil, true)
	g.waitsRead(first, nil, 100, true)
	if g.on() {
		t.Fatal("on with the read of an earlier arming")
	}
	g.settled(7)
	g.waitsRead(second, []outboxdriver.WaitingRow{{Seq: 7, Key: "a"}, {Seq: 8, Key: "b"}}, 150, true)
	if !g.on() {
		t.Fatal("not on after its catch-up")
	}
	if got, _ := takeSeqs(g, nil, logTxn(150, logRow(9, "c")), logTxn(200, logRow(10, "a"), logRow(11, "b"))); !slices.Equal(got, []int64{10}) {
		t.Errorf("taken %v; want [10]: 9 committed before the read, 7 was recorded while it was out, 8 waits", got)
	}

	g.fetched(nil, false) // a fetch that did not catch up does not turn it off
	if !g.on() {
		t.Fatal("off after a fetch")
	}
	g.arm()
	g.fetchSent(true)
	g.fetched(nil, false) // not caught up: rows announced before are still out of hand
	g.waitsRead(g.gen, nil, 300, true)
	if g.on() {
		t.Fatal("on after a catch-up fetch that left rows out of hand")
	}
	g.waitsRead(g.gen, nil, 300, false)
	if g.state != walLogOff {
		t.Fatal("not off after a failed read of the rows that wait")
	}
}

// Past walWaitsMax rows left to the fetch path, the log path turns off.
func TestWALLogWaitsBounded(t *testing.T) {
	g := onLog(t, 0)
	rows := make([]*Message, walWaitsMax+1)
	for i := range rows {
		rows[i] = logRow(int64(i+1), "k")
		rows[i].Attempts = 1
	}
	takeSeqs(g, nil, logTxn(10, rows...))
	if g.on() || len(g.waits) > walWaitsMax+1 {
		t.Fatalf("state %d with %d waits; want off", g.state, len(g.waits))
	}
}

// A row recorded as published before the stream announced it (a fetch read it first)
// leaves no wait when its announcement comes; a row retried or dead-lettered does, and a
// row published after its announcement leaves nothing behind.
func TestWALLogPublishedAhead(t *testing.T) {
	g := onLog(t, 0)
	g.published([]int64{5})
	retried := logRow(6, "r")
	retried.Attempts = 1 // not taken: left to the fetch path
	if got, _ := takeSeqs(g, map[int64]bool{5: true, 7: true}, logTxn(10, logRow(5, "a"), retried, logRow(7, "b"))); len(got) != 0 {
		t.Fatalf("taken %v; want none", got)
	}
	if g.keys["a"] != 0 || g.keys["r"] != 1 || g.keys["b"] != 1 || len(g.ahead) != 0 {
		t.Fatalf("waits per key %v, ahead %v; want none for a (published), one for r and b", g.keys, g.ahead)
	}
	g.published([]int64{8, 7}) // 7 was announced: nothing kept for it
	if _, ok := g.ahead[7]; ok || len(g.ahead) != 1 {
		t.Fatalf("ahead %v; want 8 alone", g.ahead)
	}
	if got, _ := takeSeqs(g, nil, logTxn(20, logRow(9, "a"))); !slices.Equal(got, []int64{9}) {
		t.Fatalf("taken %v; want [9]: its key holds nothing back", got)
	}
}

// walSeen holds every seq added, and counts those at or below its low mark as seen;
// past walSeenMax seqs above the mark it counts every seq up to the highest as seen.
func TestWALSeen(t *testing.T) {
	s := walSeen{above: map[int64]struct{}{}}
	for _, seq := range []int64{3, 1, 2, 5} {
		s.add(seq)
	}
	if s.low != 3 || len(s.above) != 1 || !s.has(5) || s.has(4) || s.has(6) {
		t.Fatalf("low %d, above %v; want 3 and [5]", s.low, s.above)
	}
	s.add(4)
	if s.low != 5 || len(s.above) != 0 {
		t.Fatalf("low %d, above %v; want 5 and none", s.low, s.above)
	}
	s.add(7) // 6 never comes (a rolled-back write)
	for seq := int64(8); len(s.above) > 0; seq++ {
		s.add(seq)
		if seq > 8+walSeenMax {
			t.Fatal("the seqs above the low mark are not bounded")
		}
	}
	if !s.has(6) || s.low != s.top {
		t.Fatalf("low %d, top %d; want every seq up to the top seen", s.low, s.top)
	}
	top := s.top
	s.add(top + 5)
	s.upTo(top + 2)
	if !s.has(top+2) || s.has(top+3) || s.has(top+4) || !s.has(top+5) {
		t.Fatalf("upTo: low %d, top %d, above %v; want every seq up to %d and %d", s.low, s.top, s.above, top+2, top+5)
	}
}

// A failure recorded during the catch-up starts it again: the read of the rows that wait
// may have run before it, and missed its key's other pending rows. Once on, the failed
// rows wait, holding their keys back.
func TestWALLogFailedDuringCatchUp(t *testing.T) {
	g := newWALLog()
	g.arm()
	g.fetchSent(true)
	if !g.failed([]outboxdriver.WaitingRow{{Seq: 10, Key: "k"}}) {
		t.Fatal("a failure recorded during the catch-up did not start it again")
	}
	if g.failed(nil) {
		t.Fatal("no failure, yet the catch-up starts again")
	}
	g = onLog(t, 100)
	if g.failed([]outboxdriver.WaitingRow{{Seq: 10, Key: "k"}}) || g.keys["k"] != 1 {
		t.Fatalf("on: rearm, or waits per key %v; want no rearm and k waiting", g.keys)
	}
	if got, _ := takeSeqs(g, nil, logTxn(200, logRow(11, "k"), logRow(12, "j"))); !slices.Equal(got, []int64{12}) {
		t.Fatalf("taken %v; want [12]: k waits", got)
	}
}
