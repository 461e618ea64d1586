package outboxtest

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/broken"
	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/internal/sqlstore"
	"github.com/outboxkit/outbox/outboxdriver"
)

// StoreConfig configures a Store.
type StoreConfig struct {
	// Now is the database's clock: every time that decides correctness (lease and
	// heartbeat expiry, when a retry or a delayed message is due, created_at, dead_at,
	// retention) is read from it, never from the relay. Set it to a fake clock to drive
	// those times from a test; time.Now inside a testing/synctest bubble is one already.
	// Defaults to time.Now.
	Now func() time.Time
}

// Store is an in-memory outbox: outboxdriver.Store and outboxdriver.Admin for relays and
// operators' tools, and outboxdriver.WriteDriver[*Tx] for outbox.NewWriter. It lets the
// relay's behaviour be tested without a database server, deterministically when its
// clock is fake, and passes the store suite (outboxtest/storetest) that the database
// stores pass.
//
// It models what the relay's design must cope with in a real database:
//
//   - A transaction's messages become visible at Commit, but take their seq at Insert,
//     as from a PostgreSQL identity column: a transaction that inserted first and
//     committed last holds a lower seq than messages already visible, and perhaps
//     already published. Seqs of rolled-back messages are never reused.
//   - A dedup key stays taken while its message is pending or dead, and after that until
//     DeletePublished finds it written longer ago than the retention time. A key claimed
//     by an open transaction makes a second writer of the key wait until that transaction
//     ends (ON CONFLICT DO NOTHING): the key is then taken if it committed and free if it
//     rolled back.
//   - Time is database time: StoreConfig.Now, kept to the microsecond as PostgreSQL
//     keeps it.
//   - Leases, fencing tokens and fair shares are those of the database stores, over the
//     same 64 shards: a key lands on the shard it would land on in PostgreSQL.
//
// It does not model LISTEN/NOTIFY (it is not an outboxdriver.Listener: a relay on it
// finds new messages by polling, every RelayConfig.PollInterval), the PostgreSQL
// stores' partitions and pending ring (it is neither an outboxdriver.Maintainer nor a
// Recycler: the relay cleans up with DeletePublished), or WAL mode.
//
// It is safe for concurrent use: one mutex guards its state. It copies messages in and
// out, so no caller shares its state.
type Store struct {
	now func() time.Time

	mu      sync.Mutex
	settled *sync.Cond // broadcast when dedup claims of an open transaction are committed or dropped
	seq     int64      // the last seq handed out
	token   int64      // the last lease token handed out
	pending []*row     // committed, neither published nor dead, in seq order
	history []archived // published, kept until DeletePublished
	dead    []archived // dead letters
	claims  map[string]*claim
	leases  [sqlstore.Shards]lease
	relays  map[string]*relayRow
	open    map[*Tx]struct{} // top-level transactions not yet ended
	replays map[string]outboxdriver.ReplayJob
}

var (
	_ outboxdriver.Store            = (*Store)(nil)
	_ outboxdriver.Admin            = (*Store)(nil)
	_ outboxdriver.WriteDriver[*Tx] = (*Store)(nil)
)

