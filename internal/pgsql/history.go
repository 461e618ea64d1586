package pgsql

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// historyWhere renders f's conditions on the published table, other than the time
// range, with parameters numbered from next.
func historyWhere(f outboxdriver.HistoryFilter, next int) (string, []any) {
	var conds []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", next+len(args)-1)
	}
	if f.Topic != "" {
		like := strings.NewReplacer("*", "%", "?", "_").Replace(escapeLike(f.Topic))
		conds = append(conds, "topic LIKE "+arg(like)+" ESCAPE '!'")
	}
	if f.Key != "" {
		conds = append(conds, "key = "+arg(f.Key))
	}
	if f.AggregateType != "" {
		conds = append(conds, "aggregate_type = "+arg(f.AggregateType))
	}
	where := ""
	for _, c := range conds {
		where += " AND " + c
	}
	return where, args
}

// History implements outboxdriver.HistoryReader on the published table (the history
// kept from before schema version 3, in the legacy table, is not read).
func (db *DB) History(ctx context.Context, f outboxdriver.HistoryFilter, from, to time.Time, limit int) ([]outboxdriver.Published, error) {
	if err := db.ready(); err != nil {
		return nil, err
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	where, args := historyWhere(f, 4)
	sql := db.names.r(`SELECT seq, id, topic, key, aggregate_type, event_type, content_type, payload, headers::text, dedup_key, shard,
       created_at, attempts, '', published_at
FROM {{published}} WHERE published_at >= $1 AND published_at < $2` + where + ` ORDER BY published_at, seq LIMIT $3`)
	out, err := Collect(ctx, db.pool, sql, append([]any{from, to, limit + 1}, args...), func(r Row) (outboxdriver.Published, error) {
		var p outboxdriver.Published
		err := ScanMessage(r, &p.Message, &p.PublishedAt)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the published history: %w", err)
	}
	return out, nil
}

// CountHistory implements outboxdriver.HistoryReader.
func (db *DB) CountHistory(ctx context.Context, f outboxdriver.HistoryFilter) (int64, time.Time, error) {
	if err := db.ready(); err != nil {
		return 0, time.Time{}, err
	}
	if err := f.Validate(); err != nil {
		return 0, time.Time{}, err
	}
	where, args := historyWhere(f, 3)
	var n, first int64
	err := db.pool.QueryRow(ctx, db.names.r(`SELECT count(*), coalesce((extract(epoch FROM min(published_at)) * 1000000)::bigint, 0)
FROM {{published}} WHERE published_at >= $1 AND published_at < $2`+where), append([]any{f.Since, f.Until}, args...), &n, &first)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("count the published history: %w", err)
	}
	if n == 0 {
		return 0, time.Time{}, nil
	}
	return n, time.UnixMicro(first).UTC(), nil
}

// LiveBehind implements outboxdriver.HistoryReader.
func (db *DB) LiveBehind(ctx context.Context, waited time.Duration, backlog int) (bool, error) {
	if err := db.ready(); err != nil {
		return false, err
	}
	var others []string
	var behind bool
	if err := db.pool.QueryRow(ctx, db.names.Served(), []any{"", waited.Milliseconds(), max(backlog, 1)}, &others, &behind); err != nil {
		return false, fmt.Errorf("read the live backlog: %w", err)
	}
	return behind, nil
}

// SaveReplay implements outboxdriver.ReplayJobs.
func (db *DB) SaveReplay(ctx context.Context, j outboxdriver.ReplayJob) error {
	if err := db.ready(); err != nil {
		return err
	}
	filter, err := json.Marshal(j.Filter)
	if err != nil {
		return err
	}
	err = db.pool.Exec(ctx, db.names.r(`INSERT INTO `+db.names.Replays+` (name, filter, destination, state, total, sent, failed, cursor_at, error)
VALUES ($1, $2::jsonb, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (name) DO UPDATE SET filter = excluded.filter, destination = excluded.destination, state = excluded.state,
    total = excluded.total, sent = excluded.sent, failed = excluded.failed, cursor_at = excluded.cursor_at,
    error = excluded.error, updated_at = now()`),
		j.Name, string(filter), j.Destination, j.State, j.Total, j.Sent, j.Failed, j.Cursor, j.Error)
	if err != nil {
		return fmt.Errorf("record replay %q: %w", j.Name, replaysMissing(err))
	}
	return nil
}

// Replay implements outboxdriver.ReplayJobs.
func (db *DB) Replay(ctx context.Context, name string) (outboxdriver.ReplayJob, error) {
	jobs, err := db.replays(ctx, ` WHERE name = $1`, name)
	if err != nil {
		return outboxdriver.ReplayJob{}, err
	}
	if len(jobs) == 0 {
		return outboxdriver.ReplayJob{}, fmt.Errorf("%w: %q", outboxdriver.ErrNoReplay, name)
	}
	return jobs[0], nil
}

// Replays implements outboxdriver.ReplayJobs: the 100 most recently updated.
func (db *DB) Replays(ctx context.Context) ([]outboxdriver.ReplayJob, error) {
	return db.replays(ctx, ` ORDER BY updated_at DESC, name LIMIT 100`)
}

func (db *DB) replays(ctx context.Context, rest string, args ...any) ([]outboxdriver.ReplayJob, error) {
	if err := db.ready(); err != nil {
		return nil, err
	}
	jobs, err := Collect(ctx, db.pool, `SELECT name, filter::text, destination, state, total, sent, failed, cursor_at, error, started_at, updated_at FROM `+
		db.names.Replays+rest, args, func(r Row) (outboxdriver.ReplayJob, error) {
		var j outboxdriver.ReplayJob
		var filter string
		if err := r.Scan(&j.Name, &filter, &j.Destination, &j.State, &j.Total, &j.Sent, &j.Failed, &j.Cursor, &j.Error, &j.StartedAt, &j.UpdatedAt); err != nil {
			return j, err
		}
		return j, json.Unmarshal([]byte(filter), &j.Filter)
	})
	if err != nil {
		return nil, fmt.Errorf("read replay jobs: %w", replaysMissing(err))
	}
	return jobs, nil
}

// ErrNoReplayTable wraps the errors of replay jobs on an outbox without schema version
// 9.
var ErrNoReplayTable = errors.New("the outbox has no table of replay jobs: run 'outbox migrate up' (schema version 9)")

func replaysMissing(err error) error {
	if SQLState(err) == "42P01" { // undefined table
		return fmt.Errorf("%w: %w", ErrNoReplayTable, err)
	}
	return err
}
