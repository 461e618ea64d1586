package sqlstore

import (
	"context"
	"database/sql"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// This file is the operator's side of the engine and of the stores that embed it:
// outboxdriver.Admin. Every statement is built
// from validated, quoted names; every value travels as a parameter or, for ids, as a hex
// literal of bytes the engine holds.

// Status implements outboxdriver.Admin: it returns a snapshot of the outbox, read in one
// read-only transaction at the dialect's snapshot isolation (REPEATABLE READ in MySQL),
// so that its figures agree with each other.
//
// Pending and dead figures are exact; their cost follows the backlog and the dead-letter
// store, not the history kept. Published is exact in SQLite, which counts it on an index
// of the published table. In MySQL it is exact while InnoDB estimates the published
// table below PublishedExactBelow rows (information_schema.TABLES), and that estimate
// above, because counting exactly means reading the whole table. OldestPendingAge is
// measured from when the message was written.
func (s *Store) Status(ctx context.Context) (outboxdriver.Status, error) {
	if err := s.needDB(); err != nil {
		return outboxdriver.Status{}, err
	}
	st := outboxdriver.Status{Topics: []outboxdriver.TopicStatus{}, Relays: []outboxdriver.RelayInfo{}}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true, Isolation: s.d.SnapshotIsolation})
	if err != nil {
		return st, fmt.Errorf("outbox status: begin: %w", err)
	}
	defer tx.Rollback()
	if err := s.topicStatus(ctx, tx, &st); err != nil {
		return st, fmt.Errorf("outbox status: count pending and dead: %w", err)
	}
	if err := s.priorityStatus(ctx, tx, &st); err != nil {
		return st, fmt.Errorf("outbox status: count pending per priority: %w", err)
	}
	if err := s.publishedCount(ctx, tx, &st); err != nil {
		return st, fmt.Errorf("outbox status: count published: %w", err)
	}
	if err := s.relayStatus(ctx, tx, &st); err != nil {
		return st, fmt.Errorf("outbox status: read relays and leases: %w", err)
	}
	return st, nil
}

