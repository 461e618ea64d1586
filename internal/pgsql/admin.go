package pgsql

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// This file holds the operator's side (outboxdriver.Admin): the statements behind
// `outbox status` and the dead-letter selections behind `outbox dead`, and DB's methods
// that run them for both drivers, whose documentation they carry. Every statement is
// built from validated, quoted names; every value travels as a parameter, of a type any
// driver binds (string, int, time.Time), arrays included (see TextArray).

// PublishedExactBelow is the size of the published table, as estimated by PostgreSQL's
// statistics, under which Status counts published rows exactly. Above it the count is an
// estimate, because counting exactly means reading the whole table.
const PublishedExactBelow = 100_000

// NoJIT turns JIT compilation off for the rest of the transaction. On a large table the
// planner's estimates cross jit_above_cost, and compiling costs more than the index scans
// of the relay's and the operator's statements.
const NoJIT = `SET LOCAL jit = off`

// StatusTopics returns one row per topic with pending or dead messages: topic, pending,
// due, retrying, dead, and the age of the oldest pending message in microseconds, in
// topic order. It reads the pending table once (every row of it is pending) and the dead
// table once.
func (n *Names) StatusTopics() string {
	return n.r(`SELECT topic,
       coalesce(p.pending, 0), coalesce(p.due, 0), coalesce(p.retrying, 0), coalesce(x.dead, 0), coalesce(x.dead_hour, 0),
       coalesce((extract(epoch FROM greatest(now() - p.oldest, interval '0')) * 1000000)::bigint, 0)
FROM (
    SELECT topic, count(*) AS pending,
           count(*) FILTER (WHERE next_attempt_at <= now()) AS due,
           count(*) FILTER (WHERE attempts > 0) AS retrying,
           min(created_at) AS oldest
    FROM {{outbox}}
    GROUP BY topic
) p
FULL JOIN (
    SELECT topic, count(*) AS dead, count(*) FILTER (WHERE dead_at > now() - interval '1 hour') AS dead_hour
    FROM {{dead}} GROUP BY topic
) x USING (topic)
ORDER BY topic`)
}

// StatusPriorities returns one row per priority with pending messages: priority,
// pending, due, and the age of the oldest in microseconds (schema version 10).
func (n *Names) StatusPriorities() string {
	return n.r(`SELECT priority, count(*), count(*) FILTER (WHERE next_attempt_at <= now()),
       coalesce((extract(epoch FROM greatest(now() - min(created_at), interval '0')) * 1000000)::bigint, 0)
FROM {{outbox}} GROUP BY priority`)
}

// StatusPublishedStats returns PostgreSQL's two row counts of the published history: the
// planner's estimate (reltuples) and the statistics collector's live rows (n_live_tup),
// each summed over the published table's partitions (migration 3) and the history kept
// from before it; and whether that kept history exists (for StatusPublishedCount).
func (n *Names) StatusPublishedStats() (string, []any) {
	return `SELECT coalesce(sum(greatest(c.reltuples, 0)), 0)::bigint, coalesce(sum(s.n_live_tup), 0)::bigint,
       to_regclass($2) IS NOT NULL
FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_stat_user_tables s ON s.relid = c.oid
WHERE c.relkind = 'r' AND (c.oid IN (SELECT relid FROM pg_partition_tree(to_regclass($1))) OR c.oid = to_regclass($2))`,
		[]any{n.Published, n.PublishedLegacy}
}

// StatusPublishedCount counts the published history exactly, with the history kept from
// before migration 3 when legacy says it exists.
func (n *Names) StatusPublishedCount(legacy bool) string {
	if legacy {
		return n.r(`SELECT (SELECT count(*) FROM {{published}}) + (SELECT count(*) FROM `) + n.PublishedLegacy + `)`
	}
	return n.r(`SELECT count(*) FROM {{published}}`)
}

// PublishedEstimate decides from the two counts of StatusPublishedStats whether the
// published table is small enough to count exactly (ok false: run StatusPublishedCount)
// and otherwise returns the estimate to show.
//
// reltuples is kept by VACUUM and ANALYZE, which autovacuum runs as the table grows.
// n_live_tup follows commits but is lost on a statistics reset and can count a batch twice
// when an ANALYZE overtakes the report of the inserting session, so it only stands in
// while the table has never been vacuumed or analysed.
func PublishedEstimate(relTuples, liveTuples int64) (estimate int64, ok bool) {
	if max(relTuples, liveTuples) < PublishedExactBelow {
		return 0, false
	}
	if relTuples == 0 {
		return liveTuples, true
	}
	return relTuples, true
}

