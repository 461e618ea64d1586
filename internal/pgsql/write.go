package pgsql

import (
	"encoding/json"

	"github.com/outboxkit/outbox"
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
