package outboxpgx

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/pgsql"
)

// This file is the operator's side of the driver: the figures behind `outbox status`
// and the dead-letter tooling behind `outbox dead`. Every statement is built from the
// driver's validated, quoted names; every value travels as a parameter.

// ErrEmptyDeadFilter is returned by DeadPurge for a filter that selects nothing in
// particular (no IDs, Topic, Key, ErrorContains, Since or Until; a Limit alone does not
// count). Deleting every dead letter is DeadPurgeAll, so that it cannot happen by
// forgetting to fill in a field.
var ErrEmptyDeadFilter = errors.New("outboxpgx: DeadPurge needs a filter (IDs, Topic, Key, ErrorContains, Since or Until); use DeadPurgeAll to delete every dead letter")

// PublishedExactBelow is the table size, as estimated by PostgreSQL's statistics, under
// which Status counts published rows exactly. Above it the count is an estimate (see
// Status), because counting published rows means reading the whole table.
const PublishedExactBelow = 100_000

// Status returns a snapshot of the outbox, read in one repeatable-read transaction so
// that its figures agree with each other and share one database clock.
//
// The pending and dead figures are exact and cheap: they read only the rows that the
// partial "pending" and "dead" indexes cover, so their cost follows the backlog and the
// dead-letter store, not the table's history. Published is exact while PostgreSQL
// estimates the table below PublishedExactBelow rows; above that it is an estimate (the
// table's live-row statistics minus the exact pending and dead counts), because only a
// full scan could count it exactly. OldestPendingAge is measured from when the message
// was written, so a message delayed with DeliverAt counts from its write too.
//
// Relays lists the relays in the relays table (expired ones are kept about an hour and
// shown with Live false) with the number of shards each holds an unexpired lease on.
func (d *Driver) Status(ctx context.Context) (outbox.Status, error) {
	if err := d.needPool(); err != nil {
		return outbox.Status{}, err
	}
	st := outbox.Status{Topics: []outbox.TopicStatus{}, Relays: []outbox.RelayInfo{}}
	opts := pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}
	err := pgx.BeginTxFunc(ctx, d.pool, opts, func(tx pgx.Tx) error {
		// On a large table the planner's estimates cross jit_above_cost, and compiling
		// costs more than these index scans; dashboards poll this.
		if _, err := tx.Exec(ctx, `SET LOCAL jit = off`); err != nil {
			return err
		}
		if err := d.topicStatus(ctx, tx, &st); err != nil {
			return fmt.Errorf("count pending and dead: %w", err)
		}
		if err := d.publishedCount(ctx, tx, &st); err != nil {
			return fmt.Errorf("count published: %w", err)
		}
		if err := d.relayStatus(ctx, tx, &st); err != nil {
			return fmt.Errorf("read relays and leases: %w", err)
		}
		return nil
	})
	if err != nil {
		return outbox.Status{}, fmt.Errorf("outbox status: %w", err)
	}
	return st, nil
}

// topicStatus fills the per-topic rows and the totals from one pass over the pending
// and dead rows. The UNION ALL keeps each arm on its own partial index.
func (d *Driver) topicStatus(ctx context.Context, tx pgx.Tx, st *outbox.Status) error {
	q := `SELECT topic,
       count(*) FILTER (WHERE NOT dead),
       count(*) FILTER (WHERE NOT dead AND next_attempt_at <= now()),
       count(*) FILTER (WHERE NOT dead AND attempts > 0),
       count(*) FILTER (WHERE dead),
       coalesce((extract(epoch FROM greatest(now() - min(created_at) FILTER (WHERE NOT dead), interval '0')) * 1000000)::bigint, 0)
FROM (
    SELECT topic, next_attempt_at, attempts, created_at, false AS dead
    FROM ` + d.names.Outbox + ` WHERE published_at IS NULL AND dead_at IS NULL
    UNION ALL
    SELECT topic, NULL::timestamptz, 0, NULL::timestamptz, true
    FROM ` + d.names.Outbox + ` WHERE dead_at IS NOT NULL
) s
GROUP BY topic
ORDER BY topic`
	rows, err := tx.Query(ctx, q)
	if err != nil {
		return err
	}
	topics, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outbox.TopicStatus, error) {
		var t outbox.TopicStatus
		var ageMicros int64
		err := r.Scan(&t.Topic, &t.Pending, &t.Due, &t.Retrying, &t.Dead, &ageMicros)
		t.OldestPendingAge = time.Duration(ageMicros) * time.Microsecond
		return t, err
	})
	if err != nil {
		return err
	}
	for _, t := range topics {
		st.Pending += t.Pending
		st.Due += t.Due
		st.Retrying += t.Retrying
		st.Dead += t.Dead
		st.OldestPendingAge = max(st.OldestPendingAge, t.OldestPendingAge)
	}
	st.Delayed = st.Pending - st.Due
	st.Topics = append(st.Topics, topics...)
	return nil
}

