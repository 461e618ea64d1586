package outbox

import (
	"github.com/outboxkit/outbox/internal/broken"
	"github.com/outboxkit/outbox/outboxdriver"
)

// walWaitsMax bounds the rows the log path keeps track of as pending in the table without
// it (walLog.waits): past it the log path turns off, and the relay fetches every row, until
// it is armed again.
const walWaitsMax = 100_000

// walLogState is where the log path stands.
type walLogState int

const (
	walLogOff    walLogState = iota // every row goes the fetch path
	walLogArming                    // waiting for the catch-up: a short full fetch sent after arming, and the waiting rows read
	walLogOn                        // fresh rows may be published from the log
)

// walLog decides which rows the WAL stream brought the relay publishes as they are, with
// no fetch: the log path (docs/design-wal.md, §2b). A row the log path does not take goes
// the fetch path, as every row did before it. It does no I/O and reads no clock.
//
// A row r of key k, in a transaction ending at end, is taken when all of these hold:
//  1. the log path is on: since it was armed, a full fetch sent after arming came back
//     short having left no announced row unresolved and out of hand (the catch-up: every
//     row pending then is in hand, or waits), and the rows that wait in the table were
//     read (waitsRead), with from, the log's position at that read;
//  2. end is past from: a transaction that committed before may have been fetched and
//     recorded already, by this relay or the slot's reader before it (a stream opened
//     again starts from the slot's confirmed position, which lags what was recorded);
//  3. r is fresh: never attempted and not delayed (Attempts 0, no LastError, no
//     DeliverAt), so it is due now and no retry of it is in the table;
//  4. r's seq was neither announced nor fetched before (seen): a seq seen is a move or a
//     replay of a row read before, or a row a fetch brought first; every seq at or below
//     the highest one read at the catch-up counts as seen, so a row committed late
//     against those goes the fetch path. A seq above them not seen is a fresh write,
//     perhaps committed after higher seqs, as concurrent writers commit; and the hand's
//     lane of k holds only lower seqs, so r goes to its end;
//  5. k is clear: no row of k pending in the table that the log path did not take is
//     known (waits): a row that waits (read when armed), a row the relay retried, a row
//     announced and left to the fetch path; each stays known until its outcome is
//     recorded;
//  6. r's shard is held and its lane did not fail (the hand's admit and key gate, as for
//     a fetched row); otherwise r is left to the fetch path, and counts as in 5.
//
// A row announced with no key known (a transaction over the stream's budget, or bulk)
// arms the log path again, at the end of the batch: the catch-up then finds the row in
// hand, resolved, or waiting (with the other pending rows of its key).
//
// Order, per key: the stream delivers committed rows in commit order. A taken row r is
// published behind every row of its key the relay holds (4), and no other row of its key
// is pending before it: rows pending when the log path was armed were caught up or wait
// (1, 5), rows announced since were taken before r or are in waits (5), and a row
// committed after r is a late commit, which polling too publishes after r
// (docs/guarantees.md: order holds among messages visible together).
//
// Loss: a taken row is in hand like a fetched one; the tracker resolves its seq only when
// its outcome is recorded, so the slot is never acknowledged past it before, and a relay
// that dies leaves it pending in the table, for the next reader to find (untaken: rule 2).
type walLog struct {
	state walLogState
	gen   uint64 // counts the armings: a read of the rows that wait belongs to one
	from  uint64 // the stream position of the read of the rows that wait (rule 2)
	// The catch-up's halves: a full fetch sent since arming (sent) came back as rule 1
	// says (caught), and the rows that wait were read (read).
	sent, caught, read bool
	seen               walSeen // the seqs announced or fetched (rule 4)

	waits map[int64]string // rows pending in the table that the log path did not take: seq → key
	keys  map[string]int   // the number of waits per key
	// ahead holds the rows recorded as published before the stream announced them (a
	// fetch read them first, as in a catch-up), so that their announcement leaves no wait:
	// a published row is never pending again (only dead letters are replayed, only
	// pending rows are moved). heard is the highest seq the stream announced: a row
	// published at or below it was announced already, or commits late. At walWaitsMax
	// rows ahead is forgotten. A row announced after its record and not found here (a
	// late commit, a row forgotten) waits until the next arming clears the waits.
	ahead map[int64]struct{}
	heard int64
	// While the read of the rows that wait is out, the seqs recorded meanwhile: the read
	// may have seen them pending.
	settledDuringRead map[int64]bool
}

