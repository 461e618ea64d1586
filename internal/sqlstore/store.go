package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
)

// This file is the relay's side of the engine and of the stores that embed it:
// outboxdriver.Store.

// readColumns are the columns read back for a message, in scanMessage's order.
func (s *Store) readColumns(alias string) string {
	a := alias
	return a + "seq, " + a + "id, " + a + "topic, " + a + "{{key}}, " + a + "aggregate_type, " + a + "event_type, " +
		a + "content_type, " + a + "payload, " + a + "headers, " + a + "dedup_key, " + a + "shard, " +
		s.d.ToMicros(a+"created_at") + ", " + a + "attempts, COALESCE(" + a + "last_error, '')"
}

// messageColumns are the columns the three message tables share, for moving rows.
const messageColumns = "seq, id, topic, {{key}}, aggregate_type, event_type, content_type, payload, headers, dedup_key, shard, created_at, attempts"

func scanMessage(r *sql.Rows, extra ...any) (*outbox.Message, error) {
	m := &outbox.Message{}
	var id []byte
	var headers string
	var created int64
	dest := append([]any{&m.Seq, &id, &m.Topic, &m.Key, &m.AggregateType, &m.EventType, &m.ContentType, &m.Payload,
		&headers, &m.DedupKey, &m.Shard, &created, &m.Attempts, &m.LastError}, extra...)
	if err := r.Scan(dest...); err != nil {
		return nil, err
	}
	if len(id) != len(m.ID) {
		return nil, fmt.Errorf("message %d: id has %d bytes, want %d", m.Seq, len(id), len(m.ID))
	}
	copy(m.ID[:], id)
	m.CreatedAt = time.UnixMicro(created)
	if m.Payload == nil {
		m.Payload = []byte{}
	}
	if len(headers) > 2 {
		if err := json.Unmarshal([]byte(headers), &m.Headers); err != nil {
			return nil, fmt.Errorf("message %d: headers: %w", m.Seq, err)
		}
	}
	return m, nil
}

