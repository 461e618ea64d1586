package outbox

import (
	"strconv"

	"github.com/outboxkit/outbox/internal/broken"
)

// hand is what a relay holds of the messages it is publishing, from the moment a fetch
// returns them until their outcome is recorded: one lane per key, the lanes whose head
// may be sent (ready), and every message in hand by seq. It is the key gate: one message
// per key in flight, and no row of a key admitted while the relay cannot tell whether it
// would overtake an older one. It does no I/O and reads no clock: whether a shard may be
// sent now is the loop's to say (sendable).
//
// Invariants, kept by these methods:
//   - every message in a lane's queue is in known, its shard counted once in perShard; it
//     leaves known when its outcome is recorded (settle), when it is dropped unsent
//     (dropLane), or, if its failed head's failure recorded, as one of the lane's dropped;
//   - a lane's queue holds its key's messages in seq order, and only its head is ever in
//     flight (lane.inFlight); a lane with a head in flight is not removed;
//   - a lane is in ready or urgent (ready lanes whose head has a priority, sent first)
//     at most once (lane.queued); both may hold lanes no longer sendable, emptied or
//     replaced, and takeReady skips them;
//   - a failed lane holds only its head, whose failure is being recorded, and the seqs it
//     dropped (still in known); no row of its key is admitted until failureRecorded.
//
// Why a fetch never brings into hand a message the relay must not send:
//   - every message in hand (queued, in flight, or whose outcome is being recorded) is in
//     known, and rows of known are ignored when a fetch returns; a message leaves known
//     only after its outcome is recorded, and a fetch running at that moment may have
//     read it as still pending (a continuation does not exclude known: it starts above
//     the cursor, and messages in hand can lie above a cursor that a full fetch moved
//     down), so its seq is kept in settled and ignored in that fetch's rows too;
//   - a rejected message's key is held back in the store only once the failure is
//     recorded. Rows of that key a fetch returns are ignored until then (lane.failed),
//     and a fetch already running when the failure is recorded may predate it: its rows
//     of that key are ignored too (taint);
//   - a message dropped from hand unsent (its shard lost or draining, or its leases
//     lapsed locally) was excluded, as in hand, by a fetch running at that moment, which
//     may return its key's later messages: that fetch's rows of the key are ignored too
//     (taint), and the next full fetch returns the key from the dropped message on.
type hand struct {
	lanes    map[string]*lane
	ready    []*lane
	urgent   []*lane          // ready lanes whose head has a priority, sent first
	known    map[int64]inHand // every message in hand (queued, in flight, awaiting record) by seq
	perShard map[int]int      // messages in hand per shard
	prio     int              // messages in hand with a priority

	fetching bool
	taint    map[string]bool // keys released while a fetch ran
	settled  map[int64]bool  // seqs whose outcome was recorded while a fetch ran
	drops    int             // messages dropped unrecorded so far: a fetch must find them again
}

// inHand is what the hand keeps of a message besides the message itself.
type inHand struct {
	shard   int
	key     string
	prio    bool // it has a priority
	fromLog bool // it came from the WAL stream (streamed), not a fetch
}

type item struct {
	m     *Message
	token int64 // lease token of m's shard when m was fetched
	// dest is m's destination, with a Router of several (routed: looked up).
	dest   string
	routed bool
}

type lane struct {
	key      string
	shard    int
	queue    []*item // queue[0] is the head; it is in flight when inFlight is set
	inFlight bool
	queued   bool // in hand.ready
	// failed is set when the head was rejected: the rest of the queue was dropped and
	// rows of this key that a fetch returns are ignored until the failure is recorded,
	// after which the store blocks the key until the retry is due.
	failed  bool
	dropped []int64
}

func newHand() *hand {
	return &hand{lanes: map[string]*lane{}, known: map[int64]inHand{}, perShard: map[int]int{},
		taint: map[string]bool{}, settled: map[int64]bool{}}
}

// laneKey is the lane of m: its key, or a lane of its own when it has none.
func laneKey(m *Message) string {
	if m.Key == "" || broken.Has(broken.NoKeyGate) { // the canary gives every message a lane
		return "\x00" + strconv.FormatInt(m.Seq, 10)
	}
	return m.Key
}

// size is the number of messages in hand.
func (h *hand) size() int { return len(h.known) }

// prioritized is the number of messages in hand with a priority.
func (h *hand) prioritized() int { return h.prio }

// idle reports whether no message of shard is in hand.
func (h *hand) idle(shard int) bool { return h.perShard[shard] == 0 }

// shardOf returns the shard of the message in hand with seq.
func (h *hand) shardOf(seq int64) (shard int, ok bool) {
	m, ok := h.known[seq]
	return m.shard, ok
}

// has reports whether the message with seq is in hand.
func (h *hand) has(seq int64) bool {
	_, ok := h.known[seq]
	return ok
}

// dropped is the number of messages dropped unrecorded so far: a fetch must find them
// again.
func (h *hand) dropped() int { return h.drops }

// fetchRunning reports whether a fetch is out (fetchStarted, not yet fetched).
func (h *hand) fetchRunning() bool { return h.fetching }

