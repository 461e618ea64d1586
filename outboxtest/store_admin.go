package outboxtest

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// This file is the operator's side of the Store: outboxdriver.Admin.

// Status implements outboxdriver.Admin: one consistent snapshot, every figure exact.
// OldestPendingAge is measured from when the message was written, and
// OldestTransactionAge from when the oldest open Tx began.
func (s *Store) Status(ctx context.Context) (outboxdriver.Status, error) {
	if err := ctx.Err(); err != nil {
		return outboxdriver.Status{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	st := outboxdriver.Status{
		Relays:    s.relayInfos(now),
		Published: int64(len(s.history)),
		Shards:    len(s.leases),
	}
	st.AddTopics(s.topicStatus(now))
	st.AddPriorities(s.priorityStatus(now))
	for _, l := range s.leases {
		if l.owner != "" && l.expires.After(now) {
			st.ShardsLeased++
		}
	}
	for tx := range s.open {
		st.OldestTransactionAge = max(st.OldestTransactionAge, now.Sub(tx.begun))
	}
	return st, nil
}

// priorityStatus returns one PriorityStatus per priority with pending messages.
func (s *Store) priorityStatus(now time.Time) []outboxdriver.PriorityStatus {
	prios := map[int]*outboxdriver.PriorityStatus{}
	for _, r := range s.pending {
		p := prios[r.msg.Priority]
		if p == nil {
			p = &outboxdriver.PriorityStatus{Priority: r.msg.Priority}
			prios[r.msg.Priority] = p
		}
		p.Pending++
		if !r.next.After(now) {
			p.Due++
		}
		p.OldestPendingAge = max(p.OldestPendingAge, now.Sub(r.msg.CreatedAt))
	}
	out := make([]outboxdriver.PriorityStatus, 0, len(prios))
	for _, p := range prios {
		out = append(out, *p)
	}
	return out
}

// topicStatus returns one TopicStatus per topic with pending or dead messages, by topic.
func (s *Store) topicStatus(now time.Time) []outboxdriver.TopicStatus {
	topics := map[string]*outboxdriver.TopicStatus{}
	get := func(name string) *outboxdriver.TopicStatus {
		if topics[name] == nil {
			topics[name] = &outboxdriver.TopicStatus{Topic: name}
		}
		return topics[name]
	}
	for _, r := range s.pending {
		t := get(r.msg.Topic)
		t.Pending++
		if !r.next.After(now) {
			t.Due++
		}
		if r.msg.Attempts > 0 {
			t.Retrying++
		}
		t.OldestPendingAge = max(t.OldestPendingAge, now.Sub(r.msg.CreatedAt))
	}
	for _, d := range s.dead {
		t := get(d.msg.Topic)
		t.Dead++
		if now.Sub(d.at) < time.Hour {
			t.DeadLastHour++
		}
	}
	out := []outboxdriver.TopicStatus{}
	for _, t := range topics {
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b outboxdriver.TopicStatus) int { return cmp.Compare(a.Topic, b.Topic) })
	return out
}

// DeadList implements outboxdriver.Admin: the dead letters that match f, most recently
// dead-lettered first.
func (s *Store) DeadList(ctx context.Context, f outboxdriver.DeadFilter) ([]outboxdriver.DeadLetter, error) {
	if err := s.deadCall(ctx, f); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []outboxdriver.DeadLetter
	for _, i := range s.pickDead(f) {
		d := s.dead[i]
		out = append(out, outboxdriver.DeadLetter{Message: clone(d.msg), DeadAt: d.at})
	}
	return out, nil
}

// DeadCount implements outboxdriver.Admin: how many dead letters match f, at most
// f.Limit when it is set.
func (s *Store) DeadCount(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	if err := s.deadCall(ctx, f); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pickDead(f)), nil
}

// DeadReplay implements outboxdriver.Admin: it moves the dead letters that match f back
// to pending, and returns how many. A replayed message keeps its seq (its place among its
// key's messages), ID and dedup key, and its last error until the next attempt; its
// attempts start again from 0, and it is due at once (next attempt time = created_at, so
// it holds no key back).
func (s *Store) DeadReplay(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	if err := s.deadCall(ctx, f); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	picked := s.pickDead(f)
	for _, i := range picked {
		m := s.dead[i].msg
		m.Attempts = 0
		s.addPending(&row{msg: m, next: m.CreatedAt})
	}
	s.dropDead(picked)
	return len(picked), nil
}

// DeadPurge implements outboxdriver.Admin: it deletes the dead letters that match f and
// returns how many. A filter that selects nothing in particular is refused with
// outboxdriver.ErrEmptyDeadFilter. A purged message's dedup key stays taken until
// DeletePublished releases it, once it is older than the retention time.
func (s *Store) DeadPurge(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	if f.IsEmpty() {
		return 0, outboxdriver.ErrEmptyDeadFilter
	}
	return s.deadPurge(ctx, f)
}

// DeadPurgeAll implements outboxdriver.Admin: it deletes every dead letter.
func (s *Store) DeadPurgeAll(ctx context.Context) (int, error) {
	return s.deadPurge(ctx, outboxdriver.DeadFilter{})
}

func (s *Store) deadPurge(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	if err := s.deadCall(ctx, f); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	picked := s.pickDead(f)
	s.dropDead(picked)
	return len(picked), nil
}

// deadCall checks what every dead-letter call checks before it changes anything.
func (s *Store) deadCall(ctx context.Context, f outboxdriver.DeadFilter) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return f.Validate()
}

// pickDead returns the indexes in s.dead of the dead letters that match f, in DeadList
// order (dead_at, then seq, descending), at most f.Limit of them when it is set: a
// Limit picks the rows a list shows first.
func (s *Store) pickDead(f outboxdriver.DeadFilter) []int {
	var picked []int
	for i, d := range s.dead {
		if deadMatch(f, d) {
			picked = append(picked, i)
		}
	}
	slices.SortFunc(picked, func(i, j int) int {
		a, b := s.dead[i], s.dead[j]
		return cmp.Or(b.at.Compare(a.at), cmp.Compare(b.msg.Seq, a.msg.Seq))
	})
	if f.Limit > 0 && len(picked) > f.Limit {
		picked = picked[:f.Limit]
	}
	return picked
}

// deadMatch reports whether d matches every field f sets. ErrorContains matches
// literally, ignoring case.
func deadMatch(f outboxdriver.DeadFilter, d archived) bool {
	m := d.msg
	switch {
	case len(f.IDs) > 0 && !slices.Contains(f.IDs, m.ID),
		f.Topic != "" && m.Topic != f.Topic,
		f.Key != "" && m.Key != f.Key,
		f.ErrorContains != "" && !strings.Contains(strings.ToLower(m.LastError), strings.ToLower(f.ErrorContains)),
		!f.Since.IsZero() && d.at.Before(f.Since),
		!f.Until.IsZero() && !d.at.Before(f.Until):
		return false
	}
	return true
}

// dropDead deletes the dead letters at the indexes picked.
func (s *Store) dropDead(picked []int) {
	drop := make(map[int]bool, len(picked))
	for _, i := range picked {
		drop[i] = true
	}
	kept := s.dead[:0]
	for i, d := range s.dead {
		if !drop[i] {
			kept = append(kept, d)
		}
	}
	clear(s.dead[len(kept):])
	s.dead = kept
}