// StatusRelays returns the relays of the relays table (expired ones are kept about an
// hour) in start order: id, hostname, pid, started_at, heartbeat_at, live, the number
// of shards each holds a lease on while live (a lease lives by its owner's heartbeat),
// its fingerprint and its destinations' states (empty before schema version 8, which the
// row's JSON form lets the query read without the columns).
func (n *Names) StatusRelays() string {
	return n.r(`SELECT r.id, r.hostname, r.pid, r.started_at, r.heartbeat_at, r.expires_at > now(),
       CASE WHEN r.expires_at > now() THEN (SELECT count(*) FROM {{leases}} l WHERE l.owner = r.id) ELSE 0 END::int,
       coalesce(to_jsonb(r) ->> 'fingerprint', ''), coalesce(to_jsonb(r) ->> 'destinations', '')
FROM {{relays}} r
ORDER BY r.started_at, r.id`)
}

// StatusShards returns the number of shards and of shards whose owner is live.
func (n *Names) StatusShards() string {
	return n.r(`SELECT count(*)::int,
       (count(*) FILTER (WHERE EXISTS (SELECT 1 FROM {{relays}} r WHERE r.id = l.owner AND r.expires_at > now())))::int
FROM {{leases}} l`)
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
func deadWhere(f outboxdriver.DeadFilter) (*deadQuery, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	q := &deadQuery{}
	var conds []string
	if len(f.IDs) > 0 {
		ids := make([]string, len(f.IDs))
		for i, id := range f.IDs {
			ids[i] = id.String()
		}
		conds = append(conds, "id = ANY("+q.arg(TextArray(ids))+"::uuid[])")
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

// deadOrder is the order of DeadList, and the order in which a Limit picks the dead
// letters that replay and purge act on: the same rows a list shows.
const deadOrder = " ORDER BY dead_at DESC, seq DESC"

// DeadList selects the dead letters that match f, most recently dead-lettered first:
// the columns of ReadColumns(""), then dead_at. A negative f.Limit is a *ConfigError.
func (n *Names) DeadList(f outboxdriver.DeadFilter) (string, []any, error) {
	q, err := deadWhere(f)
	if err != nil {
		return "", nil, err
	}
	return `SELECT ` + ReadColumns("") + `, dead_at FROM ` + n.Dead + ` WHERE ` + q.where + deadOrder + q.limit, q.args, nil
}

// DeadCount counts the dead letters that match f, at most f.Limit when it is set: what a
// replay or purge would act on if run now.
func (n *Names) DeadCount(f outboxdriver.DeadFilter) (string, []any, error) {
	q, err := deadWhere(f)
	if err != nil {
		return "", nil, err
	}
	return `SELECT count(*)::int FROM (SELECT 1 FROM ` + n.Dead + ` WHERE ` + q.where + q.limit + `) s`, q.args, nil
}

// DeadPick locks the dead letters that match f, in DeadList's order, and returns their
// seqs, for Replay in the same transaction.
func (n *Names) DeadPick(f outboxdriver.DeadFilter) (string, []any, error) {
	q, err := deadWhere(f)
	if err != nil {
		return "", nil, err
	}
	return `SELECT seq FROM ` + n.Dead + ` WHERE ` + q.where + deadOrder + q.limit + ` FOR UPDATE`, q.args, nil
}

// DeadPurge deletes the dead letters that match f, in DeadList's order when f.Limit is
// set; its rows affected are the dead letters deleted. Refusing an empty filter is the
// caller's business (outboxdriver.ErrEmptyDeadFilter).
func (n *Names) DeadPurge(f outboxdriver.DeadFilter) (string, []any, error) {
	q, err := deadWhere(f)
	if err != nil {
		return "", nil, err
	}
	return `WITH m AS (SELECT seq FROM ` + n.Dead + ` WHERE ` + q.where + deadOrder + q.limit + ` FOR UPDATE)
DELETE FROM ` + n.Dead + ` x USING m WHERE x.seq = m.seq`, q.args, nil
}

// Notify wakes the relays that listen on the outbox's channel, at commit.
func (n *Names) Notify() (string, []any) {
	return `SELECT pg_notify($1, '')`, []any{n.Channel}
}

// statusPartitions returns, when the published history is partitioned (migration 3), the
// number of daily partitions, the oldest and newest day (YYYYMMDD), and the days after
// today (UTC, by the database's clock) that have a partition with no gap from today, -1
// when today has none; no row before migration 3.
func (n *Names) statusPartitions() (string, []any) {
	return `WITH p AS (
    SELECT oid FROM pg_catalog.pg_class WHERE oid = to_regclass($1) AND relkind = 'p'
), d AS (
    SELECT to_date(right(c.relname, 8), 'YYYYMMDD') AS day
    FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid JOIN p ON i.inhparent = p.oid
    WHERE c.relname ~ '^` + n.prefix + `outbox_published_[0-9]{8}$'
)
SELECT (SELECT count(*)::int FROM d),
       coalesce((SELECT to_char(min(day), 'YYYYMMDD')::int FROM d), 0),
       coalesce((SELECT to_char(max(day), 'YYYYMMDD')::int FROM d), 0),
       (SELECT min(g)::int - 1 FROM generate_series(0, 1000) g
        WHERE NOT EXISTS (SELECT 1 FROM d WHERE d.day = (now() AT TIME ZONE 'UTC')::date + g))
FROM p`, []any{n.Published}
}

// partitionStatus makes statusPartitions' row an outboxdriver.PartitionStatus.
func partitionStatus(count, oldest, newest, ahead int) *outboxdriver.PartitionStatus {
	ps := &outboxdriver.PartitionStatus{Count: count, DaysAhead: ahead}
	if count > 0 {
		ps.Oldest, ps.Newest = dayOf(oldest), dayOf(newest)
	}
	return ps
}

// statusOldestTransaction returns the age in microseconds of the oldest transaction in
// this database that holds a snapshot or a transaction id (either pins the xmin horizon),
// other than the caller's; vacuum's own workers are left out. Prepared transactions and
// replication slots hold the horizon too and are not counted. Without the
// pg_read_all_stats role PostgreSQL shows other users' sessions without their times, so
// it can read 0.
const statusOldestTransaction = `SELECT coalesce((extract(epoch FROM max(now() - xact_start)) * 1000000)::bigint, 0)
FROM pg_catalog.pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) AND pid <> pg_backend_pid()`

// StorageStatus fills in st what the drivers' Status reads the same way: the age of the
// oldest open transaction, the published history's partitions (from migration 3) and the
// pending ring (from migration 4). q is the Status transaction.
func (n *Names) StorageStatus(ctx context.Context, q Querier, st *outboxdriver.Status) error {
	var micros int64
	if err := q.QueryRow(ctx, statusOldestTransaction, nil, &micros); err != nil {
		return err
	}
	st.OldestTransactionAge = time.Duration(micros) * time.Microsecond
	var count, oldest, newest, ahead int
	sql, args := n.statusPartitions()
	switch err := q.QueryRow(ctx, sql, args, &count, &oldest, &newest, &ahead); {
	case errors.Is(err, ErrNoRows): // not partitioned (before migration 3)
	case err != nil:
		return err
	default:
		st.Partitions = partitionStatus(count, oldest, newest, ahead)
	}
	var ringed int
	sql, args = n.statusRinged()
	if err := q.QueryRow(ctx, sql, args, &ringed); err != nil || ringed == 0 {
		return err // before migration 4: no ring
	}
	var ring outboxdriver.RingStatus
	sql, args = n.statusRing()
	if err := q.QueryRow(ctx, sql, args, &ring.Current, &ring.Rotations, &ring.RowsSinceRotation); err != nil {
		return err
	}
	st.Ring = &ring
	return nil
}

var _ outboxdriver.Admin = (*DB)(nil)

// Status implements outboxdriver.Admin: it returns a snapshot of the outbox, read in one
// repeatable-read, read-only transaction so that its figures agree with each other and
// share one database clock, with JIT compilation off because dashboards poll it.
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
func (db *DB) Status(ctx context.Context) (outboxdriver.Status, error) {
	if err := db.ready(); err != nil {
		return outboxdriver.Status{}, err
	}
	st := outboxdriver.Status{Topics: []outboxdriver.TopicStatus{}, Relays: []outboxdriver.RelayInfo{}}
	err := db.snapshot(ctx, func(q Querier) error {
		if err := q.Exec(ctx, NoJIT); err != nil {
			return err
		}
		if err := db.names.topicStatus(ctx, q, &st); err != nil {
			return fmt.Errorf("count pending and dead: %w", err)
		}
		if _, err := optionalPart(ctx, q, func() error { return db.names.priorityStatus(ctx, q, &st) }); err != nil {
			return fmt.Errorf("count pending per priority: %w", err)
		}
		if err := db.names.publishedCount(ctx, q, &st); err != nil {
			return fmt.Errorf("count published: %w", err)
		}
		if err := db.names.StorageStatus(ctx, q, &st); err != nil {
			return fmt.Errorf("read partitions and transactions: %w", err)
		}
		if err := db.names.relayStatus(ctx, q, &st); err != nil {
			return fmt.Errorf("read relays and leases: %w", err)
		}
		if err := db.names.walSlotStatus(ctx, q, &st); err != nil {
			return fmt.Errorf("read WAL slots: %w", err)
		}
		return nil
	})
	if err != nil {
		return outboxdriver.Status{}, fmt.Errorf("outbox status: %w", err)
	}
	return st, nil
}

// topicStatus fills the per-topic rows and the totals.
func (n *Names) topicStatus(ctx context.Context, q Querier, st *outboxdriver.Status) error {
	topics, err := Collect(ctx, q, n.StatusTopics(), nil, func(r Row) (outboxdriver.TopicStatus, error) {
		var t outboxdriver.TopicStatus
		var ageMicros int64
		err := r.Scan(&t.Topic, &t.Pending, &t.Due, &t.Retrying, &t.Dead, &t.DeadLastHour, &ageMicros)
		t.OldestPendingAge = time.Duration(ageMicros) * time.Microsecond
		return t, err
	})
	if err != nil {
		return err
	}
	st.AddTopics(topics)
	return nil
}

// priorityStatus fills the backlog per priority (schema version 10).
func (n *Names) priorityStatus(ctx context.Context, q Querier, st *outboxdriver.Status) error {
	prios, err := Collect(ctx, q, n.StatusPriorities(), nil, func(r Row) (outboxdriver.PriorityStatus, error) {
		var p outboxdriver.PriorityStatus
		var ageMicros int64
		err := r.Scan(&p.Priority, &p.Pending, &p.Due, &ageMicros)
		p.OldestPendingAge = time.Duration(ageMicros) * time.Microsecond
		return p, err
	})
	if err == nil {
		st.AddPriorities(prios)
	}
	return err
}

// publishedCount counts the published table exactly while it is small and estimates it
// when it is large (see PublishedEstimate).
func (n *Names) publishedCount(ctx context.Context, q Querier, st *outboxdriver.Status) error {
	var relTuples, liveTuples int64
	var legacy bool
	sql, args := n.StatusPublishedStats()
	if err := q.QueryRow(ctx, sql, args, &relTuples, &liveTuples, &legacy); err != nil {
		return err
	}
	if est, ok := PublishedEstimate(relTuples, liveTuples); ok {
		st.Published = est
		return nil
	}
	return q.QueryRow(ctx, n.StatusPublishedCount(legacy), nil, &st.Published)
}

// relayStatus fills the relays and the shard counts.
func (n *Names) relayStatus(ctx context.Context, q Querier, st *outboxdriver.Status) error {
	relays, err := Collect(ctx, q, n.StatusRelays(), nil, func(r Row) (outboxdriver.RelayInfo, error) {
		var ri outboxdriver.RelayInfo
		var dests string
		err := r.Scan(&ri.ID, &ri.Hostname, &ri.PID, &ri.StartedAt, &ri.HeartbeatAt, &ri.Live, &ri.Shards, &ri.Fingerprint, &dests)
		ri.Destinations = outboxdriver.DecodeDestinations(dests)
		return ri, err
	})
	if err != nil {
		return err
	}
	st.Relays = append(st.Relays, relays...)
	return q.QueryRow(ctx, n.StatusShards(), nil, &st.Shards, &st.ShardsLeased)
}

// DeadList implements outboxdriver.Admin: it returns the dead letters that match f, most
// recently dead-lettered first, in one statement on the pool.
func (db *DB) DeadList(ctx context.Context, f outboxdriver.DeadFilter) ([]outboxdriver.DeadLetter, error) {
	if err := db.ready(); err != nil {
		return nil, err
	}
	sql, args, err := db.names.DeadList(f)
	if err != nil {
		return nil, err
	}
	out, err := Collect(ctx, db.pool, sql, args, func(r Row) (outboxdriver.DeadLetter, error) {
		var dl outboxdriver.DeadLetter
		err := ScanMessage(r, &dl.Message, &dl.DeadAt)
		return dl, err
	})
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}

// DeadCount implements outboxdriver.Admin: it returns how many dead letters match f (at
// most f.Limit when it is set), what DeadReplay or DeadPurge would act on if called now,
// in one statement on the pool.
func (db *DB) DeadCount(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	if err := db.ready(); err != nil {
		return 0, err
	}
	sql, args, err := db.names.DeadCount(f)
	if err != nil {
		return 0, err
	}
	var n int
	if err := db.pool.QueryRow(ctx, sql, args, &n); err != nil {
		return 0, fmt.Errorf("count dead letters: %w", err)
	}
	return n, nil
}

// DeadReplay implements outboxdriver.Admin: it moves the dead letters that match f back
// to pending, due at once, with their attempt count reset, and returns how many it moved.
// With f.Limit set it takes the ones DeadList would show first.
//
// A replayed message keeps its ID, dedup key and position (seq), so it reaches the broker
// with the identity it was written with and consumers that already saw it (a broker that
// accepted it but whose confirmation was lost) deduplicate it as usual. Replayed messages
// of one key are published in their original order; messages of that key written after
// them and already published are not held back, so a consumer sees the replayed message
// after its successors. The last error is kept until the next attempt overwrites it, for
// whoever investigates a message that fails again.
//
// One transaction locks the matching dead letters (DeadPick), moves them from the dead
// table to the pending one (Replay) and, when any moved, wakes the relays that listen for
// notifications (Notify; relays on outboxsql poll).
func (db *DB) DeadReplay(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	if err := db.ready(); err != nil {
		return 0, err
	}
	pick, args, err := db.names.DeadPick(f)
	if err != nil {
		return 0, err
	}
	var n int64
	err = db.inTx(ctx, func(q Querier) error {
		seqs, err := Collect(ctx, q, pick, args, ScanInt64)
		if err != nil || len(seqs) == 0 {
			return err
		}
		if n, err = q.ExecCount(ctx, db.names.Replay(), IntArray(seqs)); err != nil || n == 0 {
			return err
		}
		notify, args := db.names.Notify()
		return q.Exec(ctx, notify, args...)
	})
	if err != nil {
		return 0, fmt.Errorf("replay dead letters: %w", err)
	}
	return int(n), nil
}

// DeadPurge implements outboxdriver.Admin: it deletes the dead letters that match f, in
// one statement on the pool, and returns how many it deleted. With f.Limit set it takes
// the ones DeadList would show first.
//
// A purged message's dedup key is not released at once: the relay's retention cleanup
// releases it later, once it is older than the retention time. Until then a message
// written with the same dedup key is still skipped as a duplicate.
//
// A filter that selects nothing in particular is refused with
// outboxdriver.ErrEmptyDeadFilter before anything else: deleting everything is
// DeadPurgeAll.
func (db *DB) DeadPurge(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	if f.IsEmpty() {
		return 0, outboxdriver.ErrEmptyDeadFilter
	}
	return db.deadPurge(ctx, f)
}

// DeadPurgeAll implements outboxdriver.Admin: it deletes every dead letter, in one
// statement on the pool, and returns how many it deleted. Pending and published messages
// are not touched. Dedup keys are released later, as for DeadPurge.
func (db *DB) DeadPurgeAll(ctx context.Context) (int, error) {
	return db.deadPurge(ctx, outboxdriver.DeadFilter{})
}

func (db *DB) deadPurge(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	if err := db.ready(); err != nil {
		return 0, err
	}
	sql, args, err := db.names.DeadPurge(f)
	if err != nil {
		return 0, err
	}
	n, err := db.pool.ExecCount(ctx, sql, args...)
	if err != nil {
		return 0, fmt.Errorf("purge dead letters: %w", err)
	}
	return int(n), nil
}