func newWALLog() *walLog {
	return &walLog{waits: map[int64]string{}, keys: map[string]int{}, ahead: map[int64]struct{}{},
		seen: walSeen{above: map[int64]struct{}{}}}
}

// arm turns the log path off until the catch-up, and returns the arming's generation:
// the caller then reads the rows that wait (waitsRead, with it) and sends a full fetch
// (fetchSent).
func (g *walLog) arm() uint64 {
	g.gen++
	g.state, g.sent, g.caught, g.read = walLogArming, false, false, false
	clear(g.waits)
	clear(g.keys)
	g.settledDuringRead = map[int64]bool{}
	return g.gen
}

// off turns the log path off until armed again.
func (g *walLog) off() {
	g.state = walLogOff
	g.settledDuringRead = nil
}

// on reports whether the log path takes rows.
func (g *walLog) on() bool { return g.state == walLogOn }

// fetchSent records a fetch being sent: a full one counts for the catch-up. (The loop
// runs one fetch at a time, so the next fetched is this one's.)
func (g *walLog) fetchSent(full bool) {
	if full && g.state == walLogArming {
		g.sent = true
	}
}

// fetched takes in a fetch's rows; caughtUp says the fetch was full, came back short,
// and left no announced row unresolved and out of hand.
func (g *walLog) fetched(rows []*Message, caughtUp bool) {
	for _, m := range rows {
		g.seen.add(m.Seq)
	}
	if g.state == walLogArming && g.sent && caughtUp {
		g.caught = true
		g.turnOn()
	}
}

// waitsRead takes in the rows of the shards held that wait in the table, and the other
// pending rows of their keys, read for the arming gen, and pos, the stream position
// past every transaction that committed before the read (rule 2); ok false: the read
// failed or found too many, and the log path turns off.
func (g *walLog) waitsRead(gen uint64, rows []outboxdriver.WaitingRow, pos uint64, ok bool) {
	if g.state != walLogArming || gen != g.gen {
		return
	}
	if !ok {
		g.off()
		return
	}
	g.from = pos
	for _, r := range rows {
		if !g.settledDuringRead[r.Seq] {
			g.wait(r.Seq, r.Key)
		}
	}
	g.settledDuringRead = nil
	g.read = true
	g.turnOn()
}

// turnOn turns the log path on once both halves of the catch-up are done.
func (g *walLog) turnOn() {
	if g.state == walLogArming && g.caught && g.read {
		g.state = walLogOn
		g.seen.upTo(g.seen.top)
	}
}

// wait records that the row seq of key is pending in the table and not the log path's.
func (g *walLog) wait(seq int64, key string) {
	if _, ok := g.waits[seq]; ok {
		return
	}
	g.waits[seq] = key
	g.keys[key]++
	if len(g.waits) > walWaitsMax {
		g.off()
	}
}

// settled records that seq's outcome was recorded: it no longer holds its key back.
func (g *walLog) settled(seq int64) {
	if g.settledDuringRead != nil {
		g.settledDuringRead[seq] = true
	}
	key, ok := g.waits[seq]
	if !ok {
		return
	}
	delete(g.waits, seq)
	if g.keys[key]--; g.keys[key] == 0 {
		delete(g.keys, key)
	}
}

// failed takes the rows recorded failures left waiting in the table, with the rows of
// their keys the hand let go of, and reports whether the catch-up must start again:
// during one, the read of the rows that wait may have run before the failure, and so
// missed the other pending rows of those keys that are not in hand (a row announced but
// left to the fetch path before arming cleared the waits, which the catch-up fetch then
// does not return, as it waits behind the failed row).
func (g *walLog) failed(rows []outboxdriver.WaitingRow) (rearm bool) {
	if g.state == walLogArming {
		return len(rows) > 0
	}
	for _, r := range rows {
		g.wait(r.Seq, r.Key)
	}
	return false
}

