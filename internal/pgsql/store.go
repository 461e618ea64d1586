package pgsql

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/broken"
	"github.com/outboxkit/outbox/outboxdriver"
)

// This file is the part of outboxdriver.Store that is not SQL but must behave the same in
// every PostgreSQL driver: the parameters of Complete and the reading of its result, the
// scanning of the columns of ReadColumns, and the lease and retention calls (DB), which
// need nothing a Querier lacks.

// CompleteArgs are the array parameters of Complete ($2..$9), never nil (pgx sends a nil
// slice as NULL, not an empty array).
type CompleteArgs struct {
	Tokens           []int64  // $2: every token the outcomes carry, once
	Published        []int64  // $3
	RetrySeqs        []int64  // $4
	RetryErrors      []string // $5
	RetryDelayMillis []int64  // $6
	DeadSeqs         []int64  // $7
	DeadErrors       []string // $8
	RetryCounts      []int64  // $9: 1 counts an attempt, 0 for a deferral (Failure.Deferred)
}

// NewCompleteArgs sorts c's outcomes into Complete's parameters.
func NewCompleteArgs(c outboxdriver.Completion) CompleteArgs {
	a := CompleteArgs{
		Tokens: []int64{}, Published: make([]int64, len(c.Published)),
		RetrySeqs: []int64{}, RetryErrors: []string{}, RetryDelayMillis: []int64{},
		DeadSeqs: []int64{}, DeadErrors: []string{}, RetryCounts: []int64{},
	}
	seen := map[int64]bool{}
	token := func(t int64) {
		if !seen[t] {
			seen[t] = true
			a.Tokens = append(a.Tokens, t)
		}
	}
	for i, o := range c.Published {
		a.Published[i] = o.Seq
		token(o.Token)
	}
	for _, f := range c.Failed {
		token(f.Token)
		msg := ErrorText(f.Error)
		if f.Dead {
			a.DeadSeqs, a.DeadErrors = append(a.DeadSeqs, f.Seq), append(a.DeadErrors, msg)
		} else {
			a.RetrySeqs, a.RetryErrors = append(a.RetrySeqs, f.Seq), append(a.RetryErrors, msg)
			a.RetryDelayMillis = append(a.RetryDelayMillis, f.Delay.Milliseconds())
			count := int64(1)
			if f.Deferred {
				count = 0
			}
			a.RetryCounts = append(a.RetryCounts, count)
		}
	}
	return a
}

// ErrorText makes a publish error storable as text: PostgreSQL text holds no NUL and
// only valid UTF-8.
func ErrorText(s string) string {
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "?")
}

// Refused returns the seqs of c that are not among applied (the seqs Complete returned),
// published ones first, in c's order.
func Refused(c outboxdriver.Completion, applied []int64) []int64 {
	if len(applied) == len(c.Published)+len(c.Failed) {
		return nil
	}
	ok := make(map[int64]bool, len(applied))
	for _, s := range applied {
		ok[s] = true
	}
	var refused []int64
	for _, o := range c.Published {
		if !ok[o.Seq] {
			refused = append(refused, o.Seq)
		}
	}
	for _, f := range c.Failed {
		if !ok[f.Seq] {
			refused = append(refused, f.Seq)
		}
	}
	return refused
}

// ScanMessage scans the columns of ReadColumns into m, then extra. The id is read as the
// text of a uuid, which every driver hands over (pgx's stdlib as a string, lib/pq as its
// text, pgx into a string target), and the headers as the text of a JSON object.
func ScanMessage(r Row, m *outbox.Message, extra ...any) error {
	var id string
	var headers []byte
	dest := append([]any{&m.Seq, &id, &m.Topic, &m.Key, &m.AggregateType, &m.EventType, &m.ContentType, &m.Payload,
		&headers, &m.DedupKey, &m.Shard, &m.CreatedAt, &m.Attempts, &m.LastError}, extra...)
	if err := r.Scan(dest...); err != nil {
		return err
	}
	var err error
	if m.ID, err = outbox.ParseID(id); err != nil {
		return fmt.Errorf("message %d: %w", m.Seq, err)
	}
	if m.Payload == nil {
		m.Payload = []byte{} // the column is NOT NULL; a driver may hand an empty bytea over as nil
	}
	m.Headers, err = DecodeHeaders(m.Seq, headers)
	return err
}

