package pgsql

// InboxClaim records ($1 consumer, each of $2 message ids) unless recorded, and returns
// the ids it recorded. ON CONFLICT DO NOTHING waits for a concurrent transaction that
// inserted the same row: it conflicts if that one commits and inserts if it rolls back.
func (n *Names) InboxClaim() string {
	return `INSERT INTO ` + n.Inbox + ` (consumer, message_id) SELECT $1, unnest($2::text[])
ON CONFLICT DO NOTHING RETURNING message_id`
}

// InboxDelete deletes up to $2 inbox rows processed more than $1 seconds ago.
func (n *Names) InboxDelete() string {
	return `DELETE FROM ` + n.Inbox + ` WHERE ctid IN (
    SELECT ctid FROM ` + n.Inbox + ` WHERE processed_at < now() - $1 * interval '1 second' LIMIT $2 FOR UPDATE SKIP LOCKED)`
}

// InboxFresh maps the ids a claim returned back onto the ids asked for.
func InboxFresh(ids, recorded []string) []bool {
	got := make(map[string]bool, len(recorded))
	for _, id := range recorded {
		got[id] = true
	}
	fresh := make([]bool, len(ids))
	for i, id := range ids {
		fresh[i] = got[id]
	}
	return fresh
}

// VersionAdvance sets the version of aggregate ($2 type, $3 id) for consumer $1 to $4 if
// $4 is newer than the stored one (or none is stored), and returns a row only then. A
// concurrent transaction advancing the same aggregate holds its row: this one waits, then
// compares with what that one committed.
func (n *Names) VersionAdvance() string {
	return `INSERT INTO ` + n.Versions + ` AS v (consumer, aggregate_type, aggregate_id, version) VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer, aggregate_type, aggregate_id) DO UPDATE SET version = EXCLUDED.version, updated_at = now()
WHERE v.version < EXCLUDED.version
RETURNING true`
}
