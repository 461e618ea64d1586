package outboxdriver

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outboxkit/outbox/outboxtype"
)

// Admin is what operators need from a store: its status and its dead letters. The
// stores of this module (outboxpgx, ...) implement it; `outbox status`, `outbox dead`
// and the web console use it.
type Admin interface {
	// Status returns a snapshot of the outbox.
	Status(ctx context.Context) (Status, error)
	// DeadList returns the dead letters that match f, the most recently dead-lettered
	// first.
	DeadList(ctx context.Context, f DeadFilter) ([]DeadLetter, error)
	// DeadCount counts the dead letters that match f, at most f.Limit when it is set:
	// what DeadReplay or DeadPurge would act on if called now.
	DeadCount(ctx context.Context, f DeadFilter) (int, error)
	// DeadReplay moves the dead letters that match f back to pending, due at once, with
	// their attempts reset and their ID, dedup key and position kept, and returns how
	// many it moved.
	DeadReplay(ctx context.Context, f DeadFilter) (int, error)
	// DeadPurge deletes the dead letters that match f and returns how many. A filter that
	// selects nothing in particular is refused with ErrEmptyDeadFilter.
	DeadPurge(ctx context.Context, f DeadFilter) (int, error)
	// DeadPurgeAll deletes every dead letter and returns how many.
	DeadPurgeAll(ctx context.Context) (int, error)
}

// ErrEmptyDeadFilter is returned by Admin.DeadPurge for a filter that selects nothing in
// particular (no IDs, Topic, Key, ErrorContains, Since or Until; a Limit alone does not
// count). Deleting every dead letter is DeadPurgeAll, so that it cannot happen by
// forgetting to fill in a field.
var ErrEmptyDeadFilter = errors.New("outbox: DeadPurge needs a filter (IDs, Topic, Key, ErrorContains, Since or Until); use DeadPurgeAll to delete every dead letter")

// Validate reports the first problem of f as a *ConfigError naming the field
// ("DeadFilter.Topic"): a negative Limit, Since not before Until, or a Topic, Key or
// ErrorContains that no message can hold (invalid UTF-8, a NUL byte). The stores check
// it before any SQL runs.
func (f DeadFilter) Validate() error {
	for _, field := range []struct{ name, value string }{{"Topic", f.Topic}, {"Key", f.Key}, {"ErrorContains", f.ErrorContains}} {
		switch {
		case !utf8.ValidString(field.value):
			return &outboxtype.ConfigError{Field: "DeadFilter." + field.name, Reason: "not valid UTF-8"}
		case strings.IndexByte(field.value, 0) >= 0:
			return &outboxtype.ConfigError{Field: "DeadFilter." + field.name, Reason: "holds a NUL byte"}
		}
	}
	switch {
	case f.Limit < 0:
		return &outboxtype.ConfigError{Field: "DeadFilter.Limit", Reason: "must not be negative (0 means no limit)"}
	case !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until):
		return &outboxtype.ConfigError{Field: "DeadFilter.Since", Reason: "is not before Until"}
	}
	return nil
}

// IsEmpty reports whether f selects nothing in particular (see ErrEmptyDeadFilter).
func (f DeadFilter) IsEmpty() bool {
	return len(f.IDs) == 0 && f.Topic == "" && f.Key == "" && f.ErrorContains == "" && f.Since.IsZero() && f.Until.IsZero()
}

// Status is a snapshot of an outbox, for `outbox status` and dashboards.
type Status struct {
	Pending          int64         `json:"pending"`            // not yet published, not dead
	Due              int64         `json:"due"`                // pending and due now
	Retrying         int64         `json:"retrying"`           // pending after at least one rejected attempt
	Delayed          int64         `json:"delayed"`            // pending and not due yet (backoff or DeliverAt)
	Dead             int64         `json:"dead"`               // dead-lettered
	DeadLastHour     int64         `json:"dead_last_hour"`     // of them, dead-lettered in the last hour (database time)
	Published        int64         `json:"published"`          // published and still kept (retention)
	OldestPendingAge time.Duration `json:"oldest_pending_age"` // age of the oldest pending message, in database time
	Topics           []TopicStatus `json:"topics"`
	// Priorities is the backlog per Message.Priority, highest first, when a pending
	// message has a priority (stores that keep them); nil otherwise.
	Priorities   []PriorityStatus `json:"priorities,omitempty"`
	Relays       []RelayInfo      `json:"relays"`
	Shards       int              `json:"shards"`
	ShardsLeased int              `json:"shards_leased"` // shards with an unexpired lease
	// Partitions describes the published history's daily partitions (PostgreSQL, schema
	// version 3); nil for a store that keeps none.
	Partitions *PartitionStatus `json:"partitions,omitempty"`
	// Ring describes the pending table's ring of buckets (PostgreSQL, schema version 4);
	// nil for a store without one.
	Ring *RingStatus `json:"ring,omitempty"`
	// OldestTransactionAge is how long the oldest transaction that holds a snapshot in the
	// outbox's database has been open (PostgreSQL: it pins the xmin horizon, so vacuum
	// removes no row deleted since it began); 0 when none is open or the store cannot tell.
	OldestTransactionAge time.Duration `json:"oldest_transaction_age"`
	// WAL describes the replication slots WAL mode reads (PostgreSQL, schema version 5,
	// after 'outbox wal setup'); empty when there are none.
	WAL []WALSlotStatus `json:"wal,omitempty"`
	// Replays are the replay jobs recorded (ReplayJobs), the most recently updated first;
	// Status leaves it empty, and outbox status fills it in.
	Replays []ReplayJob `json:"replays,omitempty"`
}

