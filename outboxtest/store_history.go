package outboxtest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

var (
	_ outboxdriver.HistoryReader = (*Store)(nil)
	_ outboxdriver.ReplayJobs    = (*Store)(nil)
)

// History implements outboxdriver.HistoryReader over the published messages kept.
func (s *Store) History(ctx context.Context, f outboxdriver.HistoryFilter, from, to time.Time, limit int) ([]outboxdriver.Published, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []outboxdriver.Published
	for _, a := range s.history {
		if !a.at.Before(from) && a.at.Before(to) && f.Matches(&a.msg, a.at) {
			out = append(out, outboxdriver.Published{Message: a.msg, PublishedAt: a.at})
		}
	}
	slices.SortFunc(out, func(a, b outboxdriver.Published) int {
		return cmp.Or(a.PublishedAt.Compare(b.PublishedAt), cmp.Compare(a.Seq, b.Seq))
	})
	return out[:min(len(out), limit+1)], nil
}

// CountHistory implements outboxdriver.HistoryReader.
func (s *Store) CountHistory(ctx context.Context, f outboxdriver.HistoryFilter) (int64, time.Time, error) {
	if err := ctx.Err(); err != nil {
		return 0, time.Time{}, err
	}
	if err := f.Validate(); err != nil {
		return 0, time.Time{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	var first time.Time
	for _, a := range s.history {
		if f.Matches(&a.msg, a.at) {
			n++
			if first.IsZero() || a.at.Before(first) {
				first = a.at
			}
		}
	}
	return n, first, nil
}

// LiveBehind implements outboxdriver.HistoryReader: at least backlog pending messages
// have been due for longer than waited.
func (s *Store) LiveBehind(ctx context.Context, waited time.Duration, backlog int) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	n := 0
	for _, r := range s.pending {
		if r.due(now) && !r.next.After(now.Add(-waited)) {
			n++
		}
	}
	return n >= max(backlog, 1), nil
}

// SaveReplay implements outboxdriver.ReplayJobs.
func (s *Store) SaveReplay(ctx context.Context, j outboxdriver.ReplayJob) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	if old, ok := s.replays[j.Name]; ok {
		j.StartedAt = old.StartedAt
	} else {
		j.StartedAt = now
	}
	j.UpdatedAt = now
	if s.replays == nil {
		s.replays = map[string]outboxdriver.ReplayJob{}
	}
	s.replays[j.Name] = j
	return nil
}

// Replay implements outboxdriver.ReplayJobs.
func (s *Store) Replay(ctx context.Context, name string) (outboxdriver.ReplayJob, error) {
	if err := ctx.Err(); err != nil {
		return outboxdriver.ReplayJob{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.replays[name]
	if !ok {
		return outboxdriver.ReplayJob{}, fmt.Errorf("%w: %q", outboxdriver.ErrNoReplay, name)
	}
	return j, nil
}

// Replays implements outboxdriver.ReplayJobs.
func (s *Store) Replays(ctx context.Context) ([]outboxdriver.ReplayJob, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []outboxdriver.ReplayJob{}
	for _, j := range s.replays {
		out = append(out, j)
	}
	slices.SortFunc(out, func(a, b outboxdriver.ReplayJob) int {
		return cmp.Or(b.UpdatedAt.Compare(a.UpdatedAt), cmp.Compare(a.Name, b.Name))
	})
	return out, nil
}
