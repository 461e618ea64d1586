package sqlstore

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/shard"
)

// insertParams is the number of placeholders per message of the INSERT into the outbox
// without a priority.
const insertParams = 11

// maxChunkBytes bounds the payload and header bytes of one INSERT statement. MySQL
// refuses a packet over max_allowed_packet (16 MiB by default on MariaDB, 4 MiB on old
// servers), and a statement carrying thousands of 1 MiB payloads would also hold them
// all in the server's memory at once. A single message larger than this goes alone.
const maxChunkBytes = 2 << 20

// Insert writes msgs, validated and with defaults filled (outbox.Limits.Prepare), in tx,
// in call order, and returns the dedup keys of the messages it skipped because the key
// was taken, in call order.
//
// Each chunk of messages (bounded by the dialect's placeholder limit and by
// maxChunkBytes) costs three statements:
//
//  1. claim the chunk's dedup keys in the dedup table, each row stamped with a claim
//     number drawn for this call; a key already there (committed, or written earlier in
//     this transaction) is skipped by the dialect's conflict clause, and a key that a
//     concurrent transaction holds uncommitted makes this one wait, then skip it if that
//     one commits or claim it if that one rolls back;
//  2. read back which keys carry this call's claim number: those are the claimed ones
//     (MySQL has no INSERT ... RETURNING, and one way for both databases is one way to
//     test);
//  3. insert the messages whose key was claimed, in call order, so that seq order is
//     call order.
//
// A message whose id was generated for it (an empty DedupKey) claims nothing: its dedup
// key is its id's text, which no other message holds. A chunk of such messages costs the
// INSERT alone.
//
// Keys are claimed in sorted order: two calls claiming overlapping keys then take their
// row locks in the same order, which keeps InnoDB from deadlocking them on each other.
// No statement fails on a duplicate, so the caller's transaction stays usable.
func (s *Store) Insert(ctx context.Context, tx Querier, msgs []outbox.Message) ([]string, error) {
	if tx == nil {
		return nil, fmt.Errorf("%s: %w", s.d.Package, errNilTx)
	}
	claim := rand.Int64()
	seen := make(map[string]bool, len(msgs)) // dedup keys this call has claimed or tried
	var skipped []string
	maxRows := s.d.MaxParams / (insertParams + 1) // + 1: a priority
	for start := 0; start < len(msgs); {
		end, size := start, 0
		for end < len(msgs) && end-start < maxRows {
			b := rowBytes(&msgs[end])
			if end > start && size+b > maxChunkBytes {
				break
			}
			size += b
			end++
		}
		chunk := msgs[start:end]
		var keys []string
		for i := range chunk {
			if k := chunk[i].DedupKey; k != "" && !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
		claimed, err := s.claim(ctx, tx, claim, keys)
		if err != nil {
			return nil, fmt.Errorf("outbox insert: claim dedup keys: %w", err)
		}
		rows := make([]*outbox.Message, 0, len(chunk))
		for i := range chunk {
			m := &chunk[i]
			if m.DedupKey == "" {
				rows = append(rows, m)
			} else if claimed[m.DedupKey] {
				delete(claimed, m.DedupKey) // a second message with this key in the call is a duplicate
				rows = append(rows, m)
			} else {
				skipped = append(skipped, m.DedupKey)
			}
		}
		if err := s.insertRows(ctx, tx, rows); err != nil {
			return nil, err
		}
		start = end
	}
	return skipped, nil
}

// claim claims keys for the claim number and returns the ones it got.
func (s *Store) claim(ctx context.Context, tx Querier, claim int64, keys []string) (map[string]bool, error) {
	got := make(map[string]bool, len(keys))
	if len(keys) == 0 {
		return got, nil
	}
	sorted := slices.Sorted(slices.Values(keys))
	args := make([]any, len(sorted))
	for i, k := range sorted {
		args[i] = k
	}
	row := fmt.Sprintf("(?, %d, {{now}})", claim)
	q := s.sql(`INSERT INTO {{dedup}} (dedup_key, claim, created_at) VALUES ` +
		strings.TrimSuffix(strings.Repeat(row+", ", len(keys)), ", ") + s.d.OnConflictIgnore("dedup_key"))
	if _, err := tx.ExecContext(ctx, q, args...); err != nil {
		return nil, err
	}
	q = s.sql(fmt.Sprintf(`SELECT dedup_key FROM {{dedup}} WHERE claim = %d AND dedup_key IN (%s)`, claim, placeholders(len(keys))))
	won, err := collect(ctx, tx, scanString, q, args...)
	if err != nil {
		return nil, err
	}
	for _, k := range won {
		got[k] = true
	}
	return got, nil
}

// insertRows inserts msgs into the outbox with one multi-row INSERT. created_at and
// next_attempt_at are the database's time of the statement, so a fresh row has
// next_attempt_at = created_at and stays out of the "waiting" condition; DeliverAt
// moves next_attempt_at later, never earlier than now. The priority column is named
// only when a message has a priority: writes without one run as they did before
// schema version 4, and a write with one before it fails with errNoPriorities.
func (s *Store) insertRows(ctx context.Context, tx Querier, msgs []*outbox.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	prio := slices.ContainsFunc(msgs, func(m *outbox.Message) bool { return m.Priority != 0 })
	cols, row := "", `(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {{now}}, COALESCE(`+s.d.Greatest+`({{now}}, `+s.d.FromMicros("?")+`), {{now}})`
	if prio {
		cols, row = ", priority", row+", ?"
	}
	q := s.sql(`INSERT INTO {{outbox}} (id, topic, {{key}}, aggregate_type, event_type, content_type, payload, headers, dedup_key, shard, created_at, next_attempt_at` + cols + `) VALUES ` +
		strings.TrimSuffix(strings.Repeat(row+"), ", len(msgs)), ", "))
	args := make([]any, 0, len(msgs)*(insertParams+1))
	for _, m := range msgs {
		payload := m.Payload
		if payload == nil {
			payload = []byte{} // payload is NOT NULL; drivers send a nil slice as NULL
		}
		headers, err := encodeHeaders(m.Headers)
		if err != nil {
			return fmt.Errorf("message %s: headers: %w", m.ID, err)
		}
		var deliverAt any
		if !m.DeliverAt.IsZero() {
			deliverAt = m.DeliverAt.UnixMicro()
		}
		args = append(args, m.ID[:], m.Topic, m.Key, m.AggregateType, m.EventType, m.ContentType, payload,
			headers, m.DedupID(), shard.Of(m.Key, m.ID), deliverAt)
		if prio {
			args = append(args, m.Priority)
		}
	}
	if _, err := tx.ExecContext(ctx, q, args...); err != nil {
		if prio {
			return s.priorityError("outbox insert", err)
		}
		return fmt.Errorf("outbox insert: %w", err)
	}
	return nil
}

// idTextLen is the length of an ID's text, the dedup key of a message without one.
const idTextLen = 36

// rowBytes estimates the bytes a message adds to an INSERT (without building the text of
// a generated id, which insertRows does once).
func rowBytes(m *outbox.Message) int {
	n := 64 + len(m.Topic) + len(m.Key) + len(m.AggregateType) + len(m.EventType) + len(m.ContentType) +
		max(len(m.DedupKey), idTextLen) + len(m.Payload)
	for k, v := range m.Headers {
		n += len(k) + len(v) + 6
	}
	return n
}

// encodeHeaders returns headers as the text of a JSON object ("{}" for none).
func encodeHeaders(h map[string]string) (string, error) {
	if len(h) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(h)
	return string(b), err
}
