package outboxdriver

import (
	"context"
	"errors"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outboxkit/outbox/outboxtype"
)

// HistoryFilter selects published messages, for a replay. Since and Until bound the
// time of publication (published at or after Since, before Until); the other fields,
// when set, must all match.
type HistoryFilter struct {
	Since, Until time.Time
	// Topic is a topic, or a glob over topics: * matches any run of characters, ? one
	// ("orders.*").
	Topic         string
	Key           string
	AggregateType string
}

// Validate reports the first problem of f as a *ConfigError naming the field: a missing
// or reversed time range, a bad glob, or text no message can hold.
func (f HistoryFilter) Validate() error {
	for _, field := range []struct{ name, value string }{{"Topic", f.Topic}, {"Key", f.Key}, {"AggregateType", f.AggregateType}} {
		switch {
		case !utf8.ValidString(field.value):
			return &outboxtype.ConfigError{Field: "HistoryFilter." + field.name, Reason: "not valid UTF-8"}
		case strings.IndexByte(field.value, 0) >= 0:
			return &outboxtype.ConfigError{Field: "HistoryFilter." + field.name, Reason: "holds a NUL byte"}
		}
	}
	switch {
	case f.Since.IsZero() || f.Until.IsZero():
		return &outboxtype.ConfigError{Field: "HistoryFilter.Since", Reason: "a replay needs a time range: Since and Until"}
	case !f.Since.Before(f.Until):
		return &outboxtype.ConfigError{Field: "HistoryFilter.Until", Reason: "not after Since"}
	case strings.ContainsAny(f.Topic, `[]\`):
		return &outboxtype.ConfigError{Field: "HistoryFilter.Topic", Reason: "a topic glob takes * and ? only"}
	}
	return nil
}

// MatchTopic reports whether topic matches f.Topic (any topic when it is empty).
func (f HistoryFilter) MatchTopic(topic string) bool {
	if f.Topic == "" {
		return true
	}
	return globMatch(f.Topic, topic)
}

// globMatch matches * (any run, slashes included) and ? (one character).
func globMatch(pattern, s string) bool {
	for len(pattern) > 0 {
		switch pattern[0] {
		case '*':
			for i := len(s); i >= 0; i-- {
				if globMatch(pattern[1:], s[i:]) {
					return true
				}
			}
			return false
		case '?':
			_, n := utf8.DecodeRuneInString(s)
			if n == 0 {
				return false
			}
			pattern, s = pattern[1:], s[n:]
		default:
			if s == "" || s[0] != pattern[0] {
				return false
			}
			pattern, s = pattern[1:], s[1:]
		}
	}
	return s == ""
}

// Matches reports whether m, published at at, is selected by f.
func (f HistoryFilter) Matches(m *outboxtype.Message, at time.Time) bool {
	return !at.Before(f.Since) && at.Before(f.Until) && f.MatchTopic(m.Topic) &&
		(f.Key == "" || m.Key == f.Key) && (f.AggregateType == "" || m.AggregateType == f.AggregateType)
}

// Published is a message of the published history.
type Published struct {
	outboxtype.Message
	PublishedAt time.Time
}

// HistoryReader reads the published history, for a replay (outbox.Replay). The
// PostgreSQL stores and the in-memory store implement it.
type HistoryReader interface {
	// History returns the published messages that f selects and that were published in
	// [from, to), in the order of publication (published_at, then seq), at most limit+1
	// of them: more than limit says the span holds more, and a caller narrows it.
	History(ctx context.Context, f HistoryFilter, from, to time.Time, limit int) ([]Published, error)
	// CountHistory returns how many published messages f selects, and the earliest
	// publication time among them (zero when none).
	CountHistory(ctx context.Context, f HistoryFilter) (n int64, first time.Time, err error)
	// LiveBehind reports whether at least backlog messages have waited longer than
	// waited while a relay could send them: the relays are behind, and a replay lets
	// live traffic go first.
	LiveBehind(ctx context.Context, waited time.Duration, backlog int) (bool, error)
}

// ReplayJob is a replay's record in the store: what it selects, where it sends, and how
// far it got. Cursor is the publication time up to which every selected message was
// sent (the next span starts there).
type ReplayJob struct {
	Name        string        `json:"name"`
	Filter      HistoryFilter `json:"filter"`
	Destination string        `json:"destination"`
	State       string        `json:"state"` // running, done, failed, stopped
	Total       int64         `json:"total"`
	Sent        int64         `json:"sent"`
	Failed      int64         `json:"failed"`
	Cursor      time.Time     `json:"cursor"`
	Error       string        `json:"error,omitempty"`
	StartedAt   time.Time     `json:"started_at"`
	UpdatedAt   time.Time     `json:"updated_at"`
}

// The states of a ReplayJob.
const (
	ReplayRunning = "running"
	ReplayDone    = "done"
	ReplayFailed  = "failed"  // it stopped on an error; run it again to go on
	ReplayStopped = "stopped" // interrupted; run it again to go on
)

// ReplayJobs records replay jobs, so that a replay can be resumed and its progress
// shown. The PostgreSQL stores and the in-memory store implement it.
type ReplayJobs interface {
	// SaveReplay inserts or updates the job of j.Name.
	SaveReplay(ctx context.Context, j ReplayJob) error
	// Replay returns the job of name, or ErrNoReplay.
	Replay(ctx context.Context, name string) (ReplayJob, error)
	// Replays returns every job, the most recently updated first.
	Replays(ctx context.Context) ([]ReplayJob, error)
}

// ErrNoReplay is returned by ReplayJobs.Replay for a name that has no job.
var ErrNoReplay = errors.New("outbox: no such replay job")