// priorityStatus fills the backlog per priority, once the schema keeps priorities
// (PriorityMigration).
func (s *Store) priorityStatus(ctx context.Context, tx Querier, st *outboxdriver.Status) error {
	applied, err := s.applied(ctx, tx)
	if err != nil || !applied[PriorityMigration] {
		return err
	}
	rows, err := tx.QueryContext(ctx, s.sql(`SELECT priority, COUNT(*),
       COALESCE(SUM(CASE WHEN next_attempt_at <= {{now}} THEN 1 ELSE 0 END), 0),
       `+s.d.ToMicros("{{now}}")+` - `+s.d.ToMicros("MIN(created_at)")+`
FROM {{outbox}} GROUP BY priority`))
	if err != nil {
		return err
	}
	defer rows.Close()
	var prios []outboxdriver.PriorityStatus
	for rows.Next() {
		var p outboxdriver.PriorityStatus
		var ageMicros int64
		if err := rows.Scan(&p.Priority, &p.Pending, &p.Due, &ageMicros); err != nil {
			return err
		}
		p.OldestPendingAge = max(time.Duration(ageMicros)*time.Microsecond, 0)
		prios = append(prios, p)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	st.AddPriorities(prios)
	return nil
}

func (s *Store) topicStatus(ctx context.Context, tx Querier, st *outboxdriver.Status) error {
	var now int64
	if err := tx.QueryRowContext(ctx, "SELECT "+s.d.ToMicros(s.d.Now)).Scan(&now); err != nil {
		return err
	}
	topics := map[string]*outboxdriver.TopicStatus{}
	get := func(name string) *outboxdriver.TopicStatus {
		t := topics[name]
		if t == nil {
			t = &outboxdriver.TopicStatus{Topic: name}
			topics[name] = t
		}
		return t
	}
	rows, err := tx.QueryContext(ctx, s.sql(`SELECT topic, COUNT(*),
       COALESCE(SUM(CASE WHEN next_attempt_at <= {{now}} THEN 1 ELSE 0 END), 0),
       COALESCE(SUM(CASE WHEN attempts > 0 THEN 1 ELSE 0 END), 0),
       `+s.d.ToMicros("MIN(created_at)")+`
FROM {{outbox}} GROUP BY topic`))
	if err != nil {
		return err
	}
	for rows.Next() {
		var name string
		var pending, due, retrying, oldest int64
		if err := rows.Scan(&name, &pending, &due, &retrying, &oldest); err != nil {
			rows.Close()
			return err
		}
		t := get(name)
		t.Pending, t.Due, t.Retrying = pending, due, retrying
		t.OldestPendingAge = max(time.Duration(now-oldest)*time.Microsecond, 0)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	rows, err = tx.QueryContext(ctx, s.sql(`SELECT topic, COUNT(*),
       COALESCE(SUM(CASE WHEN dead_at > `+s.d.FromMicros("?")+` THEN 1 ELSE 0 END), 0)
FROM {{dead}} GROUP BY topic`), now-time.Hour.Microseconds())
	if err != nil {
		return err
	}
	for rows.Next() {
		var name string
		var dead, lastHour int64
		if err := rows.Scan(&name, &dead, &lastHour); err != nil {
			rows.Close()
			return err
		}
		get(name).Dead, get(name).DeadLastHour = dead, lastHour
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	all := make([]outboxdriver.TopicStatus, 0, len(topics))
	for _, t := range topics {
		all = append(all, *t)
	}
	st.AddTopics(all)
	return nil
}

func (s *Store) publishedCount(ctx context.Context, tx Querier, st *outboxdriver.Status) error {
	if s.d.PublishedEstimate != "" {
		var est sql.NullInt64
		if err := tx.QueryRowContext(ctx, s.d.PublishedEstimate, s.names.Raw("outbox_published")).Scan(&est); err != nil && err != sql.ErrNoRows {
			return err
		}
		if est.Int64 >= PublishedExactBelow {
			st.Published = est.Int64
			return nil
		}
	}
	return tx.QueryRowContext(ctx, s.sql(`SELECT COUNT(*) FROM {{published}}`)).Scan(&st.Published)
}

func (s *Store) relayStatus(ctx context.Context, tx Querier, st *outboxdriver.Status) error {
	relays, err := collect(ctx, tx, func(r *sql.Rows) (outboxdriver.RelayInfo, error) {
		var ri outboxdriver.RelayInfo
		var started, beat int64
		var live int
		var dests string
		err := r.Scan(&ri.ID, &ri.Hostname, &ri.PID, &started, &beat, &live, &ri.Shards, &ri.Fingerprint, &dests)
		ri.Destinations = outboxdriver.DecodeDestinations(dests)
		ri.StartedAt, ri.HeartbeatAt, ri.Live = time.UnixMicro(started), time.UnixMicro(beat), live == 1
		return ri, err
	}, s.sql(`SELECT r.id, r.hostname, r.pid, `+s.d.ToMicros("r.started_at")+`, `+s.d.ToMicros("r.heartbeat_at")+`,
       CASE WHEN r.expires_at > {{now}} THEN 1 ELSE 0 END,
       (SELECT COUNT(*) FROM {{leases}} l WHERE l.owner = r.id AND l.expires_at > {{now}}), r.fingerprint, r.destinations
FROM {{relays}} r
ORDER BY r.started_at, r.id`))
	if err != nil {
		return err
	}
	st.Relays = append(st.Relays, relays...)
	return tx.QueryRowContext(ctx, s.sql(`SELECT COUNT(*), COALESCE(SUM(CASE WHEN owner IS NOT NULL AND expires_at > {{now}} THEN 1 ELSE 0 END), 0)
FROM {{leases}}`)).Scan(&st.Shards, &st.ShardsLeased)
}

// deadQuery is a dead-letter selection rendered as SQL: a condition on the dead table,
// its parameters, and the LIMIT clause.
type deadQuery struct {
	where string
	args  []any
	limit string
}

// deadWhere renders f. It is a condition on the dead table, which holds nothing but dead
// letters, so no pending or published message can match.
func (s *Store) deadWhere(f outboxdriver.DeadFilter) (*deadQuery, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	q := &deadQuery{}
	var conds []string
	if len(f.IDs) > 0 {
		ids := make([]string, len(f.IDs))
		for i, id := range f.IDs {
			ids[i] = "X'" + hex.EncodeToString(id[:]) + "'"
		}
		conds = append(conds, "id IN ("+strings.Join(ids, ", ")+")")
	}
	if f.Topic != "" {
		conds = append(conds, "topic = ?")
		q.args = append(q.args, f.Topic)
	}
	if f.Key != "" {
		conds = append(conds, "{{key}} = ?")
		q.args = append(q.args, f.Key)
	}
	if f.ErrorContains != "" {
		// Both sides lower-cased: SQLite's LIKE folds ASCII only, and MySQL's follows
		// the column's collation.
		conds = append(conds, "LOWER(last_error) LIKE ? ESCAPE '!'")
		q.args = append(q.args, "%"+escapeLike(strings.ToLower(f.ErrorContains))+"%")
	}
	if !f.Since.IsZero() {
		conds = append(conds, "dead_at >= "+s.d.FromMicros("?"))
		q.args = append(q.args, f.Since.UnixMicro())
	}
	if !f.Until.IsZero() {
		conds = append(conds, "dead_at < "+s.d.FromMicros("?"))
		q.args = append(q.args, f.Until.UnixMicro())
	}
	q.where = "1 = 1"
	if len(conds) > 0 {
		q.where = strings.Join(conds, " AND ")
	}
	if f.Limit > 0 {
		q.limit = " LIMIT ?"
	}
	return q, nil
}

// withLimit returns the arguments of a statement ending in q's LIMIT.
func (q *deadQuery) withLimit(f outboxdriver.DeadFilter) []any {
	if q.limit == "" {
		return q.args
	}
	return append(slices.Clone(q.args), f.Limit)
}

// escapeLike makes s match literally in a LIKE pattern whose escape character is '!'.
func escapeLike(s string) string {
	return strings.NewReplacer("!", "!!", "%", "!%", "_", "!_").Replace(s)
}

// deadOrder is the order of DeadList, and the order in which a Limit picks the dead
// letters that DeadReplay and DeadPurge act on: the same rows a list shows.
const deadOrder = " ORDER BY dead_at DESC, seq DESC"

// DeadList implements outboxdriver.Admin: it returns the dead letters that match f, most
// recently dead-lettered first (as outboxpgx lists them). In SQLite, f.ErrorContains
// ignores the case of ASCII letters only (SQLite's lower() knows no other alphabet).
func (s *Store) DeadList(ctx context.Context, f outboxdriver.DeadFilter) ([]outboxdriver.DeadLetter, error) {
	if err := s.needDB(); err != nil {
		return nil, err
	}
	q, err := s.deadWhere(f)
	if err != nil {
		return nil, err
	}
	out, err := collect(ctx, s.db, func(r *sql.Rows) (outboxdriver.DeadLetter, error) {
		var deadAt int64
		m, err := scanMessage(r, &deadAt)
		if err != nil {
			return outboxdriver.DeadLetter{}, err
		}
		return outboxdriver.DeadLetter{Message: *m, DeadAt: time.UnixMicro(deadAt)}, nil
	}, s.sql(`SELECT `+s.readColumns("")+`, `+s.d.ToMicros("dead_at")+` FROM {{dead}} WHERE `+q.where+deadOrder+q.limit), q.withLimit(f)...)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}

// DeadCount implements outboxdriver.Admin: it returns how many dead letters match f (at
// most f.Limit when it is set), what DeadReplay or DeadPurge would act on if called now.
func (s *Store) DeadCount(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	if err := s.needDB(); err != nil {
		return 0, err
	}
	q, err := s.deadWhere(f)
	if err != nil {
		return 0, err
	}
	var n int
	err = s.db.QueryRowContext(ctx, s.sql(`SELECT COUNT(*) FROM (SELECT 1 AS one FROM {{dead}} WHERE `+q.where+q.limit+`) s`), q.withLimit(f)...).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count dead letters: %w", err)
	}
	return n, nil
}

// pickDead locks and returns the seqs of the dead letters that match f, in DeadList order.
func (s *Store) pickDead(ctx context.Context, tx Querier, f outboxdriver.DeadFilter) ([]int64, error) {
	q, err := s.deadWhere(f)
	if err != nil {
		return nil, err
	}
	return collect(ctx, tx, scanInt64, s.sql(`SELECT seq FROM {{dead}} WHERE `+q.where+deadOrder+q.limit+s.d.ForUpdate), q.withLimit(f)...)
}

// DeadReplay implements outboxdriver.Admin: it moves the dead letters that match f back to
// pending, due at once, attempts reset, in one write transaction, and returns how many it
// moved. With f.Limit set it takes the ones DeadList shows first.
//
// A replayed message keeps its ID, dedup key and position (seq), so consumers that saw
// it deduplicate it, and replayed messages of one key go out in their original order.
// next_attempt_at = created_at makes it due at once and keeps it out of the "waiting"
// condition. The last error is kept until the next attempt overwrites it.
func (s *Store) DeadReplay(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	return s.eachDeadChunk(ctx, f, "replay dead letters", func(tx Querier, in string) (int, error) {
		n, err := affected(tx.ExecContext(ctx, s.sql(`INSERT INTO {{outbox}} (seq, id, topic, {{key}}, aggregate_type, event_type, content_type, payload, headers, dedup_key, shard, created_at, next_attempt_at, attempts, last_error)
SELECT seq, id, topic, {{key}}, aggregate_type, event_type, content_type, payload, headers, dedup_key, shard, created_at, created_at, 0, last_error
FROM {{dead}} WHERE seq IN (`+in+`)`)))
		if err != nil {
			return 0, err
		}
		_, err = tx.ExecContext(ctx, s.sql(`DELETE FROM {{dead}} WHERE seq IN (`+in+`)`))
		return n, err
	})
}

// DeadPurge implements outboxdriver.Admin: it deletes the dead letters that match f and returns
// how many. A filter that selects nothing in particular is refused with
// outboxdriver.ErrEmptyDeadFilter. A purged message's dedup key is released later, by the
// retention cleanup, once it is older than the retention time.
func (s *Store) DeadPurge(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	if f.IsEmpty() {
		return 0, outboxdriver.ErrEmptyDeadFilter
	}
	return s.deadPurge(ctx, f)
}

// DeadPurgeAll implements outboxdriver.Admin: it deletes every dead letter and returns how
// many. Dedup keys are released later, as for DeadPurge.
func (s *Store) DeadPurgeAll(ctx context.Context) (int, error) {
	return s.deadPurge(ctx, outboxdriver.DeadFilter{})
}

func (s *Store) deadPurge(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	return s.eachDeadChunk(ctx, f, "purge dead letters", func(tx Querier, in string) (int, error) {
		return affected(tx.ExecContext(ctx, s.sql(`DELETE FROM {{dead}} WHERE seq IN (`+in+`)`)))
	})
}

// eachDeadChunk runs fn in one write transaction over the dead letters that match f, a
// chunk of their seqs at a time (as a SQL list), and returns the sum of what fn counted.
// An error is prefixed with what.
func (s *Store) eachDeadChunk(ctx context.Context, f outboxdriver.DeadFilter, what string, fn func(tx Querier, in string) (int, error)) (int, error) {
	if _, err := s.deadWhere(f); err != nil {
		return 0, err
	}
	var n int
	err := s.inWriteTx(ctx, func(tx Querier) error {
		seqs, err := s.pickDead(ctx, tx, f)
		if err != nil {
			return err
		}
		n = 0
		return chunks(seqs, listChunk, func(part []int64) error {
			k, err := fn(tx, ints(part))
			n += k
			return err
		})
	})
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	return n, nil
}