// published records the rows whose publishing was recorded (and not refused).
func (g *walLog) published(seqs []int64) {
	for _, seq := range seqs {
		if seq <= g.heard {
			continue
		}
		if len(g.ahead) >= walWaitsMax {
			clear(g.ahead)
		}
		g.ahead[seq] = struct{}{}
	}
}

// leftToFetch records that the stream announced the row seq of key and the log path did
// not take it: it waits, unless it was published already.
func (g *walLog) leftToFetch(seq int64, key string) {
	if _, ok := g.ahead[seq]; ok {
		delete(g.ahead, seq)
		return
	}
	g.wait(seq, key)
}

// take brings into hand the rows of b the log path takes, in stream order, and records
// the others as waits. admit brings a message into hand now, as a fetched row, if its
// shard is held, its lane did not fail and holds only lower seqs, and reports whether it
// did; taken counts the rows it brought. A row whose key is not known arms the log path
// again (rearm is then set: the caller starts the catch-up).
func (g *walLog) take(b outboxdriver.StreamBatch, admit func(m *Message) bool) (taken int, rearm bool) {
	for _, x := range b.Txns {
		if x.Bulk || (x.Rows == nil && len(x.Seqs) > 0) {
			rearm = rearm || g.state != walLogOff
			g.seen.upTo(x.Hi)
			g.heard = max(g.heard, x.Hi)
			continue
		}
		for i, seq := range x.Seqs {
			switch m := x.Rows[i]; {
			case m == nil: // unreadable: its key is not known
				rearm = rearm || g.state != walLogOff
			case !x.KeysOnly && !rearm && g.trust(x.End, m) && admit(m):
				taken++
			case g.state != walLogOff: // left to the fetch path (none kept while off: arming clears them)
				g.leftToFetch(seq, m.Key)
			}
			g.seen.add(seq)
			g.heard = max(g.heard, seq)
		}
	}
	return taken, rearm
}

// trust reports whether rules 1-5 let the log path take m, of a transaction ending at end.
func (g *walLog) trust(end uint64, m *Message) bool {
	if broken.Has(broken.WALTrustAll) { // canary: every fresh row, whatever came before
		return m.Attempts == 0 && m.DeliverAt.IsZero()
	}
	return g.state == walLogOn && end > g.from &&
		m.Attempts == 0 && m.LastError == "" && m.DeliverAt.IsZero() &&
		!g.seen.has(m.Seq) && (m.Key == "" || g.keys[m.Key] == 0)
}

// walSeenMax bounds the seqs walSeen keeps above its low mark: past it, every seq up to
// the highest seen counts as seen. A rolled-back write leaves a seq no one will see,
// which holds the low mark back until then.
const walSeenMax = 16_384

// walSeen is a set of seqs: every seq at or below low, and those in above (all higher
// than low and at most top, the highest added).
type walSeen struct {
	low, top int64
	above    map[int64]struct{}
}

func (s *walSeen) has(seq int64) bool {
	if seq <= s.low {
		return true
	}
	_, ok := s.above[seq]
	return ok
}

func (s *walSeen) add(seq int64) {
	if seq <= s.low {
		return
	}
	s.top = max(s.top, seq)
	if seq != s.low+1 {
		s.above[seq] = struct{}{}
		if len(s.above) > walSeenMax {
			s.upTo(s.top)
		}
		return
	}
	s.low = seq
	for {
		if _, ok := s.above[s.low+1]; !ok {
			return
		}
		delete(s.above, s.low+1)
		s.low++
	}
}

// upTo adds every seq at or below seq.
func (s *walSeen) upTo(seq int64) {
	if seq <= s.low {
		return
	}
	s.low, s.top = seq, max(s.top, seq)
	if seq == s.top {
		clear(s.above)
		return
	}
	for k := range s.above {
		if k <= seq {
			delete(s.above, k)
		}
	}
}