// DecodeHeaders parses the headers column as ReadColumns reads it (the text of a JSON
// object); "{}" is no headers, a nil map. seq names the message in the error.
func DecodeHeaders(seq int64, text []byte) (map[string]string, error) {
	if len(text) <= 2 {
		return nil, nil
	}
	var h map[string]string
	if err := json.Unmarshal(text, &h); err != nil {
		return nil, fmt.Errorf("message %d: headers: %w", seq, err)
	}
	return h, nil
}

// tokens returns the tokens of ls.
func tokens(ls []outboxdriver.Lease) []int64 {
	out := make([]int64, len(ls))
	for i, l := range ls {
		out[i] = l.Token
	}
	return out
}

// ErrNoPartition is wrapped by Complete's error when the published history has no
// partition for the time an outcome is recorded: the messages stay pending (nothing is
// lost) until the day's partition exists.
var ErrNoPartition = errors.New("the published history has no partition for today (UTC): " +
	"run 'outbox partitions create'; relays create 7 days ahead themselves, so check that their maintenance runs (see docs/operations.md)")

// CompleteError wraps an error of Complete's statement, naming a missing partition:
// check_violation is the only constraint the statement can break, since the outbox tables
// have no CHECK constraint of their own; a partition bound is one.
func CompleteError(err error) error {
	if SQLState(err) == "23514" {
		return fmt.Errorf("record outcomes: %w: %w", ErrNoPartition, err)
	}
	return fmt.Errorf("record outcomes: %w", err)
}

