package pgsql

import (
	"context"

	"github.com/outboxkit/outbox/outboxdriver"
)

// This file holds what WAL mode's stream reader (outboxpgx's Streamer) needs to know of
// the outbox: which relation its inserts arrive on, the prefix of the heartbeat
// messages, and the statement that finds when the next waiting message becomes due
// (docs/design-wal.md, §§1, 2, 6).

// WALHeartbeatPrefix is the prefix of the heartbeat messages the relay writes with
// pg_logical_emit_message, and that the stream reader reports as beats.
const WALHeartbeatPrefix = "outbox.hb"

// WALHeartbeat writes a heartbeat into the log for the slot $1's reader holding the lease
// under token $2: a non-transactional logical decoding message (it reaches the log, and
// the stream, even if the round's transaction rolls back), whose content names the slot
// and the token.
func (n *Names) WALHeartbeat() string {
	return `SELECT pg_logical_emit_message(false, '` + WALHeartbeatPrefix + `', $1::text || ':' || $2::bigint)::text`
}

// OutboxRelation returns the schema and the name of the outbox table, unquoted, as a
// logical replication Relation message names it: the publication publishes via the
// partition root, so inserts into any bucket of the pending ring arrive as inserts
// into this table.
func (n *Names) OutboxRelation() (schema, table string) { return n.schema, n.prefix + "outbox" }

// NextDue returns, of the pending messages of the shards $1 (smallint[]) that wait (a
// retry backing off, or a delayed message: next_attempt_at > created_at, the "waiting"
// partial index), how many microseconds remain until the earliest becomes due, by the
// database's clock: NULL when none waits. The caller adds the delay to its own clock, so
// a skew between the two clocks does not move its timer.
//
// The partitioned parent is queried, so every bucket of the ring is read.
func (n *Names) NextDue() string {
	return `SELECT ceil(extract(epoch FROM min(next_attempt_at) - now()) * 1000000)::bigint FROM ` + n.Outbox + `
WHERE next_attempt_at > created_at AND next_attempt_at > now() AND shard = ANY($1::smallint[])`
}

// Waiting returns the seq and key of the pending messages of the shards $1 (smallint[])
// that wait (the "waiting" partial index's predicate: a retry or a delayed message, due
// or not) and of every other pending message of their keys, at most $2 rows; keyless
// ones hold nothing back and are left out. Each row carries the log's insert position
// when the row was read (pg_current_wal_lsn, as text): past the commit of every
// transaction the statement's snapshot sees.
func (n *Names) Waiting() string {
	return `SELECT o.seq, o.key, pg_current_wal_lsn()::text FROM ` + n.Outbox + ` o
WHERE o.key IN (SELECT w.key FROM ` + n.Outbox + ` w
                WHERE w.next_attempt_at > w.created_at AND w.key <> '' AND w.shard = ANY($1::smallint[]))
  AND o.shard = ANY($1::smallint[])
LIMIT $2`
}

// WALSlotRecorded is whether the slot $1 has its row in outbox_wal: a relay opens the
// stream only then, and 'outbox wal drop' deletes the row before it drops the slot.
func (n *Names) WALSlotRecorded() string {
	return "SELECT EXISTS (SELECT 1 FROM " + n.walTable() + " WHERE slot_name = $1)"
}

// WALRecordState sets the slot's ($1) state ($2) and reason ($3) in outbox_wal, when
// they changed (state_at says since when), if the relay $4 holds the slot's lease under
// the token $5: the holder's state is what decides the share of shards.
func (n *Names) WALRecordState() string {
	return "UPDATE " + n.walTable() + ` SET state = $2, state_reason = $3, state_at = now()
WHERE slot_name = $1 AND owner = $4 AND token = $5 AND (state, state_reason) IS DISTINCT FROM ($2, $3)`
}

// The slot reader's lease (docs/design-wal.md, §4) rides in SyncLeases' transaction for a
// relay in WAL mode, as the shard leases do: its row in outbox_wal says who reads the
// slot (owner, token), written only when it changes hands, and the owner's heartbeat in
// the relays table keeps it. The statements run under a savepoint, so that an outbox
// without schema version 5 leaves the relay polling rather than failing its rounds.

// WALLeaseRelease gives back the slot $2's lease the relay $1 holds under token $3.
func (n *Names) WALLeaseRelease() string {
	return n.lease("UPDATE " + n.walTable() + ` SET owner = NULL, expires_at = '-infinity'
WHERE slot_name = $2 AND owner = $1 AND token = $3`)
}

// WALLeaseMode records that the relay $1 is in WAL mode, when its row says otherwise:
// the share of shards goes to the slot's reader only while every live relay is.
func (n *Names) WALLeaseMode() string {
	return n.lease(`UPDATE {{relays}} SET mode = 'wal' WHERE id = $1 AND mode <> 'wal'`)
}