// Fetch implements outboxdriver.Store: due messages of the shards the relay still holds (owner,
// token, unexpired, checked in the same statement) in seq order.
//
// A fresh row (next_attempt_at = created_at) is due whatever the clocks say: its writer's
// statement time can be later than the fetch's when the writer committed before the fetch
// read (pgsql's Fetch says why that would let a key's later rows overtake it). A key is
// held back while an earlier message of it waits (a retry backing off, or DeliverAt):
// such rows have next_attempt_at > created_at, a condition fresh rows never meet, and the "waiting" index (partial in SQLite, on a generated column in MySQL; see
// Dialect.WaitingKey) finds them without reading the key's other rows.
//
// A full fetch excludes the seqs in hand with NOT IN over a JSON array parameter, which
// both databases materialize once per query into an indexed set: one parameter however
// many messages the relay holds. A continuation (After > 0) is a primary-key range scan
// above After that skips a message whose key has a pending message at or below After
// that the relay does not hold (of the key Keys[i] it holds those up to KeySeqs[i]): keys
// the relay does not hold in the statement, the others in a second one (dropOvertaking).
func (s *Store) Fetch(ctx context.Context, req outboxdriver.FetchRequest) ([]*outbox.Message, error) {
	if err := s.needDB(); err != nil {
		return nil, err
	}
	if len(req.Leases) == 0 || req.Limit <= 0 {
		return nil, nil
	}
	args := []any{req.RelayID}
	var cond string
	if req.After > 0 {
		keys, err := json.Marshal(nonNil(req.Keys))
		if err != nil {
			return nil, err
		}
		// "The key's oldest pending row lies above After", written as the first row of
		// the key in the (key, seq) index: one index probe per row, where NOT EXISTS
		// (... seq <= After) would read every row of the key when there is none. Rows of
		// keys the relay holds pass here and are checked after the query (overtaking).
		cond = `o.seq > ? AND (o.{{key}} = '' OR o.{{key}} IN (` + s.d.StringList("?") + `)
       OR (SELECT e.seq FROM {{outbox}} e` + s.d.UseIndex(s.names.Index("key")) + ` WHERE e.{{key}} = o.{{key}} ORDER BY e.seq LIMIT 1) > ?)`
		args = append(args, req.After, string(keys), req.After)
	} else if len(req.Exclude) > 0 {
		ex, err := json.Marshal(req.Exclude)
		if err != nil {
			return nil, err
		}
		cond = `o.seq NOT IN (` + s.d.IntList("?") + `)`
		args = append(args, string(ex))
	}
	if cond != "" {
		cond = "\n  AND " + cond
	}
	args = append(args, req.Limit)
	q := s.sql(`SELECT ` + s.readColumns("o.") + `
FROM {{outbox}} o
WHERE (o.next_attempt_at <= {{now}} OR o.next_attempt_at = o.created_at)
  AND o.shard IN (SELECT l.shard FROM {{leases}} l WHERE l.owner = ? AND l.expires_at > {{now}} AND ` + leaseMatch("l.", req.Leases) + `)` + cond + `
  AND (o.{{key}} = '' OR NOT EXISTS (
        SELECT 1 FROM {{outbox}} w` + s.d.UseIndex(s.names.Index("waiting")) + `
        WHERE w.{{waiting_key}} = o.{{key}} AND w.seq < o.seq
          AND w.next_attempt_at > w.created_at AND w.next_attempt_at > {{now}}))
ORDER BY o.seq
LIMIT ?`)
	msgs, err := collect(ctx, s.db, func(r *sql.Rows) (*outbox.Message, error) { return scanMessage(r) }, q, args...)
	if err == nil && req.After > 0 && len(req.Keys) > 0 {
		msgs, err = s.dropOvertaking(ctx, msgs, req)
	}
	if err != nil {
		return nil, fmt.Errorf("fetch: %w", err)
	}
	return msgs, nil
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// Complete implements outboxdriver.Store in one write transaction (IMMEDIATE in SQLite,
// READ COMMITTED in MySQL), fenced per message by lease tokens: an outcome is applied
// only if the message is still pending and its shard's lease is the relay's, unexpired,
// under the very token the outcome carries.
//
//  1. Lock the messages' rows (FOR UPDATE in MySQL) and read their shards.
//  2. Lock the lease rows of those shards that the relay holds, unexpired (FOR SHARE in
//     MySQL): a takeover, which updates a lease row, waits until this transaction
//     commits, and a takeover that committed first is what the locking read sees, so
//     the outcomes are refused. In SQLite the write transaction excludes every other
//     writer, which gives the same order.
//  3. Move published messages to the published table, count an attempt and set the next
//     attempt time of retried ones, move dead ones to the dead table with their error.
//
// Rows are locked messages first, then leases; lease syncs lock only lease rows, so the
// two cannot deadlock. It returns the seqs whose outcome was refused.
func (s *Store) Complete(ctx context.Context, c outboxdriver.Completion) ([]int64, error) {
	if len(c.Published)+len(c.Failed) == 0 {
		return nil, nil
	}
	token := make(map[int64]int64, len(c.Published)+len(c.Failed))
	seqs := make([]int64, 0, len(token))
	for _, o := range c.Published {
		token[o.Seq] = o.Token
		seqs = append(seqs, o.Seq)
	}
	for _, f := range c.Failed {
		token[f.Seq] = f.Token
		seqs = append(seqs, f.Seq)
	}
	var applied map[int64]bool
	err := s.inWriteTx(ctx, func(tx Querier) error {
		applied = make(map[int64]bool, len(seqs))
		shardOf := make(map[int64]int, len(seqs))
		err := chunks(seqs, listChunk, func(part []int64) error {
			rows, err := tx.QueryContext(ctx, s.sql(`SELECT seq, shard FROM {{outbox}} WHERE seq IN (`+ints(part)+`)`+s.d.ForUpdate))
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var seq int64
				var shard int
				if err := rows.Scan(&seq, &shard); err != nil {
					return err
				}
				shardOf[seq] = shard
			}
			return rows.Err()
		})
		if err != nil {
			return fmt.Errorf("lock messages: %w", err)
		}
		if len(shardOf) == 0 {
			return nil
		}
		var shards []int
		seenShard := map[int]bool{}
		for _, sh := range shardOf {
			if !seenShard[sh] {
				seenShard[sh] = true
				shards = append(shards, sh)
			}
		}
		held := map[int]int64{}
		rows, err := tx.QueryContext(ctx, s.sql(`SELECT shard, token FROM {{leases}} WHERE shard IN (`+ints(shards)+`) AND owner = ? AND expires_at > {{now}}`+s.d.ForShare), c.RelayID)
		if err != nil {
			return fmt.Errorf("lock leases: %w", err)
		}
		for rows.Next() {
			var sh int
			var tok int64
			if err := rows.Scan(&sh, &tok); err != nil {
				rows.Close()
				return err
			}
			held[sh] = tok
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("lock leases: %w", err)
		}
		for seq, sh := range shardOf {
			if tok, ok := held[sh]; ok && tok == token[seq] {
				applied[seq] = true
			}
		}
		if err := s.markPublished(ctx, tx, c.Published, applied); err != nil {
			return fmt.Errorf("mark published: %w", err)
		}
		if err := s.markFailed(ctx, tx, c.Failed, applied); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("record outcomes: %w", err)
	}
	var refused []int64
	for _, seq := range seqs {
		if !applied[seq] {
			refused = append(refused, seq)
		}
	}
	return refused, nil
}

func (s *Store) markPublished(ctx context.Context, tx Querier, outcomes []outboxdriver.Outcome, applied map[int64]bool) error {
	var seqs []int64
	for _, o := range outcomes {
		if applied[o.Seq] {
			seqs = append(seqs, o.Seq)
		}
	}
	return chunks(seqs, listChunk, func(part []int64) error {
		in := ints(part)
		if _, err := tx.ExecContext(ctx, s.sql(`INSERT INTO {{published}} (`+messageColumns+`, published_at)
SELECT `+messageColumns+`, {{now}} FROM {{outbox}} WHERE seq IN (`+in+`)`)); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, s.sql(`DELETE FROM {{outbox}} WHERE seq IN (`+in+`)`))
		return err
	})
}