// SyncLeases implements outboxdriver.Store in one transaction: release, heartbeat (which
// renews every lease the relay holds: a lease is live while its owner's heartbeat is),
// prune the relays gone for an hour, record the fingerprint and the destinations' states
// and read the relays that differ, adopt, then take shards up to the fair share (none while relays of another
// fingerprint hold shards: LeaseState.Share).
func (db *DB) SyncLeases(ctx context.Context, req outboxdriver.LeaseRequest) (outboxdriver.LeaseState, error) {
	if err := db.ready(); err != nil {
		return outboxdriver.LeaseState{}, err
	}
	var st outboxdriver.LeaseState
	err := db.inTx(ctx, func(q Querier) error {
		n := db.names
		ttl := req.TTL.Milliseconds()
		if broken.Has(broken.LocalClockLeases) { // canary: the lease statements use the relay's clock
			if err := q.Exec(ctx, "SELECT set_config('"+ClockSetting+"', $1, true)", RelayClock(req.RelayID)); err != nil {
				return err
			}
		}
		slotRelease := req.Slot != nil && req.Slot.Release && req.Slot.Token != 0
		if slotRelease {
			if err := q.Exec(ctx, n.WALLeaseRelease(), req.RelayID, n.WALSlot(req.Slot.Slot), req.Slot.Token); err != nil {
				return err
			}
		}
		if len(req.Release) > 0 {
			if err := q.Exec(ctx, n.LeaseRelease(), req.RelayID, IntArray(tokens(req.Release))); err != nil {
				return err
			}
		}
		if len(req.Release) > 0 || slotRelease {
			// Listening relays take the shards now rather than at their next renewal
			// (delivered at commit, and only then).
			if err := q.Exec(ctx, `SELECT pg_notify($1, $2)`, n.Channel, NotifyLeases); err != nil {
				return err
			}
		}
		if req.TTL <= 0 { // leaving
			return q.Exec(ctx, n.LeaseForgetRelay(), req.RelayID)
		}
		if err := q.Exec(ctx, n.LeaseHeartbeat(), req.RelayID, req.Hostname, req.PID, ttl); err != nil {
			return err
		}
		if err := q.Exec(ctx, n.LeasePruneRelays()); err != nil {
			return err
		}
		var differing []outboxdriver.Peer
		if req.Fingerprint != "" || len(req.Destinations) > 0 {
			args := []any{req.RelayID, req.Fingerprint, outboxdriver.EncodeDestinations(req.Destinations)}
			_, err := optionalPart(ctx, q, func() (err error) {
				differing, err = Collect(ctx, q, n.LeaseFingerprint(), args, func(r Row) (outboxdriver.Peer, error) {
					var p outboxdriver.Peer
					return p, r.Scan(&p.ID, &p.Fingerprint, &p.Holds)
				})
				return err
			})
			if err != nil {
				return err
			}
		}
		// The relay's leases are the ones it presents, the adopted and the taken: a
		// lease of its ID under another token is an earlier process's, and without Adopt
		// it is not the relay's to learn (two processes sharing an ID would take each
		// other's leases at every round).
		known := tokens(req.Held)
		if req.Adopt {
			adopted, err := Collect(ctx, q, n.LeaseAdopt(), []any{req.RelayID, ttl, IntArray(known)}, ScanInt64)
			if err != nil {
				return err
			}
			known = append(known, adopted...)
		}
		held, err := db.held(ctx, q, req.RelayID, known)
		if err != nil {
			return err
		}
		if err := q.QueryRow(ctx, n.LeaseCounts(), nil, &st.Shards, &st.Live); err != nil {
			return err
		}
		st.Share(req.Fingerprint, len(held) > 0, differing)
		var expired expiredOwners
		switch {
		case req.Slot != nil && len(st.GiveWay) > 0:
			// Giving way, the relay reads no slot either.
			if req.Slot.Token != 0 && !slotRelease {
				if err := q.Exec(ctx, n.WALLeaseRelease(), req.RelayID, n.WALSlot(req.Slot.Slot), req.Slot.Token); err != nil {
					return err
				}
			}
		case req.Slot != nil:
			if err := db.syncSlot(ctx, q, req, &expired, &st); err != nil {
				return err
			}
		case req.Adopt:
			if err := db.markPolling(ctx, q, req.RelayID); err != nil {
				return err
			}
		}
		if want := st.Target - len(held); want > 0 {
			ids, err := expired.lock(ctx, q, n)
			if err != nil {
				return err
			}
			taken, err := Collect(ctx, q, n.LeaseAcquire(), []any{req.RelayID, ttl, want, ids}, ScanInt64)
			if err != nil {
				return err
			}
			if len(taken) > 0 {
				if held, err = db.held(ctx, q, req.RelayID, append(known, taken...)); err != nil {
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

// expiredOwners is, once a round asked for it, the relays whose heartbeat expired,
// locked (LeaseLockExpired): the owners whose shard and slot leases the round may take.
type expiredOwners struct {
	ids    []string
	locked bool
}

func (e *expiredOwners) lock(ctx context.Context, q Querier, n *Names) ([]string, error) {
	if e.locked {
		return e.ids, nil
	}
	ids, err := Collect(ctx, q, n.LeaseLockExpired(), nil, func(r Row) (string, error) {
		var id string
		return id, r.Scan(&id)
	})
	if err != nil {
		return nil, err
	}
	e.ids, e.locked = ids, true
	return ids, nil
}

// syncSlot is a WAL-mode relay's part of a lease round (docs/design-wal.md, §4): it marks
// the relay's row as in WAL mode, keeps or takes the slot reader's lease, and sets the
// share of shards: every shard to the reader and none to the others while a live reader
// streams and every live relay is in WAL mode, the fair share otherwise. On an outbox
// without schema version 5 (no outbox_wal, no relays.mode) it changes nothing: the relay
// polls.
func (db *DB) syncSlot(ctx context.Context, q Querier, req outboxdriver.LeaseRequest, expired *expiredOwners, st *outboxdriver.LeaseState) error {
	n := db.names
	slot := n.WALSlot(req.Slot.Slot)
	// Locked before the savepoint: rolling back to it would release the locks.
	ids, err := expired.lock(ctx, q, n)
	if err != nil {
		return err
	}
	missing, err := optionalPart(ctx, q, func() error {
		if err := q.Exec(ctx, n.WALLeaseMode(), req.RelayID); err != nil {
			return err
		}
		var token int64
		if req.Slot.Token != 0 {
			held, err := Collect(ctx, q, n.WALLeaseHeld(), []any{req.RelayID, slot, req.Slot.Token}, ScanInt64)
			if err != nil {
				return err
			}
			if len(held) == 1 {
				token = held[0]
			}
		}
		if token == 0 {
			taken, err := Collect(ctx, q, n.WALLeaseTake(), []any{req.RelayID, slot, ids, req.Adopt, req.TTL.Milliseconds()}, ScanInt64)
			if err != nil {
				return err
			}
			if len(taken) == 1 {
				token = taken[0]
			}
		}
		type share struct {
			holder            *string
			streaming, allWAL bool
		}
		shares, err := Collect(ctx, q, n.WALLeaseShare(), []any{slot}, func(r Row) (share, error) {
			var s share
			return s, r.Scan(&s.holder, &s.streaming, &s.allWAL)
		})
		if err != nil || len(shares) == 0 { // no row: no such slot recorded
			return err
		}
		sh := shares[0]
		st.SlotToken = token
		if sh.holder != nil {
			st.SlotHolder = *sh.holder
		}
		if sh.streaming && sh.allWAL {
			st.Target = 0
			if token != 0 {
				st.Target = st.Shards
			}
		}
		if req.Slot.Beat && token != 0 && token == req.Slot.Token {
			return db.walBeat(ctx, q, slot, token, st)
		}
		return nil
	})
	if missing {
		st.SlotToken, st.SlotHolder = 0, ""
	}
	return err
}

// markPolling records, in a polling relay's first round, that the relay is not in WAL
// mode: a process that ran in WAL mode under the same ID and crashed left its row saying
// so, and while it does the slot's reader holds every shard and this relay none. An
// outbox before schema version 5 has no mode column.
func (db *DB) markPolling(ctx context.Context, q Querier, relayID string) error {
	_, err := optionalPart(ctx, q, func() error { return q.Exec(ctx, db.names.WALLeasePoll(), relayID) })
	return err
}

// optionalPart runs fn, a part of a lease round that needs a deferrable migration (WAL
// mode's bookkeeping, version 5; the relays' fingerprints, version 8), under a
// savepoint: on an outbox without it (an undefined table or column) it undoes fn and
// reports missing, without an error, so that the round goes on without that part (the
// relay polls; it compares no fingerprints).
func optionalPart(ctx context.Context, q Querier, fn func() error) (missing bool, err error) {
	if err := q.Exec(ctx, "SAVEPOINT outbox_optional"); err != nil {
		return false, err
	}
	err = fn()
	if state := SQLState(err); state == "42P01" || state == "42703" { // undefined table or column
		return true, q.Exec(ctx, "ROLLBACK TO SAVEPOINT outbox_optional")
	}
	if err != nil {
		return false, err
	}
	return false, q.Exec(ctx, "RELEASE SAVEPOINT outbox_optional")
}

// walBeat writes the slot reader's heartbeat under a savepoint of its own: a failure
// (the function's EXECUTE revoked, say) costs the relay its liveness check, which it
// logs (LeaseState.SlotBeatErr), not its lease round.
func (db *DB) walBeat(ctx context.Context, q Querier, slot string, token int64, st *outboxdriver.LeaseState) error {
	if err := q.Exec(ctx, "SAVEPOINT outbox_wal_beat"); err != nil {
		return err
	}
	var lsn string
	if err := q.QueryRow(ctx, db.names.WALHeartbeat(), []any{slot, token}, &lsn); err != nil {
		st.SlotBeatErr = err
		return q.Exec(ctx, "ROLLBACK TO SAVEPOINT outbox_wal_beat")
	}
	st.SlotBeat = true
	return q.Exec(ctx, "RELEASE SAVEPOINT outbox_wal_beat")
}

// held returns the relay's leases under tokens.
func (db *DB) held(ctx context.Context, q Querier, relayID string, tokens []int64) ([]outboxdriver.Lease, error) {
	return Collect(ctx, q, db.names.LeaseHeld(), []any{relayID, IntArray(tokens)}, func(r Row) (outboxdriver.Lease, error) {
		var l outboxdriver.Lease
		return l, r.Scan(&l.Shard, &l.Token)
	})
}

// DeletePublished implements outboxdriver.Store: it deletes up to limit published
// messages older than olderThan, then up to limit dedup keys of that age whose message is
// neither pending nor dead, each in one statement, and returns how many rows it deleted.
func (db *DB) DeletePublished(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	if err := db.ready(); err != nil {
		return 0, err
	}
	n, err := db.pool.ExecCount(ctx, db.names.DeletePublished(), olderThan.Seconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("delete published: %w", err)
	}
	keys, err := db.pool.ExecCount(ctx, db.names.DeleteDedup(), olderThan.Seconds(), limit)
	if err != nil {
		return int(n), fmt.Errorf("delete expired dedup keys: %w", err)
	}
	return int(n + keys), nil
}
