package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// MaxMessageIDLen is the longest message id the inbox keeps (its column is bounded in
// MySQL, where it is part of the primary key).
const MaxMessageIDLen = 512

// Claim implements outboxdriver.InboxDriver: one plain INSERT per id in tx, a duplicate-key
// failure meaning "processed before". A concurrent uncommitted insert of the same row
// makes the INSERT wait: it fails if that transaction commits, and inserts if it rolls
// back. (An INSERT that skips conflicts would tell a batch apart from a duplicate only
// through affected-row counts, which MySQL's clientFoundRows setting changes.)
func (s *Store) Claim(ctx context.Context, tx *sql.Tx, consumer string, ids []string) ([]bool, error) {
	q := s.sql(`INSERT INTO {{inbox}} (consumer, message_id, processed_at) VALUES (?, ?, {{now}})`)
	fresh := make([]bool, len(ids))
	for i, id := range ids {
		if len(id) > MaxMessageIDLen {
			return nil, fmt.Errorf("%s: message id of %d bytes, longer than %d", s.d.Package, len(id), MaxMessageIDLen)
		}
		_, err := tx.ExecContext(ctx, q, consumer, id)
		switch {
		case err == nil:
			fresh[i] = true
		case !s.d.IsDuplicate(err):
			return nil, err
		}
	}
	return fresh, nil
}

// AdvanceVersion implements outboxdriver.VersionDriver: it locks the aggregate's row, then
// updates it if version is newer, or inserts it if there is none (a concurrent insert of
// the same aggregate makes this one wait, then look again).
func (s *Store) AdvanceVersion(ctx context.Context, tx *sql.Tx, consumer, aggregateType, aggregateID string, version int64) (bool, error) {
	sel := s.sql(`SELECT version FROM {{versions}} WHERE consumer = ? AND aggregate_type = ? AND aggregate_id = ?` + s.d.ForUpdate)
	for attempt := 0; ; attempt++ {
		var have int64
		err := tx.QueryRowContext(ctx, sel, consumer, aggregateType, aggregateID).Scan(&have)
		switch {
		case err == nil && have >= version:
			return false, nil
		case err == nil:
			_, err = tx.ExecContext(ctx, s.sql(`UPDATE {{versions}} SET version = ?, updated_at = {{now}}
WHERE consumer = ? AND aggregate_type = ? AND aggregate_id = ?`), version, consumer, aggregateType, aggregateID)
			return err == nil, err
		case !errors.Is(err, sql.ErrNoRows):
			return false, err
		}
		_, err = tx.ExecContext(ctx, s.sql(`INSERT INTO {{versions}} (consumer, aggregate_type, aggregate_id, version, updated_at)
VALUES (?, ?, ?, ?, {{now}})`), consumer, aggregateType, aggregateID, version)
		if err == nil || !s.d.IsDuplicate(err) || attempt == 1 {
			return err == nil, err
		}
	}
}

// DeleteInbox implements outboxdriver.InboxCleaner: it deletes up to limit inbox rows
// processed more than olderThan ago, in database time, and returns how many it deleted;
// fewer than limit means it is done for now. Run it periodically with a retention longer
// than the longest time a message can be redelivered: a message redelivered after its
// row is gone is processed again.
func (s *Store) DeleteInbox(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	if err := s.needDB(); err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, nil
	}
	var n int
	err := s.inWriteTx(ctx, func(tx Querier) error {
		rows, err := tx.QueryContext(ctx, s.sql(`SELECT consumer, message_id FROM {{inbox}} WHERE processed_at < `+
			s.d.AddMicros("{{now}}", "?")+` ORDER BY processed_at LIMIT ?`+s.d.ForUpdateSkipLocked), -olderThan.Microseconds(), limit)
		if err != nil {
			return err
		}
		var keys []any
		for rows.Next() {
			var c, id string
			if err := rows.Scan(&c, &id); err != nil {
				rows.Close()
				return err
			}
			keys = append(keys, c, id)
		}
		if err := rows.Close(); err != nil {
			return err
		}
		n = 0
		return chunks(keys, min(listChunk, s.d.MaxParams)/2*2, func(part []any) error {
			cond := strings.TrimSuffix(strings.Repeat("(consumer = ? AND message_id = ?) OR ", len(part)/2), " OR ")
			k, err := affected(tx.ExecContext(ctx, s.sql(`DELETE FROM {{inbox}} WHERE `+cond), part...))
			n += k
			return err
		})
	})
	if err != nil {
		return 0, fmt.Errorf("delete inbox rows: %w", err)
	}
	return n, nil
}
