package pgsql

import (
	"encoding/json"
	"fmt"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
)

// SkippedKeys returns the dedup keys of msgs that are not in written (the keys an insert
// returned), in call order. A dedup key used twice in one call is written once and
// skipped once.
func SkippedKeys(msgs []outbox.Message, written []string) []string {
	if len(written) == len(msgs) {
		return nil
	}
	left := make(map[string]int, len(written))
	for _, k := range written {
		left[k]++
	}
	var skipped []string
	for i := range msgs {
		k := msgs[i].DedupID()
		if left[k] > 0 {
			left[k]--
			continue
		}
		skipped = append(skipped, k)
	}
	return skipped
}

// EncodeHeaders returns headers as the text of a JSON object ("{}" for none), as the
// headers column takes it.
func EncodeHeaders(h map[string]string) (string, error) {
	if len(h) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(h)
	return string(b), err
}

// HasPriority reports whether any of msgs has a priority: its insert must name the
// priority column (InsertUnnest, InsertValues).
func HasPriority(msgs []outbox.Message) bool {
	for i := range msgs {
		if msgs[i].Priority != 0 {
			return true
		}
	}
	return false
}

// InsertError wraps err, a failed insert's: with the outboxdriver.ErrNoPriorities it
// means when the insert named the priority column (prio) and the column is not there.
func InsertError(err error, prio bool) error {
	if prio && SQLState(err) == "42703" { // undefined column
		return fmt.Errorf("outbox insert: %w before schema version 10: run outbox migrate up (%w)", outboxdriver.ErrNoPriorities, err)
	}
	return fmt.Errorf("outbox insert: %w", err)
}

// PriorityFetchArgs returns FetchPriority's parameters after the relay id and the
// shards: the seqs the relay holds, the limit, and the keys it holds.
func PriorityFetchArgs(req outboxdriver.FetchRequest) (exclude []int64, limit int, held string, err error) {
	exclude = req.Exclude
	if exclude == nil {
		exclude = []int64{}
	}
	held, err = HeldKeys(req.Held())
	return exclude, req.Limit, held, err
}

// PriorityFetchError wraps err, a failed FetchPriority's: with the
// outboxdriver.ErrNoPriorities it means when the outbox has no priority column yet.
func PriorityFetchError(err error) error {
	if SQLState(err) == "42703" { // undefined column
		return fmt.Errorf("fetch by priority: %w before schema version 10 (%w)", outboxdriver.ErrNoPriorities, err)
	}
	return fmt.Errorf("fetch by priority: %w", err)
}