// fetchStarted marks a fetch running: changes from now until fetched are remembered
// against its rows.
func (h *hand) fetchStarted() { h.fetching = true }

// seqs returns the seq of every message in hand, which a full fetch excludes.
func (h *hand) seqs() []int64 {
	out := make([]int64, 0, len(h.known))
	for seq := range h.known {
		out = append(out, seq)
	}
	return out
}

// held returns, for each key whose lane holds its pending messages, the seq of the last
// one (those before the head are confirmed and being recorded). Lanes of messages
// without a key and failed lanes hold nothing a continuation may skip.
func (h *hand) held() map[string]int64 {
	out := make(map[string]int64, len(h.lanes))
	for key, ln := range h.lanes {
		if !ln.failed && key[0] != 0 && len(ln.queue) > 0 {
			out[key] = ln.queue[len(ln.queue)-1].m.Seq
		}
	}
	return out
}

// fetched ends the running fetch and takes in its rows (none when it failed). admit
// returns the lease token under which m's shard is held, or false when m may not be
// taken (its lease changed while fetching). Rows already in hand, settled, of a failed
// lane or of a tainted key are skipped.
func (h *hand) fetched(msgs []*Message, admit func(m *Message) (token int64, ok bool)) {
	h.fetching = false
	taint, settled := h.taint, h.settled
	if len(taint) > 0 {
		h.taint = map[string]bool{}
	}
	if len(settled) > 0 {
		h.settled = map[int64]bool{}
	}
	for _, m := range msgs {
		if _, dup := h.known[m.Seq]; dup || settled[m.Seq] {
			continue
		}
		token, ok := admit(m)
		if !ok {
			continue
		}
		key := laneKey(m)
		ln := h.lanes[key]
		if (ln != nil && ln.failed) || taint[key] {
			continue // the key's failure was not yet recorded when this fetch began
		}
		h.add(key, ln, m, token, false)
	}
}

// streamed takes in m, a row the WAL stream brought (walLog), under token, the lease
// token of its shard, if it may come after what the hand holds: it is not in hand, its
// key's lane did not fail and holds only lower seqs, and no message of its key was
// released while the running fetch ran (taint: one dropped unsent is pending again,
// before it). It reports whether it took m.
func (h *hand) streamed(m *Message, token int64) bool {
	if _, dup := h.known[m.Seq]; dup || h.settled[m.Seq] {
		return false
	}
	key := laneKey(m)
	ln := h.lanes[key]
	if h.taint[key] || (ln != nil && (ln.failed || (len(ln.queue) > 0 && ln.queue[len(ln.queue)-1].m.Seq >= m.Seq))) {
		return false
	}
	h.add(key, ln, m, token, true)
	return true
}

// fromLog reports whether the message in hand with seq came from the WAL stream.
func (h *hand) fromLog(seq int64) bool { return h.known[seq].fromLog }

// add appends m, fetched under token (or from the WAL stream: fromLog), to the lane of
// key (ln, nil when there is none).
func (h *hand) add(key string, ln *lane, m *Message, token int64, fromLog bool) {
	if ln == nil {
		ln = &lane{key: key, shard: m.Shard}
		h.lanes[key] = ln
	}
	ln.queue = append(ln.queue, &item{m: m, token: token})
	h.known[m.Seq] = inHand{shard: m.Shard, key: m.Key, prio: m.Priority > 0, fromLog: fromLog}
	if m.Priority > 0 {
		h.prio++
	}
	h.perShard[m.Shard]++
	if !ln.inFlight {
		h.enqueue(ln)
	}
}

// readyLen is the number of lanes that may have a head to send.
func (h *hand) readyLen() int { return len(h.urgent) + len(h.ready) }

// takeReady returns up to n heads of ready lanes whose shard is sendable, one per key,
// and marks them in flight. Lanes it passes over as unsendable leave ready: a lease
// round (requeue) or dropUnsent deals with them.
func (h *hand) takeReady(n int, sendable func(shard int) bool) []*item {
	return h.takeReadyIf(n, sendable, nil)
}

// takeReadyIf is takeReady of the heads allow accepts (nil: all); the lanes whose head
// it refuses stay ready, in their place. Lanes whose head has a priority go first.
func (h *hand) takeReadyIf(n int, sendable func(shard int) bool, allow func(*item) bool) []*item {
	batch := make([]*item, 0, min(n, h.readyLen()))
	batch, h.urgent = h.take(batch, n, h.urgent, sendable, allow)
	batch, h.ready = h.take(batch, n, h.ready, sendable, allow)
	return batch
}

// take appends to batch, up to n, the heads of the lanes of ready (h.ready or h.urgent)
// that takeReadyIf takes, and returns the lanes left ready.
func (h *hand) take(batch []*item, n int, ready []*lane, sendable func(shard int) bool, allow func(*item) bool) ([]*item, []*lane) {
	rest := ready[:0]
	for i, ln := range ready {
		if len(batch) == n {
			rest = append(rest, ready[i:]...)
			break
		}
		if ln.inFlight || ln.failed || len(ln.queue) == 0 || h.lanes[ln.key] != ln || !sendable(ln.shard) {
			ln.queued = false
			continue
		}
		if allow != nil && !allow(ln.queue[0]) {
			rest = append(rest, ln)
			continue
		}
		ln.queued = false
		ln.inFlight = true
		batch = append(batch, ln.queue[0])
	}
	clear(ready[len(rest):])
	return batch, rest
}

