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

// PublishedExactBelow is the size of the published table, as estimated by PostgreSQL's
// statistics, under which Status counts published rows exactly. Above it the count is an
// estimate (see Status), because counting them exactly means reading the whole table.
const PublishedExactBelow = 100_000

// Status returns a snapshot of the outbox, read in one repeatable-read transaction so
// that its figures agree with each other and share one database clock.
//
// The pending and dead figures are exact and cheap: the pending table holds only the
// backlog and the dead table only the dead letters (published messages live in a table of
// their own), so their cost follows the backlog and the dead-letter store, not the
// history kept. Published is exact while PostgreSQL estimates the published table below
// PublishedExactBelow rows; above that it is PostgreSQL's row-count estimate for that
// table (pg_class.reltuples), because only a full scan could count it exactly.
// OldestPendingAge is measured from when the message was written, so a message delayed
// with DeliverAt counts from its write too.
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
// table (every row of it is pending) and one over the dead table, joined by topic.
func (d *Driver) topicStatus(ctx context.Context, tx pgx.Tx, st *outbox.Status) error {
	q := `SELECT topic,
       coalesce(p.pending, 0), coalesce(p.due, 0), coalesce(p.retrying, 0), coalesce(x.dead, 0),
       coalesce((extract(epoch FROM greatest(now() - p.oldest, interval '0')) * 1000000)::bigint, 0)
FROM (
    SELECT topic, count(*) AS pending,
           count(*) FILTER (WHERE next_attempt_at <= now()) AS due,
           count(*) FILTER (WHERE attempts > 0) AS retrying,
           min(created_at) AS oldest
    FROM ` + d.names.Outbox + `
    GROUP BY topic
) p
FULL JOIN (
    SELECT topic, count(*) AS dead FROM ` + d.names.Dead + ` GROUP BY topic
) x USING (topic)
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

// publishedCount counts the published table exactly while it is small and estimates it
// when it is large (see Status).
func (d *Driver) publishedCount(ctx context.Context, tx pgx.Tx, st *outbox.Status) error {
	var relTuples, liveTuples int64
	err := tx.QueryRow(ctx, `SELECT greatest(c.reltuples, 0)::bigint, coalesce(s.n_live_tup, 0)
FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = to_regclass($1)`, d.names.Published).Scan(&relTuples, &liveTuples)
	if err != nil {
		return err
	}
	if max(relTuples, liveTuples) < PublishedExactBelow {
		return tx.QueryRow(ctx, `SELECT count(*) FROM `+d.names.Published).Scan(&st.Published)
	}
	// reltuples is kept by VACUUM and ANALYZE, which autovacuum runs as the table grows.
	// n_live_tup follows commits but is lost on a statistics reset and can count a batch
	// twice when an ANALYZE overtakes the report of the inserting session, so it only
	// stands in while the table has never been vacuumed or analysed.
	st.Published = relTuples
	if st.Published == 0 {
		st.Published = liveTuples
	}
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
// dead table (unaliased) and args its parameters, numbered from $1.
type deadQuery struct {
	where string
	args  []any
	limit string // " LIMIT $n", or empty
}

func (q *deadQuery) arg(v any) string {
	q.args = append(q.args, v)
	return "$" + strconv.Itoa(len(q.args))
}

// deadWhere renders f. It is a condition on the dead table, which holds nothing but dead
// letters, so no pending or published message can ever match.
func deadWhere(f outbox.DeadFilter) (*deadQuery, error) {
	if f.Limit < 0 {
		return nil, &outbox.ConfigError{Field: "DeadFilter.Limit", Reason: "must not be negative (0 means no limit)"}
	}
	q := &deadQuery{}
	var conds []string
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
	q.where = "true"
	if len(conds) > 0 {
		q.where = strings.Join(conds, " AND ")
	}
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
	sql := `SELECT ` + pgsql.ReadColumns("") + `, dead_at FROM ` + d.names.Dead + ` WHERE ` + q.where + deadOrder + q.limit
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
	sql := `SELECT count(*)::int FROM (SELECT 1 FROM ` + d.names.Dead + ` WHERE ` + q.where + q.limit + `) s`
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
// The matching dead letters are locked and moved from the dead table to the pending one
// in one transaction, and relays listening for notifications are woken in it.
func (d *Driver) DeadReplay(ctx context.Context, f outbox.DeadFilter) (int, error) {
	if err := d.needPool(); err != nil {
		return 0, err
	}
	q, err := deadWhere(f)
	if err != nil {
		return 0, err
	}
	pick := `SELECT seq FROM ` + d.names.Dead + ` WHERE ` + q.where + deadOrder + q.limit + ` FOR UPDATE`
	var n int
	err = pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, pick, q.args...)
		if err != nil {
			return err
		}
		seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil || len(seqs) == 0 {
			return err
		}
		tag, err := tx.Exec(ctx, d.names.Replay(), seqs)
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
// A purged message's dedup key is not released at once: the relay's retention cleanup
// releases it later, once it is older than the retention time. Until then a message
// written with the same dedup key is still skipped as a duplicate.
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
// published messages are not touched. Dedup keys are released later, as for DeadPurge.
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
	sql := `WITH m AS (SELECT seq FROM ` + d.names.Dead + ` WHERE ` + q.where + deadOrder + q.limit + ` FOR UPDATE)
DELETE FROM ` + d.names.Dead + ` x USING m WHERE x.seq = m.seq`
	tag, err := d.pool.Exec(ctx, sql, q.args...)
	if err != nil {
		return 0, fmt.Errorf("purge dead letters: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
