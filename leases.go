package outbox

import (
	"slices"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// leaseBook is the relay's view of its shard leases: which shards it holds under which
// token, which of them it is giving back, and until when it may send under them. It does
// no I/O and reads no clock: the loop gives it each lease round's answer and the time.
//
// Invariants:
//   - draining is a subset of the held shards: a shard lost is no longer draining;
//   - until is never later than the round's start plus the time the store reported left
//     on the soonest lease, less a fifth of the TTL: a renewal that started at t keeps
//     every lease until at least t+left in database time, and the margin covers clock
//     rates and a late answer. Nothing is sent at or after until;
//   - a shard is released only once drained (no message of it in hand), or on the
//     final round, which releases every lease;
//   - a round adopts the leases of the relay's ID that it does not present (Adopt) only
//     while the book cannot know them: before its first answer and after a round whose
//     answer was lost. Otherwise two processes sharing an ID would take each other's
//     leases at every round; this way the later one takes them once and the earlier one
//     idles.
type leaseBook struct {
	ttl      time.Duration
	adopt    bool          // the next round adopts (LeaseRequest.Adopt)
	tokens   map[int]int64 // held shard -> lease token
	draining map[int]bool  // held shards being given back: nothing new is sent or fetched
	until    time.Time     // local monotonic deadline for sending under the current leases
}

func newLeaseBook(ttl time.Duration) *leaseBook {
	return &leaseBook{ttl: ttl, tokens: map[int]int64{}, draining: map[int]bool{}, adopt: true}
}

// leaseChange is what a round changed: shards lost (expired, taken over, released),
// shards gained, and held shards newly set draining to come down to the fair share.
type leaseChange struct {
	lost, gained, drain []int
}

// request fills the held and released leases of a round into req: a draining shard with
// nothing in hand (idle) is released, every lease is when final.
func (b *leaseBook) request(req outboxdriver.LeaseRequest, final bool, idle func(shard int) bool) outboxdriver.LeaseRequest {
	for _, shard := range sortedShards(b.tokens) {
		lease := outboxdriver.Lease{Shard: shard, Token: b.tokens[shard]}
		if final || (b.draining[shard] && idle(shard)) {
			req.Release = append(req.Release, lease)
		} else {
			req.Held = append(req.Held, lease)
		}
	}
	if final {
		req.TTL = 0
	}
	req.Adopt = b.adopt && !final
	return req
}

// failed records a round whose answer was lost: it may have taken leases the book does
// not know, which the next round adopts.
func (b *leaseBook) failed() { b.adopt = true }

// apply takes the answer of a round that started at started: the leases held from now
// on, the sending deadline, and shards beyond the fair share (st.Target) set draining,
// the highest numbers first.
func (b *leaseBook) apply(st outboxdriver.LeaseState, started time.Time) leaseChange {
	var c leaseChange
	b.adopt = false
	next := make(map[int]int64, len(st.Held))
	for _, ls := range st.Held {
		next[ls.Shard] = ls.Token
	}
	for _, shard := range sortedShards(b.tokens) {
		if t, ok := next[shard]; !ok || t != b.tokens[shard] {
			c.lost = append(c.lost, shard)
			delete(b.draining, shard)
		}
	}
	for _, shard := range sortedShards(next) {
		if t, ok := b.tokens[shard]; !ok || t != next[shard] {
			c.gained = append(c.gained, shard)
		}
	}
	b.tokens = next
	b.until = started.Add(b.ttl - b.ttl/5)
	// (A Target of 0 is a store's answer only when it says how many shards there are: a
	// WAL-mode relay standing by while another reads the slot.)
	if excess := len(next) - len(b.draining) - st.Target; excess > 0 && (st.Target > 0 || st.Shards > 0) {
		shards := sortedShards(next)
		for i := len(shards) - 1; i >= 0 && len(c.drain) < excess; i-- {
			if s := shards[i]; !b.draining[s] {
				b.draining[s] = true
				c.drain = append(c.drain, s)
			}
		}
	}
	return c
}

// sendable reports whether messages of shard may be sent at now.
func (b *leaseBook) sendable(shard int, now time.Time) bool {
	_, held := b.tokens[shard]
	return held && !b.draining[shard] && now.Before(b.until)
}

// holds reports whether token is the current lease token of shard.
func (b *leaseBook) holds(shard int, token int64) bool {
	t, ok := b.tokens[shard]
	return ok && t == token
}

// deadline is the local monotonic deadline for sending under the current leases.
func (b *leaseBook) deadline() time.Time { return b.until }

// count is the number of shards held.
func (b *leaseBook) count() int { return len(b.tokens) }

// tokenOf returns the token under which shard is held (0: not held).
func (b *leaseBook) tokenOf(shard int) int64 { return b.tokens[shard] }

// fetchable reports whether rows of shard fetched under token may be taken into hand:
// the lease is still held under it and not being given back.
func (b *leaseBook) fetchable(shard int, token int64) bool {
	return b.holds(shard, token) && !b.draining[shard]
}

// drainedAny reports whether a shard being given back has nothing left in hand (idle).
func (b *leaseBook) drainedAny(idle func(shard int) bool) bool {
	for s := range b.draining {
		if idle(s) {
			return true
		}
	}
	return false
}

// active returns the held leases that are not draining, by shard: what a fetch may read.
func (b *leaseBook) active() []outboxdriver.Lease {
	var out []outboxdriver.Lease
	for _, shard := range sortedShards(b.tokens) {
		if !b.draining[shard] {
			out = append(out, outboxdriver.Lease{Shard: shard, Token: b.tokens[shard]})
		}
	}
	return out
}

func sortedShards[V any](m map[int]V) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
