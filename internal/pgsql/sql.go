package pgsql

import "strings"

// ReadColumns lists the columns read back for a message, in scan order, each prefixed
// by alias (e.g. "o.").
func ReadColumns(alias string) string {
	a := alias
	return a + "seq, " + a + "id, " + a + "topic, " + a + "key, " + a + "aggregate_type, " + a + "event_type, " +
		a + "content_type, " + a + "payload, " + a + "headers, " + a + "dedup_key, " + a + "shard, " +
		a + "created_at, " + a + "attempts, coalesce(" + a + "last_error, '')"
}

// r replaces {{name}} placeholders in a statement with n's names.
func (n *Names) r(s string) string {
	return strings.NewReplacer(
		"{{outbox}}", n.Outbox, "{{leases}}", n.Leases, "{{relays}}", n.Relays,
		"{{token_seq}}", n.TokenSeq, "{{migrations}}", n.Migrations, "{{schema}}", n.Schema,
	).Replace(s)
}

// InsertUnnest inserts messages passed as parallel arrays, in array order, skipping dedup
// conflicts and returning the dedup keys written.
func (n *Names) InsertUnnest() string {
	return n.r(`INSERT INTO {{outbox}} (id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, next_attempt_at)
SELECT m.id, m.topic, m.key, m.aggregate_type, m.event_type, m.content_type, m.payload, m.headers::jsonb, m.dedup_key,
       CASE WHEN m.deliver_at IS NULL THEN now() ELSE greatest(now(), m.deliver_at) END
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bytea[], $8::text[], $9::text[], $10::timestamptz[])
     WITH ORDINALITY AS m(id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, deliver_at, ord)
ORDER BY m.ord
ON CONFLICT (dedup_key) DO NOTHING
RETURNING dedup_key`)
}

// InsertValuesColumns is the number of parameters per row of InsertValues.
const InsertValuesColumns = 10