// WALLeasePoll records that the relay $1 polls, when its row says otherwise (left by an
// earlier process under the same ID that ran in WAL mode).
func (n *Names) WALLeasePoll() string {
	return n.lease(`UPDATE {{relays}} SET mode = 'poll' WHERE id = $1 AND mode <> 'poll'`)
}

// WALLeaseHeld returns the token of the slot $2's lease if the relay $1 holds it under
// $3 (no row otherwise).
func (n *Names) WALLeaseHeld() string {
	return n.lease("SELECT token FROM " + n.walTable() + " WHERE slot_name = $2 AND owner = $1 AND token = $3")
}

// WALLeaseTake gives the relay $1 the lease of the slot $2 under a new token, and returns
// it, if the lease is free, its owner is among $3 (expired, locked by LeaseLockExpired),
// it is the relay's own under another token and $4 (adopt), or its owner has no row and
// it was taken more than a TTL ago (LeaseAcquire says why that last check needs the
// row's expires_at). The state goes back to starting: the new reader says when it
// streams. $5 is the TTL in ms, for expires_at.
func (n *Names) WALLeaseTake() string {
	return n.lease("UPDATE " + n.walTable() + ` w SET owner = $1, token = nextval('{{token_seq}}'),
    expires_at = now() + $5 * interval '1 millisecond', state = 'starting', state_reason = '', state_at = now()
WHERE w.slot_name = $2 AND (w.owner IS NULL OR w.owner = ANY($3::text[]) OR (w.owner = $1 AND $4::boolean)
   OR (w.expires_at <= now() AND NOT EXISTS (SELECT 1 FROM {{relays}} r WHERE r.id = w.owner)))
RETURNING token`)
}

// WALLeaseShare returns, for the slot $1 (no row: not set up, or dropped), the holder of
// its lease (NULL: none), whether that holder is live and has recorded that it streams,
// and whether every live relay is in WAL mode.
func (n *Names) WALLeaseShare() string {
	return n.lease(`SELECT w.owner,
    w.state = 'streaming' AND EXISTS (SELECT 1 FROM {{relays}} r WHERE r.id = w.owner AND r.expires_at > now()),
    NOT EXISTS (SELECT 1 FROM {{relays}} WHERE expires_at > now() AND mode <> 'wal')
FROM ` + n.walTable() + ` w WHERE w.slot_name = $1`)
}

// WALTerminateReader ends the session that reads the slot $1 (a reader whose lease
// expired while it was paused keeps the slot until wal_sender_timeout), only while the
// relay $2 holds the slot's lease under the token $3: the row is locked FOR SHARE, so
// no other relay takes the lease meanwhile. It returns whether a session was ended.
func (n *Names) WALTerminateReader() string {
	return n.lease(`WITH lease AS (SELECT slot_name FROM ` + n.walTable() + `
    WHERE slot_name = $1 AND owner = $2 AND token = $3 FOR SHARE)
SELECT coalesce(bool_or(pg_terminate_backend(s.active_pid, 5000)), false)
FROM pg_replication_slots s JOIN lease USING (slot_name) WHERE s.active_pid IS NOT NULL`)
}

// walSlotStatus fills the slots recorded in outbox_wal, with PostgreSQL's view of each
// (nothing before schema version 5).
func (n *Names) walSlotStatus(ctx context.Context, q Querier, st *outboxdriver.Status) error {
	var recorded bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, []any{n.walTable()}, &recorded); err != nil || !recorded {
		return err
	}
	slots, err := Collect(ctx, q, `WITH pos AS (
    SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END AS lsn)
SELECT w.slot_name, w.state, w.state_reason, w.state_at, coalesce(w.owner, ''),
    s.slot_name IS NOT NULL, coalesce(s.active, false), coalesce(s.wal_status, ''),
    coalesce(pg_wal_lsn_diff(pos.lsn, s.confirmed_flush_lsn), 0)::bigint,
    coalesce(pg_wal_lsn_diff(pos.lsn, s.restart_lsn), 0)::bigint,
    s.safe_wal_size
FROM pos, `+n.walTable()+` w LEFT JOIN pg_replication_slots s ON s.slot_name = w.slot_name
ORDER BY w.slot_name`, nil, func(r Row) (outboxdriver.WALSlotStatus, error) {
		var w outboxdriver.WALSlotStatus
		err := r.Scan(&w.Slot, &w.State, &w.Reason, &w.StateSince, &w.Reader, &w.Exists, &w.Active, &w.WALStatus,
			&w.LagBytes, &w.RetainedBytes, &w.SafeWALSizeBytes)
		return w, err
	})
	st.WAL = slots
	return err
}