// publishedCount counts published rows exactly on small tables and estimates them on
// large ones (see Status).
func (d *Driver) publishedCount(ctx context.Context, tx pgx.Tx, st *outbox.Status) error {
	var relTuples, liveTuples int64
	err := tx.QueryRow(ctx, `SELECT greatest(c.reltuples, 0)::bigint, coalesce(s.n_live_tup, 0)
FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = to_regclass($1)`, d.names.Outbox).Scan(&relTuples, &liveTuples)
	if err != nil {
		return err
	}
	if max(relTuples, liveTuples) < PublishedExactBelow {
		return tx.QueryRow(ctx, `SELECT count(*) FROM `+d.names.Outbox+` WHERE published_at IS NOT NULL`).Scan(&st.Published)
	}
	// n_live_tup follows every commit; reltuples only VACUUM and ANALYZE.
	total := liveTuples
	if total == 0 {
		total = relTuples
	}
	st.Published = max(total-st.Pending-st.Dead, 0)
	return nil
}

func (d *Driver) relayStatus(ctx context.Context, tx pgx.Tx, st *outbox.Status) error {
	rows, err := tx.Query(ctx, `SELECT r.id, r.hostname, r.pid, r.started_at, r.heartbeat_at, r.expires_at > now(),
       (SELECT count(*) FROM `+d.names.Leases+` l WHERE l.owner = r.id AND l.expires_at > now())::int
FROM `+d.names.Relays+` r
ORDER BY r.started_at, r.id`)
	if err != nil {
		return err
	}
	relays, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outbox.RelayInfo, error) {
		var ri outbox.RelayInfo
		var pid int32
		err := r.Scan(&ri.ID, &ri.Hostname, &pid, &ri.StartedAt, &ri.HeartbeatAt, &ri.Live, &ri.Shards)
		ri.PID = int(pid)
		return ri, err
	})
	if err != nil {
		return err
	}
	st.Relays = append(st.Relays, relays...)
	return tx.QueryRow(ctx, `SELECT count(*)::int, (count(*) FILTER (WHERE owner IS NOT NULL AND expires_at > now()))::int
FROM `+d.names.Leases).Scan(&st.Shards, &st.ShardsLeased)
}

// deadQuery is a dead-letter selection rendered as SQL: where is a condition on the
// outbox table (unaliased) and args its parameters, numbered from $1.
type deadQuery struct {
	where string
	args  []any
	limit string // " LIMIT $n", or empty
}

func (q *deadQuery) arg(v any) string {
	q.args = append(q.args, v)
	return "$" + strconv.Itoa(len(q.args))
}

// deadWhere renders f. Every condition includes dead_at IS NOT NULL, so the "dead"
// partial index serves it and no pending or published row can ever match.
func deadWhere(f outbox.DeadFilter) (*deadQuery, error) {
	if f.Limit < 0 {
		return nil, &outbox.ConfigError{Field: "DeadFilter.Limit", Reason: "must not be negative (0 means no limit)"}
	}
	q := &deadQuery{}
	conds := []string{"dead_at IS NOT NULL"}
	if len(f.IDs) > 0 {
		ids := make([][16]byte, len(f.IDs))
		for i, id := range f.IDs {
			ids[i] = id
		}
		conds = append(conds, "id = ANY("+q.arg(ids)+"::uuid[])")
	}
	if f.Topic != "" {
		conds = append(conds, "topic = "+q.arg(f.Topic))
	}
	if f.Key != "" {
		conds = append(conds, "key = "+q.arg(f.Key))
	}
	if f.ErrorContains != "" {
		conds = append(conds, "last_error ILIKE "+q.arg("%"+escapeLike(f.ErrorContains)+"%")+" ESCAPE '!'")
	}
	if !f.Since.IsZero() {
		conds = append(conds, "dead_at >= "+q.arg(f.Since))
	}
	if !f.Until.IsZero() {
		conds = append(conds, "dead_at < "+q.arg(f.Until))
	}
	q.where = strings.Join(conds, " AND ")
	if f.Limit > 0 {
		q.limit = " LIMIT " + q.arg(f.Limit)
	}
	return q, nil
}

// escapeLike makes s match literally in a LIKE pattern whose escape character is '!'.
func escapeLike(s string) string {
	return strings.NewReplacer("!", "!!", "%", "!%", "_", "!_").Replace(s)
}

// emptyDeadFilter reports whether f selects every dead letter (Limit aside).
func emptyDeadFilter(f outbox.DeadFilter) bool {
	return len(f.IDs) == 0 && f.Topic == "" && f.Key == "" && f.ErrorContains == "" && f.Since.IsZero() && f.Until.IsZero()
}

// deadOrder is the order of DeadList, and the order in which a Limit picks the dead
// letters that DeadReplay and DeadPurge act on: the same rows a list shows.
const deadOrder = " ORDER BY dead_at DESC, seq DESC"

