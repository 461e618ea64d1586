package outboxtest

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// lease is a shard's lease. A shard is free when owner is empty, and up for taking once
// expires has passed.
type lease struct {
	owner   string
	token   int64
	expires time.Time
}

// relayRow is a relay's heartbeat.
type relayRow struct {
	hostname    string
	pid         int
	fingerprint string
	dests       []outboxdriver.DestinationState
	started     time.Time
	heartbeat   time.Time
	expires     time.Time
}

// forgetRelaysAfter is how long after its heartbeat expired a relay stays in Status, as
// not live, before a lease round forgets it (as the database stores do).
const forgetRelaysAfter = time.Hour

// SyncLeases implements outboxdriver.Store, as the database stores do it in one
// transaction: release req.Release, then, unless req.TTL is not positive (the relay
// leaves), heartbeat, renew req.Held for TTL, adopt the relay's other unexpired leases
// when req.Adopt is set, and take free or expired shards, lowest first, up to the fair
// share (ceil(shards / live relays)), or none while relays of another fingerprint hold
// shards (LeaseState.Share). Every change of owner, and every adoption, draws a
// new token from one counter, so a token is never reused and fences its predecessors.
// It returns the relay's unexpired leases among those it presented, adopted and took.
// WAL mode's slot lease (req.Slot) is not modelled: SlotToken stays 0.
func (s *Store) SyncLeases(ctx context.Context, req outboxdriver.LeaseRequest) (outboxdriver.LeaseState, error) {
	if err := ctx.Err(); err != nil {
		return outboxdriver.LeaseState{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	s.release(req.RelayID, req.Release)
	if req.TTL <= 0 {
		delete(s.relays, req.RelayID)
		return outboxdriver.LeaseState{}, nil
	}
	s.heartbeat(req, now)
	until := now.Add(req.TTL)
	for _, l := range req.Held {
		if s.owns(req.RelayID, l) {
			s.leases[l.Shard].expires = until
		}
	}
	var gained []int // shards adopted or taken in this round, under new tokens
	if req.Adopt {
		gained = s.adopt(req.RelayID, req.Held, now, until)
	}
	st := outboxdriver.LeaseState{Shards: len(s.leases), Live: s.live(now)}
	held := len(s.heldOf(req.RelayID, req.Held, gained, now))
	st.Share(req.Fingerprint, held > 0, s.differing(req, now))
	if want := st.Target - held; want > 0 {
		gained = append(gained, s.take(req.RelayID, want, now, until)...)
	}
	st.Held = s.heldOf(req.RelayID, req.Held, gained, now)
	return st, nil
}

// release frees the leases of ls that are still relayID's under the token given.
func (s *Store) release(relayID string, ls []outboxdriver.Lease) {
	for _, l := range ls {
		if s.owns(relayID, l) {
			s.leases[l.Shard] = lease{}
		}
	}
}

// owns reports whether l is relayID's lease, expired or not: no other relay took it.
func (s *Store) owns(relayID string, l outboxdriver.Lease) bool {
	return l.Shard >= 0 && l.Shard < len(s.leases) && s.leases[l.Shard].owner == relayID && s.leases[l.Shard].token == l.Token
}

// heartbeat records that req's relay is alive until now + TTL, and forgets the relays
// whose heartbeat expired more than forgetRelaysAfter ago.
func (s *Store) heartbeat(req outboxdriver.LeaseRequest, now time.Time) {
	r := s.relays[req.RelayID]
	if r == nil {
		r = &relayRow{started: now}
		s.relays[req.RelayID] = r
	}
	r.hostname, r.pid, r.fingerprint, r.heartbeat, r.expires = req.Hostname, req.PID, req.Fingerprint, now, now.Add(req.TTL)
	r.dests = outboxdriver.DecodeDestinations(outboxdriver.EncodeDestinations(req.Destinations)) // as a database keeps them
	for id, r := range s.relays {
		if r.expires.Before(now.Add(-forgetRelaysAfter)) {
			delete(s.relays, id)
		}
	}
}

// adopt gives relayID, under new tokens and until until, its unexpired leases that are
// not among held (an earlier process's of the same ID), and returns their shards.
func (s *Store) adopt(relayID string, held []outboxdriver.Lease, now, until time.Time) []int {
	var adopted []int
	for shard := range s.leases {
		l := &s.leases[shard]
		if l.owner != relayID || !l.expires.After(now) || slices.Contains(held, outboxdriver.Lease{Shard: shard, Token: l.token}) {
			continue
		}
		s.token++
		l.token, l.expires = s.token, until
		adopted = append(adopted, shard)
	}
	return adopted
}

// take gives relayID up to want free or expired shards, lowest first, under new tokens
// and until until, and returns them.
func (s *Store) take(relayID string, want int, now, until time.Time) []int {
	var taken []int
	for shard := range s.leases {
		if len(taken) == want {
			break
		}
		if l := s.leases[shard]; l.owner != "" && l.expires.After(now) {
			continue
		}
		s.token++
		s.leases[shard] = lease{owner: relayID, token: s.token, expires: until}
		taken = append(taken, shard)
	}
	return taken
}

// heldOf returns relayID's unexpired leases at now among those it presented and the
// shards it gained in this round, by shard. A lease of its ID under another token (an
// earlier process's) is not among them: two processes sharing an ID would otherwise
// take each other's leases at every round.
func (s *Store) heldOf(relayID string, presented []outboxdriver.Lease, gained []int, now time.Time) []outboxdriver.Lease {
	var out []outboxdriver.Lease
	for shard, l := range s.leases {
		mine := slices.Contains(gained, shard) || slices.Contains(presented, outboxdriver.Lease{Shard: shard, Token: l.token})
		if mine && s.holds(relayID, outboxdriver.Lease{Shard: shard, Token: l.token}, now) {
			out = append(out, outboxdriver.Lease{Shard: shard, Token: l.token})
		}
	}
	return out
}

// live counts the relays whose heartbeat has not expired at now.
func (s *Store) live(now time.Time) int {
	n := 0
	for _, r := range s.relays {
		if r.expires.After(now) {
			n++
		}
	}
	return n
}

// differing returns the live relays other than req's whose fingerprint differs from
// req's, both being set, in id order.
func (s *Store) differing(req outboxdriver.LeaseRequest, now time.Time) []outboxdriver.Peer {
	var out []outboxdriver.Peer
	if req.Fingerprint == "" {
		return nil
	}
	for id, r := range s.relays {
		if id == req.RelayID || !r.expires.After(now) || r.fingerprint == "" || r.fingerprint == req.Fingerprint {
			continue
		}
		out = append(out, outboxdriver.Peer{ID: id, Fingerprint: r.fingerprint, Holds: s.holdsAny(id, now)})
	}
	slices.SortFunc(out, func(a, b outboxdriver.Peer) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// holdsAny reports whether relayID holds an unexpired lease at now.
func (s *Store) holdsAny(relayID string, now time.Time) bool {
	return slices.ContainsFunc(s.leases[:], func(l lease) bool { return l.owner == relayID && l.expires.After(now) })
}

// relayInfos returns the relays Status shows, in start order, each with the shards it
// holds unexpired leases on.
func (s *Store) relayInfos(now time.Time) []outboxdriver.RelayInfo {
	out := []outboxdriver.RelayInfo{}
	for id, r := range s.relays {
		info := outboxdriver.RelayInfo{ID: id, Hostname: r.hostname, PID: r.pid, StartedAt: r.started,
			HeartbeatAt: r.heartbeat, Live: r.expires.After(now), Fingerprint: r.fingerprint, Destinations: r.dests}
		for _, l := range s.leases {
			if l.owner == id && l.expires.After(now) {
				info.Shards++
			}
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b outboxdriver.RelayInfo) int {
		return cmp.Or(a.StartedAt.Compare(b.StartedAt), cmp.Compare(a.ID, b.ID))
	})
	return out
}