// failChunk bounds the failures recorded by one statement (four parameters each).
const failChunk = 1000

// markFailed counts an attempt of each applied failure: a retry gets its error and its
// next attempt time (database time plus the relay's delay), a dead one moves to the dead
// table with attempts + 1 and its error. One statement per chunk, each row's values
// picked by CASE on its seq.
func (s *Store) markFailed(ctx context.Context, tx Querier, failures []outboxdriver.Failure, applied map[int64]bool) error {
	var retry, deferred, dead []outboxdriver.Failure
	for _, f := range failures {
		if !applied[f.Seq] {
			continue
		}
		f.Error = cleanError(f.Error)
		switch {
		case f.Dead:
			dead = append(dead, f)
		case f.Deferred:
			deferred = append(deferred, f)
		default:
			retry = append(retry, f)
		}
	}
	if err := s.markRetries(ctx, tx, retry, 1); err != nil {
		return err
	}
	if err := s.markRetries(ctx, tx, deferred, 0); err != nil {
		return err
	}
	err := chunks(dead, failChunk, func(part []outboxdriver.Failure) error {
		var errCase strings.Builder
		var args []any
		seqs := make([]int64, len(part))
		for i, f := range part {
			seqs[i] = f.Seq
			errCase.WriteString(" WHEN ? THEN ?")
			args = append(args, f.Seq, f.Error)
		}
		in := ints(seqs)
		if _, err := tx.ExecContext(ctx, s.sql(`INSERT INTO {{dead}} (`+messageColumns+`, last_error, dead_at)
SELECT seq, id, topic, {{key}}, aggregate_type, event_type, content_type, payload, headers, dedup_key, shard, created_at,
       attempts + 1, CASE seq`+errCase.String()+` END, {{now}}
FROM {{outbox}} WHERE seq IN (`+in+`)`), args...); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, s.sql(`DELETE FROM {{outbox}} WHERE seq IN (`+in+`)`))
		return err
	})
	if err != nil {
		return fmt.Errorf("record dead letters: %w", err)
	}
	return nil
}

// markRetries sets each failure's error and next attempt time, counting counted attempts
// (1 for a rejection, 0 for a deferral), in statements of at most failChunk rows.
func (s *Store) markRetries(ctx context.Context, tx Querier, failures []outboxdriver.Failure, counted int) error {
	err := chunks(failures, failChunk, func(part []outboxdriver.Failure) error {
		var errCase, delayCase strings.Builder
		var args []any
		seqs := make([]int64, len(part))
		for i, f := range part {
			seqs[i] = f.Seq
			errCase.WriteString(" WHEN ? THEN ?")
			args = append(args, f.Seq, f.Error)
		}
		for _, f := range part {
			delayCase.WriteString(" WHEN ? THEN ?")
			args = append(args, f.Seq, f.Delay.Microseconds())
		}
		_, err := tx.ExecContext(ctx, s.sql(`UPDATE {{outbox}} SET attempts = attempts + `+strconv.Itoa(counted)+`,
    last_error = CASE seq`+errCase.String()+` END,
    next_attempt_at = `+s.d.AddMicros("{{now}}", "CASE seq"+delayCase.String()+" END")+`
WHERE seq IN (`+ints(seqs)+`)`), args...)
		return err
	})
	if err != nil {
		return fmt.Errorf("record retries: %w", err)
	}
	if err != nil {
		return fmt.Errorf("record retries: %w", err)
	}
	return nil
}