// NewStore returns an empty store.
func NewStore(config StoreConfig) *Store {
	s := &Store{
		now:    config.Now,
		claims: map[string]*claim{},
		relays: map[string]*relayRow{},
		open:   map[*Tx]struct{}{},
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.settled = sync.NewCond(&s.mu)
	return s
}

// row is a pending message.
type row struct {
	msg  outbox.Message // as Fetch returns it: Seq, Shard, CreatedAt, Attempts and LastError filled
	next time.Time      // next_attempt_at
}

// waiting reports whether r holds its key back at now: a retry backing off or a delayed
// message. A fresh row has next == CreatedAt and never waits.
func (r *row) waiting(now time.Time) bool {
	return r.next.After(r.msg.CreatedAt) && r.next.After(now)
}

// due reports whether r may be fetched at now. A fresh row is due whatever the clock
// says: only rows that wait are judged by it (internal/pgsql's Fetch says why).
func (r *row) due(now time.Time) bool {
	return !r.next.After(now) || r.next.Equal(r.msg.CreatedAt)
}

// archived is a published message or a dead letter, with when it became one.
type archived struct {
	msg outbox.Message
	at  time.Time
}

// claim is a dedup key taken.
type claim struct {
	at time.Time // when it was claimed: retention counts from here
	tx *Tx       // the open transaction that claimed it; nil once that one committed
}

// clock reads the database time, to the microsecond and without a monotonic reading,
// as a database hands times back.
func (s *Store) clock() time.Time { return s.now().Truncate(time.Microsecond) }

// clone returns a copy of m that shares no memory with it. Like the database stores, it
// gives an empty payload as an empty slice and no headers as a nil map.
func clone(m outbox.Message) outbox.Message {
	m.Payload = append([]byte{}, m.Payload...)
	m.Headers = maps.Clone(m.Headers)
	if len(m.Headers) == 0 {
		m.Headers = nil
	}
	return m
}

// find returns the index of seq in rows (sorted by seq), and whether it is there.
func find(rows []*row, seq int64) (int, bool) {
	return slices.BinarySearchFunc(rows, seq, func(r *row, seq int64) int {
		switch {
		case r.msg.Seq < seq:
			return -1
		case r.msg.Seq > seq:
			return 1
		}
		return 0
	})
}

// addPending inserts r among the pending rows at its seq's place: a transaction that
// inserted first and committed last lands below rows already visible.
func (s *Store) addPending(r *row) {
	i, _ := find(s.pending, r.msg.Seq)
	s.pending = slices.Insert(s.pending, i, r)
}

// takePending removes the pending row of seq and returns it, or nil if there is none.
func (s *Store) takePending(seq int64) *row {
	i, ok := find(s.pending, seq)
	if !ok {
		return nil
	}
	r := s.pending[i]
	s.pending = slices.Delete(s.pending, i, i+1)
	return r
}

// Fetch implements outboxdriver.Store: due messages of the shards whose leases req lists
// and the relay still holds, unexpired, in seq order, skipping req.Exclude, and holding
// back a key behind an earlier message of it that waits (a retry backing off, or
// DeliverAt). A continuation (req.After > 0) returns only seqs above After, and a
// message only if its key has no pending message at or below After that the relay has
// not handled (req.Held).
func (s *Store) Fetch(ctx context.Context, req outboxdriver.FetchRequest) ([]*outbox.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(req.Leases) == 0 || req.Limit <= 0 {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	shards := s.leased(req.RelayID, req.Leases, now)
	waitsFrom := s.waitingFrom(now)
	var skip func(r *row) bool
	if req.After > 0 {
		unhandled := s.unhandledBelow(req.After, req.Held())
		skip = func(r *row) bool { return r.msg.Seq <= req.After || unhandled[r.msg.Key] }
	} else {
		exclude := make(map[int64]bool, len(req.Exclude))
		for _, seq := range req.Exclude {
			exclude[seq] = true
		}
		skip = func(r *row) bool { return exclude[r.msg.Seq] }
	}
	var out []*outbox.Message
	for _, r := range s.pending {
		if !shards[r.msg.Shard] || !r.due(now) || skip(r) {
			continue
		}
		if from, ok := waitsFrom[r.msg.Key]; ok && from < r.msg.Seq {
			continue
		}
		m := clone(r.msg)
		out = append(out, &m)
		if len(out) == req.Limit {
			break
		}
	}
	return out, nil
}

// FetchPriority implements outboxdriver.PriorityFetcher: due messages with a priority
// above 0, highest first and in seq order within one, of the shards whose leases req
// lists and the relay still holds, skipping req.Exclude, and a message only if every
// earlier pending message of its key that the relay has not handled (held up to
// req.Held) is due and of the same priority.
func (s *Store) FetchPriority(ctx context.Context, req outboxdriver.FetchRequest) ([]*outbox.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(req.Leases) == 0 || req.Limit <= 0 {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	shards := s.leased(req.RelayID, req.Leases, now)
	exclude := make(map[int64]bool, len(req.Exclude))
	for _, seq := range req.Exclude {
		exclude[seq] = true
	}
	held := req.Held()
	// Per key, the rows so far that the relay has not handled: when all are due, their
	// one priority; -1 when they are not all due or of one priority.
	unhandled := map[string]int{}
	var found []*row
	for _, r := range s.pending {
		k, p := r.msg.Key, r.msg.Priority
		before, seen := unhandled[k]
		if p > 0 && shards[r.msg.Shard] && r.due(now) && !exclude[r.msg.Seq] &&
			(k == "" || !seen || before == p || broken.Has(broken.PriorityOvertakes)) {
			found = append(found, r)
		}
		if k == "" || r.msg.Seq <= held[k] {
			continue
		}
		switch {
		case !r.due(now) || (seen && before != p):
			unhandled[k] = -1
		case !seen:
			unhandled[k] = p
		}
	}
	slices.SortStableFunc(found, func(a, b *row) int { return b.msg.Priority - a.msg.Priority })
	out := make([]*outbox.Message, 0, min(len(found), req.Limit))
	for _, r := range found[:min(len(found), req.Limit)] {
		m := clone(r.msg)
		out = append(out, &m)
	}
	return out, nil
}

// leased returns the shards of leases that are relayID's, under the very token given,
// and unexpired at now.
func (s *Store) leased(relayID string, leases []outboxdriver.Lease, now time.Time) map[int]bool {
	shards := make(map[int]bool, len(leases))
	for _, l := range leases {
		if s.holds(relayID, l, now) {
			shards[l.Shard] = true
		}
	}
	return shards
}

// holds reports whether l is relayID's unexpired lease at now.
func (s *Store) holds(relayID string, l outboxdriver.Lease, now time.Time) bool {
	return s.owns(relayID, l) && s.leases[l.Shard].expires.After(now)
}

// waitingFrom returns, for each key with a pending row that waits at now, the lowest
// seq of such a row: the key's rows above it are held back. Messages with an empty key
// are not ordered, so that key holds nothing back.
func (s *Store) waitingFrom(now time.Time) map[string]int64 {
	from := map[string]int64{}
	for _, r := range s.pending {
		if _, seen := from[r.msg.Key]; !seen && r.msg.Key != "" && r.waiting(now) {
			from[r.msg.Key] = r.msg.Seq
		}
	}
	return from
}

// unhandledBelow returns the keys with a pending row at or below after that the relay
// has not handled: of a key in held, a row above the seq it maps to; of another key, any
// row. A continuation must not return such a key's rows above after: they would overtake
// it. Messages with an empty key are not ordered, so that key is never returned.
func (s *Store) unhandledBelow(after int64, held map[string]int64) map[string]bool {
	keys := map[string]bool{}
	for _, r := range s.pending {
		if r.msg.Seq > after {
			break
		}
		if k := r.msg.Key; k != "" && r.msg.Seq > held[k] {
			keys[k] = true
		}
	}
	return keys
}

// Complete implements outboxdriver.Store, fenced per message: an outcome is applied only
// if its message is still pending and the lease on the message's shard is the relay's,
// unexpired, under the token the outcome carries. Published messages move to the
// history, retries get their error and next attempt time (with an attempt counted unless
// deferred), dead letters move to the dead letters with their error and one more attempt.
// It returns the seqs whose outcome was refused, published ones first.
func (s *Store) Complete(ctx context.Context, c outboxdriver.Completion) ([]int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	var refused []int64
	for _, o := range c.Published {
		r := s.fenced(c.RelayID, o, now)
		if r == nil {
			refused = append(refused, o.Seq)
			continue
		}
		s.takePending(o.Seq)
		s.history = append(s.history, archived{msg: r.msg, at: now})
	}
	for _, f := range c.Failed {
		r := s.fenced(c.RelayID, f.Outcome, now)
		if r == nil {
			refused = append(refused, f.Seq)
			continue
		}
		s.fail(r, f, now)
	}
	return refused, nil
}

// fenced returns the pending row of o's seq if o's token is the relay's unexpired lease
// on the row's shard, nil otherwise.
func (s *Store) fenced(relayID string, o outboxdriver.Outcome, now time.Time) *row {
	i, ok := find(s.pending, o.Seq)
	if !ok {
		return nil
	}
	r := s.pending[i]
	if !s.holds(relayID, outboxdriver.Lease{Shard: r.msg.Shard, Token: o.Token}, now) {
		return nil
	}
	return r
}

// fail records f on r: a dead letter moves, a retry is due again after f.Delay.
func (s *Store) fail(r *row, f outboxdriver.Failure, now time.Time) {
	text := pgsql.ErrorText(f.Error) // what a database can store as text
	if f.Dead {
		s.takePending(r.msg.Seq)
		m := r.msg
		m.Attempts++
		m.LastError = text
		s.dead = append(s.dead, archived{msg: m, at: now})
		return
	}
	if !f.Deferred {
		r.msg.Attempts++
	}
	r.msg.LastError = text
	r.next = now.Add(f.Delay)
}

// DeletePublished implements outboxdriver.Store: it deletes up to limit published
// messages published before now - olderThan (database time), oldest first, then up to
// limit dedup keys claimed before then whose message is neither pending nor dead, and
// returns how many of both it deleted.
func (s *Store) DeletePublished(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cutoff := s.clock().Add(-olderThan)
	return s.deleteHistory(cutoff, limit) + s.deleteClaims(cutoff, limit), nil
}

// deleteHistory deletes up to limit published messages published before cutoff, oldest
// first.
func (s *Store) deleteHistory(cutoff time.Time, limit int) int {
	slices.SortStableFunc(s.history, func(a, b archived) int { return a.at.Compare(b.at) })
	n := 0
	for n < len(s.history) && n < limit && s.history[n].at.Before(cutoff) {
		n++
	}
	s.history = slices.Delete(s.history, 0, n)
	return n
}

// deleteClaims releases up to limit committed dedup keys claimed before cutoff whose
// message is neither pending nor dead, oldest first: past the retention time a published
// (or purged) message's key may be used again.
func (s *Store) deleteClaims(cutoff time.Time, limit int) int {
	live := map[string]bool{}
	for _, r := range s.pending {
		live[r.msg.DedupKey] = true
	}
	for _, d := range s.dead {
		live[d.msg.DedupKey] = true
	}
	var expired []string
	for k, c := range s.claims {
		if c.tx == nil && c.at.Before(cutoff) && !live[k] {
			expired = append(expired, k)
		}
	}
	slices.SortFunc(expired, func(a, b string) int { return s.claims[a].at.Compare(s.claims[b].at) })
	expired = expired[:min(len(expired), limit)]
	for _, k := range expired {
		delete(s.claims, k)
	}
	return len(expired)
}
