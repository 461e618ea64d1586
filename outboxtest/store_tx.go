package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/shard"
)

// ErrTxDone is returned by the calls on a Tx that has ended: committed or rolled back,
// or, for a savepoint, released, rolled back, taken before one that was, or in a
// transaction that ended.
var ErrTxDone = errors.New("outboxtest: the transaction has already been committed or rolled back")

// Tx is a transaction of a Store, to pass to outbox.Writer.Write (Store is its
// WriteDriver): the messages written in it become visible at Commit and are discarded at
// Rollback, but take their seq when written. A Tx is used by one goroutine at a time, as
// a database transaction is; ending it twice is safe (the second call returns ErrTxDone),
// so `defer tx.Rollback()` is the usual guard.
type Tx struct {
	s    *Store
	root *Tx    // the top-level transaction: tx itself, unless tx is a savepoint
	mark txMark // how much root had written when the savepoint was taken
	done bool

	// Of a top-level transaction only:
	begun      time.Time
	rows       []*row   // written, in seq order
	claims     []string // dedup keys claimed, in claim order
	savepoints []*Tx    // savepoints not ended, in the order they were taken
	waitsFor   *Tx      // the transaction whose dedup claim this one waits on
}

// txMark is a position in a top-level transaction's writes.
type txMark struct{ rows, claims int }

// Begin starts a transaction.
func (s *Store) Begin() *Tx {
	s.mu.Lock()
	defer s.mu.Unlock()
	tx := &Tx{s: s, begun: s.clock()}
	tx.root = tx
	s.open[tx] = struct{}{}
	return tx
}

// Savepoint takes a savepoint in tx's transaction and returns it as a nested
// transaction, to write in like tx: its Rollback undoes every write of the transaction
// since the savepoint was taken (ROLLBACK TO SAVEPOINT), dedup claims included; its
// Commit keeps them (RELEASE SAVEPOINT). Either ends the savepoint and every savepoint
// taken after it, as in SQL; the transaction goes on, and its own Commit or Rollback
// decides.
func (tx *Tx) Savepoint() (*Tx, error) {
	tx.s.mu.Lock()
	defer tx.s.mu.Unlock()
	if tx.ended() {
		return nil, ErrTxDone
	}
	root := tx.root
	sp := &Tx{s: tx.s, root: root, mark: txMark{rows: len(root.rows), claims: len(root.claims)}}
	root.savepoints = append(root.savepoints, sp)
	return sp, nil
}

// ended reports whether tx, or its transaction, has ended.
func (tx *Tx) ended() bool { return tx.done || tx.root.done }

// end ends tx and, for a savepoint, the savepoints taken after it.
func (tx *Tx) end() {
	tx.done = true
	root := tx.root
	if i := slices.Index(root.savepoints, tx); i >= 0 {
		for _, sp := range root.savepoints[i:] {
			sp.done = true
		}
		root.savepoints = root.savepoints[:i]
	}
}

// Commit commits tx: its messages become visible to Fetch, each at the place of its seq,
// and the writers waiting for its dedup keys find them taken. For a savepoint, it keeps
// the savepoint's writes in the transaction.
func (tx *Tx) Commit() error {
	s := tx.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if tx.ended() {
		return ErrTxDone
	}
	tx.end()
	if tx != tx.root {
		return nil
	}
	for _, k := range tx.claims {
		s.claims[k].tx = nil
	}
	for _, r := range tx.rows {
		s.addPending(r)
	}
	tx.rows, tx.claims = nil, nil
	delete(s.open, tx)
	s.settled.Broadcast()
	return nil
}

// Rollback discards what tx wrote and releases its dedup claims, waking the writers that
// wait for them. For a savepoint, it discards what the transaction wrote since the
// savepoint was taken. The seqs of discarded messages are not used again.
func (tx *Tx) Rollback() error {
	s := tx.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if tx.ended() {
		return ErrTxDone
	}
	tx.end()
	root := tx.root
	root.rows = root.rows[:tx.mark.rows]
	s.unclaim(root, tx.mark.claims)
	if tx == root {
		delete(s.open, tx)
	}
	return nil
}