// cleanError makes a broker's error storable as text: no NUL, valid UTF-8.
func cleanError(s string) string {
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "?")
}

// SyncLeases implements outboxdriver.Store in one write transaction (IMMEDIATE in SQLite,
// READ COMMITTED in MySQL): release, heartbeat, renew, count, read the relays of other
// fingerprints, and take free or expired shards up to the fair share (none while
// relays of another fingerprint hold shards: LeaseState.Share). MySQL takes free shards with FOR UPDATE SKIP LOCKED, so
// concurrent relays pass each other by.
//
// A lease's token grows by one each time its shard changes owner, so a token is unique
// per ownership of its shard; the store matches leases by (shard, token) everywhere, so
// tokens need not be unique across shards (PostgreSQL draws them from a sequence; MySQL
// has no sequences).
func (s *Store) SyncLeases(ctx context.Context, req outboxdriver.LeaseRequest) (outboxdriver.LeaseState, error) {
	var st outboxdriver.LeaseState
	ttl := req.TTL.Microseconds()
	err := s.inWriteTx(ctx, func(tx Querier) error {
		st = outboxdriver.LeaseState{}
		if len(req.Release) > 0 {
			q := s.sql(`UPDATE {{leases}} SET owner = NULL, expires_at = ` + s.d.FromMicros("0") + ` WHERE owner = ? AND ` + leaseMatch("", req.Release))
			if _, err := tx.ExecContext(ctx, q, req.RelayID); err != nil {
				return fmt.Errorf("release: %w", err)
			}
		}
		if req.TTL <= 0 { // leaving
			_, err := tx.ExecContext(ctx, s.sql(`DELETE FROM {{relays}} WHERE id = ?`), req.RelayID)
			return err
		}
		expires := s.d.AddMicros("{{now}}", "?")
		dests := outboxdriver.EncodeDestinations(req.Destinations)
		q := s.sql(`INSERT INTO {{relays}} (id, hostname, pid, fingerprint, destinations, started_at, heartbeat_at, expires_at) VALUES (?, ?, ?, ?, ?, {{now}}, {{now}}, ` + expires + `)` +
			s.d.OnConflictUpdate("id") + `heartbeat_at = {{now}}, expires_at = ` + expires + `, hostname = ?, pid = ?, fingerprint = ?, destinations = ?`)
		if _, err := tx.ExecContext(ctx, q, req.RelayID, req.Hostname, req.PID, req.Fingerprint, dests, ttl, ttl, req.Hostname, req.PID, req.Fingerprint, dests); err != nil {
			return fmt.Errorf("heartbeat: %w", err)
		}
		// Relays gone for an hour are forgotten; until then Status shows them as not live.
		q = s.sql(`DELETE FROM {{relays}} WHERE expires_at < ` + s.d.AddMicros("{{now}}", "?"))
		if _, err := tx.ExecContext(ctx, q, -time.Hour.Microseconds()); err != nil {
			return fmt.Errorf("prune relays: %w", err)
		}
		if len(req.Held) > 0 {
			q := s.sql(`UPDATE {{leases}} SET expires_at = ` + expires + ` WHERE owner = ? AND ` + leaseMatch("", req.Held))
			if _, err := tx.ExecContext(ctx, q, ttl, req.RelayID); err != nil {
				return fmt.Errorf("renew: %w", err)
			}
		}
		// The relay's leases are the ones it presents, the adopted and the taken: a
		// lease of its ID under another token is an earlier process's, and without Adopt
		// it is not the relay's to learn (two processes sharing an ID would take each
		// other's leases at every round).
		var gained []int64 // shards adopted or taken, under tokens new in this transaction
		if req.Adopt {
			q := `SELECT shard FROM {{leases}} WHERE owner = ? AND expires_at > {{now}}`
			if len(req.Held) > 0 {
				q += ` AND NOT (` + leaseMatch("", req.Held) + `)`
			}
			adopted, err := collect(ctx, tx, scanInt64, s.sql(q+` ORDER BY shard`+s.d.ForUpdate), req.RelayID)
			if err != nil {
				return fmt.Errorf("find earlier leases: %w", err)
			}
			if len(adopted) > 0 {
				q := s.sql(`UPDATE {{leases}} SET token = token + 1, expires_at = ` + expires + ` WHERE owner = ? AND shard IN (` + ints(adopted) + `)`)
				if _, err := tx.ExecContext(ctx, q, ttl, req.RelayID); err != nil {
					return fmt.Errorf("adopt leases: %w", err)
				}
			}
			gained = adopted
		}
		held, err := s.held(ctx, tx, req.RelayID, req.Held, gained)
		if err != nil {
			return err
		}
		err = tx.QueryRowContext(ctx, s.sql(`SELECT (SELECT COUNT(*) FROM {{leases}}), (SELECT COUNT(*) FROM {{relays}} WHERE expires_at > {{now}})`)).
			Scan(&st.Shards, &st.Live)
		if err != nil {
			return fmt.Errorf("count relays: %w", err)
		}
		var differing []outboxdriver.Peer
		if req.Fingerprint != "" {
			differing, err = collect(ctx, tx, func(r *sql.Rows) (outboxdriver.Peer, error) {
				var p outboxdriver.Peer
				var holds int
				err := r.Scan(&p.ID, &p.Fingerprint, &holds)
				p.Holds = holds > 0
				return p, err
			}, s.sql(`SELECT r.id, r.fingerprint, (SELECT COUNT(*) FROM {{leases}} l WHERE l.owner = r.id AND l.expires_at > {{now}})
FROM {{relays}} r WHERE r.expires_at > {{now}} AND r.id <> ? AND r.fingerprint <> '' AND r.fingerprint <> ? ORDER BY r.id`), req.RelayID, req.Fingerprint)
			if err != nil {
				return fmt.Errorf("read the relays' fingerprints: %w", err)
			}
		}
		st.Share(req.Fingerprint, len(held) > 0, differing)
		if want := st.Target - len(held); want > 0 {
			// Free or expired shards; in MySQL SKIP LOCKED passes over rows another
			// relay is renewing or taking, instead of queueing behind it.
			q := s.sql(`SELECT shard FROM {{leases}} WHERE owner IS NULL OR expires_at <= {{now}} ORDER BY shard LIMIT ?` + s.d.ForUpdateSkipLocked)
			free, err := collect(ctx, tx, scanInt64, q, want)
			if err != nil {
				return fmt.Errorf("find free shards: %w", err)
			}
			if len(free) > 0 {
				q := s.sql(`UPDATE {{leases}} SET owner = ?, token = token + 1, expires_at = ` + expires + `
WHERE shard IN (` + ints(free) + `) AND (owner IS NULL OR expires_at <= {{now}})`)
				if _, err := tx.ExecContext(ctx, q, req.RelayID, ttl); err != nil {
					return fmt.Errorf("take shards: %w", err)
				}
				if held, err = s.held(ctx, tx, req.RelayID, req.Held, append(gained, free...)); err != nil {
					return err
				}
			}
		}
		st.Held = held
		return nil
	})
	if err != nil {
		return outboxdriver.LeaseState{}, fmt.Errorf("sync leases: %w", err)
	}
	return st, nil
}