// DeadList returns the dead letters that match f, most recently dead-lettered first.
func (d *Driver) DeadList(ctx context.Context, f outbox.DeadFilter) ([]outbox.DeadLetter, error) {
	if err := d.needPool(); err != nil {
		return nil, err
	}
	q, err := deadWhere(f)
	if err != nil {
		return nil, err
	}
	sql := `SELECT ` + pgsql.ReadColumns("") + `, dead_at FROM ` + d.names.Outbox + ` WHERE ` + q.where + deadOrder + q.limit
	rows, err := d.pool.Query(ctx, sql, q.args...)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanDeadLetter)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}

func scanDeadLetter(row pgx.CollectableRow) (outbox.DeadLetter, error) {
	var dl outbox.DeadLetter
	m := &dl.Message
	var id [16]byte
	var headers []byte
	var shard int16
	if err := row.Scan(&m.Seq, &id, &m.Topic, &m.Key, &m.AggregateType, &m.EventType, &m.ContentType, &m.Payload,
		&headers, &m.DedupKey, &shard, &m.CreatedAt, &m.Attempts, &m.LastError, &dl.DeadAt); err != nil {
		return dl, err
	}
	m.ID = id
	m.Shard = int(shard)
	if len(headers) > 2 {
		if err := json.Unmarshal(headers, &m.Headers); err != nil {
			return dl, fmt.Errorf("message %d: headers: %w", m.Seq, err)
		}
	}
	return dl, nil
}

// DeadCount returns how many dead letters match f (at most f.Limit when it is set): what
// DeadReplay or DeadPurge would act on if called now.
func (d *Driver) DeadCount(ctx context.Context, f outbox.DeadFilter) (int, error) {
	if err := d.needPool(); err != nil {
		return 0, err
	}
	q, err := deadWhere(f)
	if err != nil {
		return 0, err
	}
	var n int
	sql := `SELECT count(*)::int FROM (SELECT 1 FROM ` + d.names.Outbox + ` WHERE ` + q.where + q.limit + `) s`
	if err := d.pool.QueryRow(ctx, sql, q.args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count dead letters: %w", err)
	}
	return n, nil
}

// DeadReplay moves the dead letters that match f back to pending, due at once, with
// their attempt count reset, and returns how many it moved. With f.Limit set it takes the
// ones DeadList would show first.
//
// A replayed message keeps its ID, dedup key and position (seq), so it reaches the broker
// with the identity it was written with and consumers that already saw it (a broker that
// accepted it but whose confirmation was lost) deduplicate it as usual. Replayed messages
// of one key are published in their original order; messages of that key written after
// them and already published are not held back, so a consumer sees the replayed message
// after its successors. The last error is kept until the next attempt overwrites it, for
// whoever investigates a message that fails again.
//
// Relays listening for notifications are woken in the same transaction.
func (d *Driver) DeadReplay(ctx context.Context, f outbox.DeadFilter) (int, error) {
	if err := d.needPool(); err != nil {
		return 0, err
	}
	q, err := deadWhere(f)
	if err != nil {
		return 0, err
	}
	sql := `WITH m AS (SELECT seq FROM ` + d.names.Outbox + ` WHERE ` + q.where + deadOrder + q.limit + ` FOR UPDATE)
UPDATE ` + d.names.Outbox + ` o SET dead_at = NULL, attempts = 0, next_attempt_at = now()
FROM m WHERE o.seq = m.seq AND o.dead_at IS NOT NULL`
	var n int
	err = pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, sql, q.args...)
		if err != nil {
			return err
		}
		n = int(tag.RowsAffected())
		if n > 0 {
			_, err = tx.Exec(ctx, `SELECT pg_notify($1, '')`, d.names.Channel)
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("replay dead letters: %w", err)
	}
	return n, nil
}

// DeadPurge deletes the dead letters that match f and returns how many it deleted. With
// f.Limit set it takes the ones DeadList would show first.
//
// A filter that selects nothing in particular is refused with ErrEmptyDeadFilter:
// deleting everything is DeadPurgeAll.
func (d *Driver) DeadPurge(ctx context.Context, f outbox.DeadFilter) (int, error) {
	if emptyDeadFilter(f) {
		return 0, ErrEmptyDeadFilter
	}
	return d.deadPurge(ctx, f)
}

// DeadPurgeAll deletes every dead letter and returns how many it deleted. Pending and
// published messages are not touched.
func (d *Driver) DeadPurgeAll(ctx context.Context) (int, error) {
	return d.deadPurge(ctx, outbox.DeadFilter{})
}

func (d *Driver) deadPurge(ctx context.Context, f outbox.DeadFilter) (int, error) {
	if err := d.needPool(); err != nil {
		return 0, err
	}
	q, err := deadWhere(f)
	if err != nil {
		return 0, err
	}
	sql := `WITH m AS (SELECT seq FROM ` + d.names.Outbox + ` WHERE ` + q.where + deadOrder + q.limit + ` FOR UPDATE)
DELETE FROM ` + d.names.Outbox + ` o USING m WHERE o.seq = m.seq AND o.dead_at IS NOT NULL`
	tag, err := d.pool.Exec(ctx, sql, q.args...)
	if err != nil {
		return 0, fmt.Errorf("purge dead letters: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