// Insert implements outboxdriver.WriteDriver: it writes msgs in tx, in call order, each
// under the next seq, and returns the dedup keys of the messages it skipped because
// their key was taken (by a message still kept, by an earlier message of the
// transaction, or by another transaction that committed while this one waited for it),
// in call order. A message whose id was generated for it (an empty DedupKey) claims
// nothing: its dedup key is its id's text, which no other message holds. On an error (ctx
// ended while waiting, or two transactions waiting for each other's keys) nothing of the
// call is written.
func (s *Store) Insert(ctx context.Context, tx *Tx, msgs []outbox.Message) ([]string, error) {
	if tx == nil {
		return nil, errors.New("outboxtest: nil transaction: Write must run inside a transaction (Store.Begin)")
	}
	if tx.s != s {
		return nil, errors.New("outboxtest: the transaction belongs to another Store")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if tx.ended() {
		return nil, ErrTxDone
	}
	root := tx.root
	claimed, err := s.claim(ctx, root, dedupKeys(msgs))
	if err != nil {
		return nil, fmt.Errorf("outboxtest: insert: %w", err)
	}
	var skipped []string
	now := s.clock()
	for i := range msgs {
		m := &msgs[i]
		if k := m.DedupKey; k != "" {
			if !claimed[k] {
				skipped = append(skipped, k)
				continue
			}
			delete(claimed, k) // a second message with this key in the call is a duplicate
		}
		root.rows = append(root.rows, s.newRow(m, now))
	}
	return skipped, nil
}

// dedupKeys returns the distinct dedup keys that msgs claim, sorted: two calls claiming
// overlapping keys then wait for each other in one order, as the database stores claim.
func dedupKeys(msgs []outbox.Message) []string {
	var keys []string
	for _, m := range msgs {
		if m.DedupKey != "" {
			keys = append(keys, m.DedupKey)
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// newRow returns the pending row of m, written at now under the next seq. Like the
// database stores, it keeps m's DedupID as its dedup key, and does not give DeliverAt
// back: a delayed message's next attempt time is DeliverAt, and no earlier than now.
func (s *Store) newRow(m *outbox.Message, now time.Time) *row {
	s.seq++
	c := clone(*m)
	c.DedupKey = m.DedupID()
	c.Seq, c.Shard, c.CreatedAt = s.seq, shard.Of(m.Key, m.ID), now
	c.Attempts, c.LastError, c.DeliverAt = 0, "", time.Time{}
	next := now
	if at := m.DeliverAt.Truncate(time.Microsecond); at.After(now) {
		next = at
	}
	return &row{msg: c, next: next}
}

// claim claims keys for tx and returns the ones it got. A key taken already, by a
// committed message or by tx, is not got; a key another open transaction claimed makes
// claim wait until that one ends, then look again (ON CONFLICT DO NOTHING). On an error
// it gives back what it claimed.
func (s *Store) claim(ctx context.Context, tx *Tx, keys []string) (map[string]bool, error) {
	from := len(tx.claims)
	got := make(map[string]bool, len(keys))
	for _, k := range keys {
		for {
			c := s.claims[k]
			if c == nil {
				s.claims[k] = &claim{at: s.clock(), tx: tx}
				tx.claims = append(tx.claims, k)
				got[k] = true
				break
			}
			if c.tx == nil || c.tx == tx {
				break
			}
			if err := s.waitFor(ctx, tx, c.tx); err != nil {
				s.unclaim(tx, from)
				return nil, fmt.Errorf("dedup key %q: %w", k, err)
			}
		}
	}
	return got, nil
}

// errDeadlock is waitFor's refusal to wait for a transaction that waits for the waiter.
var errDeadlock = errors.New("deadlock: claimed by a transaction that waits for a dedup key this one claimed")

// waitFor waits until a transaction ends or ctx does: the caller then looks at the claim
// it waits on again. It refuses to wait when holder waits, directly or not, for tx:
// neither would ever end (a database reports the deadlock).
func (s *Store) waitFor(ctx context.Context, tx, holder *Tx) error {
	for t := holder; t != nil; t = t.waitsFor {
		if t == tx {
			return errDeadlock
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	tx.waitsFor = holder
	defer func() { tx.waitsFor = nil }()
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.settled.Broadcast()
	})
	defer stop()
	s.settled.Wait()
	return ctx.Err()
}

// unclaim releases the dedup keys tx claimed from its from-th claim on, and wakes the
// writers waiting for them.
func (s *Store) unclaim(tx *Tx, from int) {
	if from >= len(tx.claims) {
		return
	}
	for _, k := range tx.claims[from:] {
		delete(s.claims, k)
	}
	tx.claims = tx.claims[:from]
	s.settled.Broadcast()
}