// held returns the relay's unexpired leases among those it presented and the shards it
// gained in this transaction.
func (s *Store) held(ctx context.Context, tx Querier, relayID string, presented []outboxdriver.Lease, gained []int64) ([]outboxdriver.Lease, error) {
	var mine []string
	if len(presented) > 0 {
		mine = append(mine, "("+leaseMatch("", presented)+")")
	}
	if len(gained) > 0 {
		mine = append(mine, "shard IN ("+ints(gained)+")")
	}
	if len(mine) == 0 {
		return nil, nil
	}
	ls, err := collect(ctx, tx, func(r *sql.Rows) (outboxdriver.Lease, error) {
		var l outboxdriver.Lease
		err := r.Scan(&l.Shard, &l.Token)
		return l, err
	}, s.sql(`SELECT shard, token FROM {{leases}} WHERE owner = ? AND expires_at > {{now}} AND (`+strings.Join(mine, " OR ")+`) ORDER BY shard`), relayID)
	if err != nil {
		return nil, fmt.Errorf("read leases: %w", err)
	}
	return ls, nil
}

// DeletePublished implements outboxdriver.Store: it deletes up to limit published messages
// older than olderThan (database time) and up to limit dedup keys of that age whose
// message is neither pending nor dead, and returns how many rows it deleted.
//
// Published rows are picked oldest first with FOR UPDATE SKIP LOCKED in MySQL, so
// concurrent cleaners take different rows. Expired dedup keys are picked by a plain read
// and deleted by key: a key that is neither pending nor dead belongs to a published
// message, which never becomes pending again, so the pick cannot go stale (and no
// locking read walks the pending table).
func (s *Store) DeletePublished(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	if err := s.needDB(); err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, nil
	}
	age := -olderThan.Microseconds()
	var n int
	err := s.inWriteTx(ctx, func(tx Querier) error {
		q := s.sql(`SELECT seq FROM {{published}}` + s.d.UseIndex(s.names.Index("published_at")) + ` WHERE published_at < ` + s.d.AddMicros("{{now}}", "?") +
			` ORDER BY published_at LIMIT ?` + s.d.ForUpdateSkipLocked)
		seqs, err := collect(ctx, tx, scanInt64, q, age, limit)
		if err != nil {
			return err
		}
		n = 0
		return chunks(seqs, listChunk, func(part []int64) error {
			k, err := affected(tx.ExecContext(ctx, s.sql(`DELETE FROM {{published}} WHERE seq IN (`+ints(part)+`)`)))
			n += k
			return err
		})
	})
	if err != nil {
		return 0, fmt.Errorf("delete published: %w", err)
	}
	q := s.sql(`SELECT k.dedup_key FROM {{dedup}} k
WHERE k.created_at < ` + s.d.AddMicros("{{now}}", "?") + `
  AND k.dedup_key NOT IN (SELECT o.dedup_key FROM {{outbox}} o)
  AND NOT EXISTS (SELECT 1 FROM {{dead}} d WHERE d.dedup_key = k.dedup_key)
ORDER BY k.created_at LIMIT ?`)
	keys, err := collect(ctx, s.db, scanString, q, age, limit)
	if err != nil {
		return n, fmt.Errorf("find expired dedup keys: %w", err)
	}
	if len(keys) == 0 {
		return n, nil
	}
	var m int
	err = s.inWriteTx(ctx, func(tx Querier) error {
		m = 0
		return chunks(keys, 1000, func(part []string) error {
			args := make([]any, len(part))
			for i, k := range part {
				args[i] = k
			}
			k, err := affected(tx.ExecContext(ctx, s.sql(`DELETE FROM {{dedup}} WHERE dedup_key IN (`+placeholders(len(part))+`)`), args...))
			m += k
			return err
		})
	})
	if err != nil {
		return n, fmt.Errorf("delete expired dedup keys: %w", err)
	}
	return n + m, nil
}