// confirmed pops it, its lane's head, which the broker confirmed, and queues the next
// message of the key, or drops the rest of the lane when its shard is not sendable.
// it stays in known until its outcome is recorded (settle).
func (h *hand) confirmed(it *item, sendable func(shard int) bool) {
	ln := h.lanes[laneKey(it.m)]
	ln.inFlight = false
	ln.queue = ln.queue[1:]
	if len(ln.queue) == 0 {
		delete(h.lanes, ln.key)
		return
	}
	h.requeueLane(ln, sendable)
}

// unsent puts back it, its lane's head, which did not reach the broker (an outage): it is
// sent again, or dropped with the rest of the lane when its shard is not sendable.
func (h *hand) unsent(it *item, sendable func(shard int) bool) {
	ln := h.lanes[laneKey(it.m)]
	ln.inFlight = false
	h.requeueLane(ln, sendable)
}

func (h *hand) requeueLane(ln *lane, sendable func(shard int) bool) {
	if sendable(ln.shard) {
		h.enqueue(ln)
	} else {
		h.dropLane(ln)
	}
}

// rejected marks it, its lane's head, as rejected by the broker: the head stays in hand
// until its failure is recorded, and the key's later messages are dropped from the queue
// (they stay in known until then, and are fetched again once the store blocks the key).
// It returns the lane, for failureRecorded.
func (h *hand) rejected(it *item) *lane {
	ln := h.lanes[laneKey(it.m)]
	ln.inFlight = false
	ln.failed = true
	for _, rest := range ln.queue[1:] {
		ln.dropped = append(ln.dropped, rest.m.Seq)
	}
	ln.queue = ln.queue[:1]
	return ln
}

// requeue makes ready every lane with an unsent head whose shard is sendable: after a
// lease round, lanes passed over while the leases had lapsed locally.
func (h *hand) requeue(sendable func(shard int) bool) {
	for _, ln := range h.lanes {
		if !ln.inFlight && !ln.failed && len(ln.queue) > 0 && sendable(ln.shard) {
			h.enqueue(ln)
		}
	}
}

func (h *hand) enqueue(ln *lane) {
	if ln.queued {
		return
	}
	ln.queued = true
	if len(ln.queue) > 0 && ln.queue[0].m.Priority > 0 {
		h.urgent = append(h.urgent, ln)
	} else {
		h.ready = append(h.ready, ln)
	}
}

// dropUnsent drops the unsent messages of every lane that match.
func (h *hand) dropUnsent(match func(*lane) bool) {
	for _, ln := range h.lanes {
		if match(ln) {
			h.dropLane(ln)
		}
	}
}

// dropLane forgets ln's unsent messages; its in-flight head, if any, stays. A fetch
// running meanwhile excluded them as in hand and may return the key's later messages:
// its rows of the key are ignored (taint), or they would overtake the dropped ones.
func (h *hand) dropLane(ln *lane) {
	if ln.failed {
		return // settles when its failure is recorded
	}
	keep := 0
	if ln.inFlight {
		keep = 1
	}
	if h.fetching && len(ln.queue) > keep {
		h.taint[ln.key] = true
	}
	for _, it := range ln.queue[keep:] {
		h.forget(it.m.Seq)
		h.drops++
	}
	ln.queue = ln.queue[:keep]
	if keep == 0 {
		delete(h.lanes, ln.key)
	}
}

// settle forgets a message whose outcome was recorded, and keeps it out of the rows of
// a fetch that is running. It returns the message's key.
func (h *hand) settle(seq int64) (key string) {
	key = h.known[seq].key
	h.forget(seq)
	if h.fetching {
		h.settled[seq] = true
	}
	return key
}

// forget drops seq from hand without a record: its outcome is unknown to the store, and
// a later fetch returns it again.
func (h *hand) forget(seq int64) {
	if m, ok := h.known[seq]; ok {
		delete(h.known, seq)
		if m.prio {
			h.prio--
		}
		if h.perShard[m.shard]--; h.perShard[m.shard] <= 0 {
			delete(h.perShard, m.shard)
		}
	}
}

// failureRecorded releases lanes whose head's failure the store recorded (it was
// settled on its own): their dropped messages leave hand, and the key is free for the
// next fetch, which the store now answers without the blocked key.
func (h *hand) failureRecorded(lanes []*lane) {
	for _, ln := range lanes {
		for _, seq := range ln.dropped {
			h.forget(seq)
			h.drops++
		}
		ln.dropped = nil
		ln.failed = false
		if h.lanes[ln.key] == ln {
			delete(h.lanes, ln.key)
		}
		if h.fetching {
			h.taint[ln.key] = true
		}
	}
}
