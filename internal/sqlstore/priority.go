package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/broken"
	"github.com/outboxkit/outbox/outboxdriver"
)

// PriorityMigration is the schema version that adds message priorities.
const PriorityMigration = 4

// errNoPriorities wraps outboxdriver.ErrNoPriorities for a schema before
// PriorityMigration.
var errNoPriorities = fmt.Errorf("%w before schema version %d: run outbox migrate up", outboxdriver.ErrNoPriorities, PriorityMigration)

// priorityError wraps err, a failed statement that named the priority column: with
// errNoPriorities when the column is not there.
func (s *Store) priorityError(what string, err error) error {
	if s.d.Undefined != nil && s.d.Undefined(err) {
		return fmt.Errorf("%s: %w (%w)", what, errNoPriorities, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// candidate is a row a priority fetch may return.
type candidate struct {
	seq      int64
	key      string
	priority int
}

// FetchPriority implements outboxdriver.PriorityFetcher (schema version 4): due messages
// with a priority above 0 of the shards the relay still holds, highest priority first,
// then in seq order, each only behind earlier messages of its key that the relay handled
// or that are due, of its priority and returned ahead of it.
//
// PostgreSQL does it in one statement (internal/pgsql's FetchPriority); here it takes
// three, with the same rule:
//
//  1. The candidates: per priority, the first rows in seq order that are due, of a held
//     shard, read from the priority index (one range per priority, so that no database
//     sorts the backlog, whatever its support for descending indexes); the first 2×Limit
//     of them that the relay does not hold, in priority order.
//  2. Per key among them, one probe of the key index for the first row from the key's
//     held seq up to its last candidate that stops the key: one before its first
//     candidate, of another priority than that candidate's, or one that waits (a retry,
//     a delay). The key's candidates before it are taken.
//  3. The chosen rows, read whole by primary key: a large payload is never sorted.
//
// Each statement reads the database as it is then: a row committed between them can only
// add a stop (it has a later seq than the candidates, or is seen by the probe).
func (s *Store) FetchPriority(ctx context.Context, req outboxdriver.FetchRequest) ([]*outbox.Message, error) {
	if err := s.needDB(); err != nil {
		return nil, err
	}
	if len(req.Leases) == 0 || req.Limit <= 0 {
		return nil, nil
	}
	cands, err := s.priorityCandidates(ctx, req)
	if err != nil {
		return nil, s.priorityError("fetch by priority", err)
	}
	upto, err := s.keyStops(ctx, req, cands)
	if err != nil {
		return nil, fmt.Errorf("fetch by priority: %w", err)
	}
	var chosen []int64
	for _, c := range cands {
		if stop, probed := upto[c.key]; c.key == "" || probed && c.seq < stop {
			chosen = append(chosen, c.seq)
			if len(chosen) == req.Limit {
				break
			}
		}
	}
	if len(chosen) == 0 {
		return nil, nil
	}
	msgs, err := collect(ctx, s.db, func(r *sql.Rows) (*outbox.Message, error) {
		var prio int
		m, err := scanMessage(r, &prio)
		if m != nil {
			m.Priority = prio
		}
		return m, err
	}, s.sql(`SELECT `+s.readColumns("")+`, priority FROM {{outbox}} WHERE seq IN (`+ints(chosen)+`)`))
	if err != nil {
		return nil, fmt.Errorf("fetch by priority: %w", err)
	}
	slices.SortFunc(msgs, func(a, b *outbox.Message) int { return priorityOrder(a.Priority, a.Seq, b.Priority, b.Seq) })
	return msgs, nil
}

// priorityOrder compares two rows by priority, highest first, then by seq.
func priorityOrder(pa int, sa int64, pb int, sb int64) int {
	return cmp.Or(cmp.Compare(pb, pa), cmp.Compare(sa, sb))
}

// priorityCandidates returns step 1 of FetchPriority: the first 2×Limit due rows with a
// priority of the relay's held shards that it does not hold, in priority order.
func (s *Store) priorityCandidates(ctx context.Context, req outboxdriver.FetchRequest) ([]candidate, error) {
	exclude := make(map[int64]bool, len(req.Exclude))
	for _, seq := range req.Exclude {
		exclude[seq] = true
	}
	n := strconv.Itoa(2*req.Limit + len(req.Exclude))
	leased := `SELECT l.shard FROM {{leases}} l WHERE l.owner = ? AND l.expires_at > {{now}} AND ` + leaseMatch("l.", req.Leases)
	branches := make([]string, 0, outbox.MaxPriority)
	args := make([]any, 0, outbox.MaxPriority)
	for p := outbox.MaxPriority; p > 0; p-- {
		branches = append(branches, `SELECT * FROM (SELECT o.seq, o.{{key}}, o.priority FROM {{outbox}} o`+s.d.UseIndex(s.names.Index("priority"))+`
    WHERE o.priority > 0 AND o.priority = `+strconv.Itoa(p)+`
      AND (o.next_attempt_at <= {{now}} OR o.next_attempt_at = o.created_at)
      AND o.shard IN (`+leased+`)
    ORDER BY o.seq LIMIT `+n+`) p`+strconv.Itoa(p))
		args = append(args, req.RelayID)
	}
	rows, err := collect(ctx, s.db, func(r *sql.Rows) (candidate, error) {
		var c candidate
		err := r.Scan(&c.seq, &c.key, &c.priority)
		return c, err
	}, s.sql(strings.Join(branches, "\nUNION ALL\n")), args...)
	if err != nil {
		return nil, err
	}
	rows = slices.DeleteFunc(rows, func(c candidate) bool { return exclude[c.seq] })
	slices.SortFunc(rows, func(a, b candidate) int { return priorityOrder(a.priority, a.seq, b.priority, b.seq) })
	return rows[:min(len(rows), 2*req.Limit)], nil
}

// keyProbes bounds the keys of one statement of keyStops: SQLite allows 500 SELECTs
// in one compound statement.
const keyProbes = 200

// keyStops returns step 2 of FetchPriority: for each key of cands but the empty one,
// the seq below which its candidates may be taken (its stop, or past its last
// candidate).
func (s *Store) keyStops(ctx context.Context, req outboxdriver.FetchRequest, cands []candidate) (map[string]int64, error) {
	type span struct {
		key      string
		lo, hi   int64 // the key's first and last candidates
		priority int   // the first candidate's
	}
	var keys []span
	at := map[string]int{}
	for _, c := range cands {
		if c.key == "" {
			continue
		}
		if i, ok := at[c.key]; ok {
			k := &keys[i]
			if c.seq < k.lo {
				k.lo, k.priority = c.seq, c.priority
			}
			k.hi = max(k.hi, c.seq)
			continue
		}
		at[c.key] = len(keys)
		keys = append(keys, span{c.key, c.seq, c.seq, c.priority})
	}
	held := req.Held()
	upto := make(map[string]int64, len(keys))
	stop := `e.seq < %d OR e.priority <> %d OR NOT (e.next_attempt_at <= {{now}} OR e.next_attempt_at = e.created_at)`
	if broken.Has(broken.PriorityOvertakes) {
		stop = `%d < 0 AND %d < 0` // canary: nothing stops a key
	}
	err := chunks(keys, keyProbes, func(part []span) error {
		probes := make([]string, len(part))
		args := make([]any, len(part))
		for i, k := range part {
			// The numbers are int64 literals (see the package doc); the key is a parameter.
			probes[i] = fmt.Sprintf(`SELECT %d AS i, (SELECT e.seq FROM {{outbox}} e`+s.d.UseIndex(s.names.Index("key"))+`
    WHERE e.{{key}} = ? AND e.seq > %d AND e.seq <= %d AND (`+stop+`)
    ORDER BY e.seq LIMIT 1) AS s`, at[k.key], held[k.key], k.hi, k.lo, k.priority)
			args[i] = k.key
		}
		rows, err := s.db.QueryContext(ctx, s.sql(strings.Join(probes, "\nUNION ALL\n")), args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var i int
			var seq sql.NullInt64
			if err := rows.Scan(&i, &seq); err != nil {
				return err
			}
			if i < 0 || i >= len(keys) {
				return fmt.Errorf("key probe %d out of range", i)
			}
			upto[keys[i].key] = keys[i].hi + 1
			if seq.Valid {
				upto[keys[i].key] = seq.Int64
			}
		}
		return rows.Err()
	})
	return upto, err
}