// dropOvertaking removes from a continuation's rows those of keys the relay holds that
// still have a pending row at or below After above the highest one the relay holds (a
// transaction that committed after the fetch that set the cursor): they would overtake
// it. One statement, an index probe per held key that appears in msgs.
func (s *Store) dropOvertaking(ctx context.Context, msgs []*outbox.Message, req outboxdriver.FetchRequest) ([]*outbox.Message, error) {
	held := req.Held()
	var pairs [][2]any
	seen := map[string]bool{}
	for _, m := range msgs {
		if h, ok := held[m.Key]; ok && !seen[m.Key] {
			seen[m.Key] = true
			pairs = append(pairs, [2]any{m.Key, h})
		}
	}
	if len(pairs) == 0 {
		return msgs, nil
	}
	var q string
	var args []any
	if s.d.KeySeqList != nil {
		list, err := json.Marshal(pairs)
		if err != nil {
			return nil, err
		}
		q = `SELECT DISTINCT e.{{key}} FROM (` + s.d.KeySeqList("?") + `) h
JOIN {{outbox}} e` + s.d.UseIndex(s.names.Index("key")) + ` ON e.{{key}} = h.k AND e.seq > h.s AND e.seq <= ?`
		args = []any{string(list), req.After}
	} else {
		// At most Limit pairs of three parameters: within every database's limit.
		conds := make([]string, len(pairs))
		for i, p := range pairs {
			conds[i] = "(e.{{key}} = ? AND e.seq > ? AND e.seq <= ?)"
			args = append(args, p[0], p[1], req.After)
		}
		q = `SELECT DISTINCT e.{{key}} FROM {{outbox}} e WHERE ` + strings.Join(conds, " OR ")
	}
	keys, err := collect(ctx, s.db, scanString, s.sql(q), args...)
	if err != nil || len(keys) == 0 {
		return msgs, err
	}
	blocked := make(map[string]bool, len(keys))
	for _, k := range keys {
		blocked[k] = true
	}
	kept := msgs[:0]
	for _, m := range msgs {
		if !blocked[m.Key] {
			kept = append(kept, m)
		}
	}
	return kept, nil
}
