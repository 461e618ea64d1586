package pgsql

// This file holds what WAL mode's stream reader (outboxpgx's Streamer) needs to know of
// the outbox: which relation its inserts arrive on, the prefix of the heartbeat
// messages, and the statement that finds when the next waiting message becomes due
// (docs/design-wal.md, §§1, 2, 6).

// WALHeartbeatPrefix is the prefix of the heartbeat messages the relay writes with
// pg_logical_emit_message, and that the stream reader reports as beats.
const WALHeartbeatPrefix = "outbox.hb"

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

// WALSlotRecorded is whether the slot $1 has its row in outbox_wal: a relay opens the
// stream only then, and 'outbox wal drop' deletes the row before it drops the slot.
func (n *Names) WALSlotRecorded() string {
	return "SELECT EXISTS (SELECT 1 FROM " + n.walTable() + " WHERE slot_name = $1)"
}

// WALRecordState sets the slot's ($1) state ($2) and reason ($3) in outbox_wal, when
// they changed (state_at says since when).
func (n *Names) WALRecordState() string {
	return "UPDATE " + n.walTable() + ` SET state = $2, state_reason = $3, state_at = now()
WHERE slot_name = $1 AND (state, state_reason) IS DISTINCT FROM ($2, $3)`
}