// CompareHealth orders outboxes for an overview, worst first when sorted descending:
// an outbox whose status could not be read (nil) is the worst, then by the number of
// warnings, the age of the oldest pending message, the backlog and the dead letters of
// the last hour. It returns above 0 when a is the worse, below 0 when b is, 0 for a tie.
func CompareHealth(a, b *Status) int {
	if a == nil || b == nil {
		return cmp.Compare(boolInt(a == nil), boolInt(b == nil))
	}
	return cmp.Or(
		cmp.Compare(len(a.Warnings()), len(b.Warnings())),
		cmp.Compare(a.OldestPendingAge, b.OldestPendingAge),
		cmp.Compare(a.Pending, b.Pending),
		cmp.Compare(a.DeadLastHour, b.DeadLastHour),
	)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Warnings says, one sentence each, what in s needs an operator: due messages that no
// relay holds a shard for, relays that stopped heartbeating without stopping cleanly, dead
// letters (and how many came in the last hour, when any did), and WAL-mode slots the relays cannot read. `outbox status` and the console
// show them first.
func (s Status) Warnings() []string {
	var w []string
	if s.Due > 0 && s.ShardsLeased == 0 {
		w = append(w, fmt.Sprintf("%s due and no relay holds a shard: nothing publishes them until a relay runs (outbox relay)", count(s.Due, "message is", "messages are")))
	}
	for _, r := range s.Relays {
		if !r.Live {
			w = append(w, fmt.Sprintf("relay %s (host %s, pid %d) stopped heartbeating at %s without stopping cleanly: it died or lost the database; other relays take its shards as its leases expire",
				r.ID, r.Hostname, r.PID, r.HeartbeatAt.UTC().Format(time.RFC3339)))
		}
	}
	if w1 := s.routingWarning(); w1 != "" {
		w = append(w, w1)
	}
	for _, j := range s.Replays {
		if j.State == ReplayFailed || j.State == ReplayStopped {
			w = append(w, fmt.Sprintf("replay %s %s after %d of %d messages (%s): run outbox replay --name %s to go on",
				j.Name, j.State, j.Sent+j.Failed, j.Total, cmp.Or(j.Error, "interrupted"), j.Name))
		}
	}
	switch {
	case s.DeadLastHour > 0:
		w = append(w, fmt.Sprintf("%s dead-lettered in the last hour (%s in all): a destination or a consumer may be refusing them; list them with outbox dead list --since 1h, then replay or purge them",
			count(s.DeadLastHour, "message was", "messages were"), count(s.Dead, "dead letter", "dead letters")))
	case s.Dead > 0:
		w = append(w, fmt.Sprintf("%s for an operator: list them with outbox dead list, then replay or purge them", count(s.Dead, "dead letter waits", "dead letters wait")))
	}
	for _, slot := range s.WAL {
		switch {
		case !slot.Exists:
			w = append(w, fmt.Sprintf("WAL slot %s is recorded but PostgreSQL has none: relays poll until one is made anew (outbox wal setup)", slot.Slot))
		case slot.State == "fallback":
			w = append(w, fmt.Sprintf("WAL slot %s: relays poll instead of reading it (%s)", slot.Slot, slot.Reason))
		}
	}
	return w
}

// routingWarning says when the live relays state different fingerprints: the relays
// of one wait for those of the other to stop (LeaseState.Share), during a rolling change
// of the routing or because they are configured differently.
func (s Status) routingWarning() string {
	fps := s.Fingerprints()
	if len(fps) < 2 {
		return ""
	}
	var idle []string
	holding := map[string]bool{} // fingerprints under which a relay holds shards
	for _, r := range s.Relays {
		if r.Live && r.Shards > 0 {
			holding[r.Fingerprint] = true
		}
	}
	for _, r := range s.Relays {
		if r.Live && r.Fingerprint != "" && !holding[r.Fingerprint] {
			idle = append(idle, r.ID)
		}
	}
	waiting := "relays " + strings.Join(idle, ", ") + " take no shards"
	if len(idle) == 0 {
		waiting = "relays of each hold shards until their next lease rounds settle on one"
	}
	return fmt.Sprintf("the live relays state %d different destinations and routings (fingerprints %s); %s until every relay of the routing in use stops: "+
		"a rolling change of the routing in progress, or relays configured differently",
		len(fps), strings.Join(fps, ", "), waiting)
}

// Fingerprints returns the fingerprints the live relays state (RelayInfo.Fingerprint),
// each once, in the order of Relays: more than one says that the relays of one routing
// wait for those of another to stop.
func (s Status) Fingerprints() []string {
	var fps []string
	for _, r := range s.Relays {
		if r.Live && r.Fingerprint != "" && !slices.Contains(fps, r.Fingerprint) {
			fps = append(fps, r.Fingerprint)
		}
	}
	return fps
}

// AddTopics appends topics to s.Topics, sorted by topic, and adds them up into s's
// totals (Pending, Due, Delayed, Retrying, Dead, DeadLastHour, OldestPendingAge): the
// stores count per topic and leave the sums to it.
func (s *Status) AddTopics(topics []TopicStatus) {
	for _, t := range topics {
		s.Pending += t.Pending
		s.Due += t.Due
		s.Retrying += t.Retrying
		s.Dead += t.Dead
		s.DeadLastHour += t.DeadLastHour
		s.OldestPendingAge = max(s.OldestPendingAge, t.OldestPendingAge)
	}
	s.Delayed = s.Pending - s.Due
	if s.Topics == nil {
		s.Topics = []TopicStatus{} // none: an empty list, in JSON too
	}
	s.Topics = append(s.Topics, topics...)
	slices.SortFunc(s.Topics, func(a, b TopicStatus) int { return cmp.Compare(a.Topic, b.Topic) })
}

// count renders n with the words for one or for several.
func count(n int64, one, several string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.FormatInt(n, 10) + " " + several
}

// WALSlotStatus is one WAL-mode slot as the outbox records it and PostgreSQL reports it.
type WALSlotStatus struct {
	Slot string `json:"slot"`
	// State is what the relay holding the slot's lease recorded: starting, streaming,
	// or fallback (polling) with Reason; StateSince is when it last changed.
	State      string    `json:"state"`
	Reason     string    `json:"reason,omitempty"`
	StateSince time.Time `json:"state_since"`
	Reader     string    `json:"reader,omitempty"` // the relay holding the slot's lease
	// Exists is false when the slot is recorded but PostgreSQL has none (dropped by
	// hand, or lost in a failover): the relays poll. The rest is PostgreSQL's view.
	Exists bool `json:"exists"`
	Active bool `json:"active"` // a session reads it
	// WALStatus is reserved, extended, unreserved or lost; LagBytes how far the slot's
	// confirmed position is behind the server's WAL; RetainedBytes how much WAL it keeps;
	// SafeWALSizeBytes how much more WAL may be written before it is lost (nil: no
	// limit, max_slot_wal_keep_size = -1).
	WALStatus        string `json:"wal_status,omitempty"`
	LagBytes         int64  `json:"lag_bytes"`
	RetainedBytes    int64  `json:"retained_bytes"`
	SafeWALSizeBytes *int64 `json:"safe_wal_size_bytes,omitempty"`
}

// PartitionStatus describes the daily partitions of the published history.
type PartitionStatus struct {
	Count     int       `json:"count"`
	Oldest    time.Time `json:"oldest"`     // the oldest day with a partition (UTC midnight); zero when none
	Newest    time.Time `json:"newest"`     // the newest
	DaysAhead int       `json:"days_ahead"` // days after today (UTC) that have a partition, with none missing from today; -1 when today has none
}

// RingStatus describes the pending table's ring of buckets.
type RingStatus struct {
	Current   int   `json:"current"`   // the bucket writers append to
	Rotations int64 `json:"rotations"` // times the ring moved on since it was created
	// RowsSinceRotation counts the messages written since the current bucket became
	// current. Far above the store's RotateRows, the other bucket cannot be emptied: more
	// than a thousand of its messages stay pending (scheduled far ahead, or backing off).
	RowsSinceRotation int64 `json:"rows_since_rotation"`
}

// TopicStatus is Status for one topic.
type TopicStatus struct {
	Topic            string        `json:"topic"`
	Pending          int64         `json:"pending"`
	Due              int64         `json:"due"`
	Retrying         int64         `json:"retrying"`
	Dead             int64         `json:"dead"`
	DeadLastHour     int64         `json:"dead_last_hour"`
	OldestPendingAge time.Duration `json:"oldest_pending_age"`
}

// PriorityStatus is the backlog of one priority.
type PriorityStatus struct {
	Priority         int           `json:"priority"`
	Pending          int64         `json:"pending"`
	Due              int64         `json:"due"`
	OldestPendingAge time.Duration `json:"oldest_pending_age"`
}

// AddPriorities sets s.Priorities from the backlog of each priority, when one above 0
// has messages, sorted highest first.
func (s *Status) AddPriorities(prios []PriorityStatus) {
	s.Priorities = nil
	if !slices.ContainsFunc(prios, func(p PriorityStatus) bool { return p.Priority > 0 && p.Pending > 0 }) {
		return
	}
	s.Priorities = slices.Clone(prios)
	slices.SortFunc(s.Priorities, func(a, b PriorityStatus) int { return cmp.Compare(b.Priority, a.Priority) })
}

// RelayInfo describes a relay seen by the store.
type RelayInfo struct {
	ID          string    `json:"id"`
	Hostname    string    `json:"hostname"`
	PID         int       `json:"pid"`
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
	Live        bool      `json:"live"`
	Shards      int       `json:"shards"`
	// Fingerprint identifies the relay's destinations and routing
	// (LeaseRequest.Fingerprint); empty when it stated none.
	Fingerprint string `json:"fingerprint,omitempty"`
	// Destinations is the state of each of the relay's destinations at its last
	// heartbeat (LeaseRequest.Destinations); empty for a relay of one broker.
	Destinations []DestinationState `json:"destinations,omitempty"`
}

// EncodeDestinations renders a relay's destination states for a store's text column:
// JSON, of as many of the first MaxDestinationStates as fit in 4,000 bytes; empty for
// none.
func EncodeDestinations(ds []DestinationState) string {
	for n := min(len(ds), MaxDestinationStates); n > 0; n-- {
		b, err := json.Marshal(ds[:n])
		if err != nil { // (strings, booleans and times: it cannot fail)
			return ""
		}
		if len(b) <= 4000 {
			return string(b)
		}
	}
	return ""
}

// DecodeDestinations reads what EncodeDestinations wrote: nil for empty text, or text
// that does not parse (a store's column is not the place to fail a status read).
func DecodeDestinations(text string) []DestinationState {
	var ds []DestinationState
	if text == "" || json.Unmarshal([]byte(text), &ds) != nil {
		return nil
	}
	return ds
}

// DeadFilter selects dead letters. Zero fields match everything; set fields must all
// match.
type DeadFilter struct {
	IDs           []outboxtype.ID
	Topic         string
	Key           string
	ErrorContains string    // substring of the last error, case-insensitive
	Since, Until  time.Time // dead-lettered at or after Since, before Until
	Limit         int       // at most this many (list, replay, purge); 0 means no limit
}

// DeadLetter is a dead-lettered message with why it died.
type DeadLetter struct {
	outboxtype.Message
	DeadAt time.Time `json:"dead_at"`
}

// String describes the filter in one line, for logs and messages: `topic="orders"
// error~"timeout" since=2026-11-21T10:00:00Z`; "" for a filter that selects nothing in
// particular. Limit is left out.
func (f DeadFilter) String() string {
	var parts []string
	if len(f.IDs) > 0 {
		ids := make([]string, len(f.IDs))
		for i, id := range f.IDs {
			ids[i] = id.String()
		}
		parts = append(parts, "id="+strings.Join(ids, ","))
	}
	if f.Topic != "" {
		parts = append(parts, "topic="+strconv.Quote(f.Topic))
	}
	if f.Key != "" {
		parts = append(parts, "key="+strconv.Quote(f.Key))
	}
	if f.ErrorContains != "" {
		parts = append(parts, "error~"+strconv.Quote(f.ErrorContains))
	}
	if !f.Since.IsZero() {
		parts = append(parts, "since="+f.Since.UTC().Format(time.RFC3339))
	}
	if !f.Until.IsZero() {
		parts = append(parts, "until="+f.Until.UTC().Format(time.RFC3339))
	}
	return strings.Join(parts, " ")
}

// Describe says which n dead letters f selects, for messages: "2 dead letters matching
// topic="orders"", "the newest 5 dead letters", "all 7 dead letters".
func (f DeadFilter) Describe(n int) string {
	what := fmt.Sprintf("%d dead letters", n)
	switch {
	case f.Limit > 0 && n == f.Limit && n == 1:
		what = "the newest dead letter"
	case f.Limit > 0 && n == f.Limit:
		what = fmt.Sprintf("the newest %d dead letters", n)
	case n == 1:
		what = "1 dead letter"
	}
	parts := f.String()
	switch {
	case parts != "":
		return what + " matching " + parts
	case n == 1 && !strings.HasPrefix(what, "the "):
		return "the only dead letter"
	case n > 1 && !strings.HasPrefix(what, "the "):
		return "all " + what
	}
	return what
}