// InsertValues inserts rows rows with plain placeholders, for database/sql drivers that
// cannot bind arrays.
func (n *Names) InsertValues(rows int) string {
	var b strings.Builder
	b.WriteString(n.r(`INSERT INTO {{outbox}} (id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, next_attempt_at) VALUES `))
	p := 1
	for i := 0; i < rows; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(")
		for c := 0; c < InsertValuesColumns; c++ {
			if c > 0 {
				b.WriteString(", ")
			}
			ph := "$" + itoa(p)
			switch c {
			case 0:
				b.WriteString(ph + "::uuid")
			case 7:
				b.WriteString(ph + "::jsonb")
			case 9:
				b.WriteString("CASE WHEN " + ph + "::timestamptz IS NULL THEN now() ELSE greatest(now(), " + ph + "::timestamptz) END")
			default:
				b.WriteString(ph)
			}
			p++
		}
		b.WriteString(")")
	}
	b.WriteString(" ON CONFLICT (dedup_key) DO NOTHING RETURNING dedup_key")
	return b.String()
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

// Fetch returns due messages of the relay's unexpired shards in seq order. $1 relay id,
// $2 shards, $3 seqs to exclude, $4 limit.
//
// A key is held back while an earlier message of it waits (retry or delay); the "waiting"
// index holds only such rows, so the check is cheap when nothing is failing.
func (n *Names) Fetch() string {
	return n.r(`SELECT ` + ReadColumns("o.") + `
FROM {{outbox}} o
WHERE o.published_at IS NULL AND o.dead_at IS NULL
  AND o.next_attempt_at <= now()
  AND o.shard = ANY(ARRAY(SELECT l.shard FROM {{leases}} l WHERE l.owner = $1 AND l.expires_at > now() AND l.shard = ANY($2::smallint[])))
  AND o.seq NOT IN (SELECT unnest($3::bigint[]))
  AND (o.key = '' OR NOT EXISTS (
        SELECT 1 FROM {{outbox}} w
        WHERE w.key = o.key AND w.seq < o.seq
          AND w.published_at IS NULL AND w.dead_at IS NULL
          AND w.next_attempt_at > w.created_at AND w.next_attempt_at > now()))
ORDER BY o.seq
LIMIT $4`)
}

// Complete records outcomes in one statement, fenced: a row is updated only if its
// shard's lease is still the relay's, unexpired, under one of the tokens the relay
// claims ($2). Tokens are unique per shard ownership, so that is the token under which
// the relay fetched the row (the relay drops outcomes whose token it no longer holds
// before it calls this). The lease rows are locked FOR SHARE, so a takeover waits for
// this statement. Rows are found by "seq = ANY", a primary-key lookup that stays cheap
// however the planner's statistics look. $1 relay id, $2 tokens, $3 published seqs,
// $4..$7 failed seqs/errors/delay ms/dead. Returns the applied seqs.
func (n *Names) Complete() string {
	return n.r(`WITH valid AS (
    SELECT shard FROM {{leases}}
    WHERE owner = $1 AND expires_at > now() AND token = ANY($2::bigint[])
    FOR SHARE
), pub AS (
    UPDATE {{outbox}} o SET published_at = now()
    WHERE o.seq = ANY($3::bigint[]) AND o.shard IN (SELECT shard FROM valid)
      AND o.published_at IS NULL AND o.dead_at IS NULL
    RETURNING o.seq
), fail AS (
    UPDATE {{outbox}} o SET attempts = o.attempts + 1, last_error = f.err,
        next_attempt_at = CASE WHEN f.dead THEN o.next_attempt_at ELSE now() + f.delay_ms * interval '1 millisecond' END,
        dead_at = CASE WHEN f.dead THEN now() END
    FROM unnest($4::bigint[], $5::text[], $6::bigint[], $7::bool[]) AS f(seq, err, delay_ms, dead)
    WHERE o.seq = ANY($4::bigint[]) AND o.seq = f.seq AND o.shard IN (SELECT shard FROM valid)
      AND o.published_at IS NULL AND o.dead_at IS NULL
    RETURNING o.seq
)
SELECT seq FROM pub UNION ALL SELECT seq FROM fail`)
}

// DeletePublished deletes up to $2 rows published before now() - $1 (seconds).
func (n *Names) DeletePublished() string {
	return n.r(`DELETE FROM {{outbox}} WHERE seq IN (
    SELECT seq FROM {{outbox}}
    WHERE created_at < now() - $1 * interval '1 second' AND published_at < now() - $1 * interval '1 second'
    LIMIT $2 FOR UPDATE SKIP LOCKED)`)
}

// Lease statements, run in one transaction by SyncLeases.
func (n *Names) LeaseHeartbeat() string {
	return n.r(`INSERT INTO {{relays}} (id, hostname, pid, expires_at) VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond')
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), expires_at = excluded.expires_at, hostname = excluded.hostname, pid = excluded.pid`)
}

func (n *Names) LeaseForgetRelay() string { return n.r(`DELETE FROM {{relays}} WHERE id = $1`) }

func (n *Names) LeasePruneRelays() string {
	return n.r(`DELETE FROM {{relays}} WHERE expires_at < now() - interval '1 hour'`)
}

func (n *Names) LeaseRelease() string {
	return n.r(`UPDATE {{leases}} SET owner = NULL, expires_at = '-infinity' WHERE owner = $1 AND token = ANY($2::bigint[])`)
}

func (n *Names) LeaseRenew() string {
	return n.r(`UPDATE {{leases}} SET expires_at = now() + $2 * interval '1 millisecond' WHERE owner = $1 AND token = ANY($3::bigint[])`)
}

func (n *Names) LeaseCounts() string {
	return n.r(`SELECT (SELECT count(*) FROM {{leases}}), (SELECT count(*) FROM {{relays}} WHERE expires_at > now())`)
}

func (n *Names) LeaseAcquire() string {
	return n.r(`UPDATE {{leases}} SET owner = $1, token = nextval('{{token_seq}}'), expires_at = now() + $2 * interval '1 millisecond'
WHERE shard IN (SELECT shard FROM {{leases}} WHERE owner IS NULL OR expires_at <= now() ORDER BY shard LIMIT $3 FOR UPDATE SKIP LOCKED)`)
}

func (n *Names) LeaseHeld() string {
	return n.r(`SELECT shard, token FROM {{leases}} WHERE owner = $1 AND expires_at > now() ORDER BY shard`)
}
