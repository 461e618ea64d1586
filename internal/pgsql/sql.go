package pgsql

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/outboxkit/outbox/internal/broken"
)

// ReadColumns lists the columns read back for a pending message, in scan order, each
// prefixed by alias (e.g. "o."). Headers come as text: pgx decodes jsonb through
// encoding/json, which costs the relay more than parsing the few headers itself.
func ReadColumns(alias string) string {
	a := alias
	return a + "seq, " + a + "id, " + a + "topic, " + a + "key, " + a + "aggregate_type, " + a + "event_type, " +
		a + "content_type, " + a + "payload, " + a + "headers::text, " + a + "dedup_key, " + a + "shard, " +
		a + "created_at, " + a + "attempts, coalesce(" + a + "last_error, '')"
}

// messageColumns are the columns every table of the three (pending, published, dead)
// shares, for moving rows between them.
const messageColumns = "seq, id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, shard, created_at, attempts"

// r replaces {{name}} placeholders in a statement with n's names.
func (n *Names) r(s string) string {
	return strings.NewReplacer(
		"{{outbox}}", n.Outbox, "{{published}}", n.Published, "{{dead}}", n.Dead, "{{dedup}}", n.Dedup,
		"{{leases}}", n.Leases, "{{relays}}", n.Relays,
		"{{token_seq}}", n.TokenSeq, "{{migrations}}", n.Migrations, "{{schema}}", n.Schema,
		"{{columns}}", messageColumns,
	).Replace(s)
}

// insertFrom inserts the messages of the relation m (columns id, topic, key,
// aggregate_type, event_type, content_type, payload, headers (text), dedup_key,
// deliver_at, ord, and priority when prio is set) in ord order. A message's dedup key is
// claimed in the dedup table first; a message whose key is taken, by an earlier message
// of the same call or by any message still kept, is skipped. ON CONFLICT DO NOTHING
// waits for a concurrent transaction that holds the same key and inserts if that one
// rolls back. An empty dedup_key marks a message whose id was generated for it: its id's
// text is its dedup key, unclaimed, because no other message can hold it. Returns the
// dedup keys written.
//
// Only statements for messages with a priority name the priority column (schema version
// 10): the others cost nothing more, and run on an older schema.
func (n *Names) insertFrom(m string, prio bool) string {
	cols, vals := "", ""
	if prio {
		cols, vals = ", priority", ", m.priority"
	}
	return n.r(`WITH m AS (` + m + `),
firsts AS (
    SELECT DISTINCT ON (dedup_key) dedup_key, ord FROM m WHERE dedup_key <> '' ORDER BY dedup_key, ord
), claimed AS (
    INSERT INTO {{dedup}} (dedup_key) SELECT dedup_key FROM firsts ORDER BY ord
    ON CONFLICT (dedup_key) DO NOTHING
    RETURNING dedup_key
)
INSERT INTO {{outbox}} (id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, next_attempt_at` + cols + `)
SELECT m.id, m.topic, m.key, m.aggregate_type, m.event_type, m.content_type, m.payload, m.headers::jsonb,
       CASE WHEN m.dedup_key = '' THEN m.id::text ELSE m.dedup_key END,
       CASE WHEN m.deliver_at IS NULL THEN now() ELSE greatest(now(), m.deliver_at) END` + vals + `
FROM m
WHERE m.dedup_key = ''
   OR (m.ord IN (SELECT ord FROM firsts) AND m.dedup_key IN (SELECT dedup_key FROM claimed))
ORDER BY m.ord
RETURNING dedup_key`)
}

// InsertUnnest inserts messages passed as parallel arrays ($1..$10, and $11 their
// priorities when prio is set), in array order.
func (n *Names) InsertUnnest(prio bool) string {
	if prio {
		return n.insertFrom(`SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bytea[], $8::text[], $9::text[], $10::timestamptz[], $11::smallint[])
     WITH ORDINALITY AS u(id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, deliver_at, priority, ord)`, true)
	}
	return n.insertFrom(`SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bytea[], $8::text[], $9::text[], $10::timestamptz[])
     WITH ORDINALITY AS u(id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, deliver_at, ord)`, false)
}

// InsertOne inserts one message ($1..$10 as one row of InsertValues, $9 a dedup key that
// is not empty), which is what most Write calls carry: a plain INSERT of the claimed
// dedup key, without the set logic that orders and deduplicates several messages, costs
// the writer's transaction less. It returns no row when the key is taken.
func (n *Names) InsertOne() string {
	return n.r(`WITH claimed AS (
    INSERT INTO {{dedup}} (dedup_key) VALUES ($9::text)
    ON CONFLICT (dedup_key) DO NOTHING
    RETURNING dedup_key
)
INSERT INTO {{outbox}} (id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, next_attempt_at)
SELECT $1::uuid, $2::text, $3::text, $4::text, $5::text, $6::text, $7::bytea, $8::text::jsonb, dedup_key,
       CASE WHEN $10::timestamptz IS NULL THEN now() ELSE greatest(now(), $10::timestamptz) END
FROM claimed
RETURNING dedup_key`)
}

// InsertFresh is InsertOne for a message whose id was generated for it ($9 empty): its
// dedup key is its id's text, which no other message can hold, so nothing is claimed and
// the write is one plain INSERT.
func (n *Names) InsertFresh() string {
	return n.r(`INSERT INTO {{outbox}} (id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, next_attempt_at)
VALUES ($1::uuid, $2::text, $3::text, $4::text, $5::text, $6::text, $7::bytea, $8::text::jsonb,
        CASE WHEN $9::text = '' THEN $1::uuid::text END, -- NULL, refused, if a key was given
        CASE WHEN $10::timestamptz IS NULL THEN now() ELSE greatest(now(), $10::timestamptz) END)
RETURNING dedup_key`)
}

// InsertValuesColumns is the number of parameters per row of InsertValues, without a
// priority (the eleventh, when prio is set).
const InsertValuesColumns = 10

// InsertValues inserts rows messages with plain placeholders, for database/sql drivers
// that cannot bind arrays.
func (n *Names) InsertValues(rows int, prio bool) string {
	cols := InsertValuesColumns
	if prio {
		cols++
	}
	var b strings.Builder
	b.WriteString(`SELECT * FROM (VALUES `)
	p := 1
	for i := 0; i < rows; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(")
		for c := 0; c < cols; c++ {
			ph := "$" + strconv.Itoa(p)
			switch c {
			case 0:
				ph += "::uuid"
			case 6:
				ph += "::bytea"
			case 9:
				ph += "::timestamptz"
			case 10:
				ph += "::smallint"
			default:
				ph += "::text"
			}
			b.WriteString(ph + ", ")
			p++
		}
		b.WriteString(strconv.Itoa(i+1) + ")")
	}
	if prio {
		b.WriteString(`) AS v(id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, deliver_at, priority, ord)`)
	} else {
		b.WriteString(`) AS v(id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, deliver_at, ord)`)
	}
	return n.insertFrom(b.String(), prio)
}

// Fetch returns due pending messages of the relay's unexpired shards in seq order. $1
// relay id, $2 shards, $3 seqs to exclude, $4 limit.
//
// A fresh row (next_attempt_at = created_at: never retried, not delayed) is due whatever
// the clocks say. Its next_attempt_at is its writer's transaction start, which can be
// later than the fetch's now() (the fetch's statement start) when the writer began after
// the fetch did but committed before the fetch took its snapshot (it waited for a lock, a
// connection, the CPU). Judged by now(), such a row would be "not due" while its key's
// later rows, from writers that began earlier, are: they would overtake it. Only a row
// that waits (a retry, a delay) is judged by the clock, and it holds its key back.
//
// A key is held back while an earlier message of it waits (retry or delay). The waiting
// rows are read once per statement, from the "waiting" index, which holds only such rows,
// into a JSON object of each key's lowest waiting seq; each candidate row then costs one
// lookup in it. (A probe of the index per candidate row would cost a scan of every bucket
// of the pending ring per row: four times as much for a full fetch, measured.)
func (n *Names) Fetch() string {
	return n.fetch(`o.seq NOT IN (SELECT unnest($3::bigint[]))`)
}

// FetchAfter is Fetch for a continuation: only seqs above $3, no exclusion list, and no
// row whose key has a pending row at or below $3 that the relay does not hold. The relay
// holds, of each key of the JSON object $5 (HeldKeys), the rows up to the seq it maps to;
// of other keys, none. Without that check a key's older row that the relay does not hold (a retry it let
// go of, a shard it just gained, a transaction that committed after the fetch that set
// the cursor) would be overtaken by a newer one.
func (n *Names) FetchAfter() string {
	if broken.Has(broken.NoKeyGate) {
		return n.fetch(`o.seq > $3 AND $5::jsonb IS NOT NULL`) // canary: held keys ignored
	}
	return n.fetch(`o.seq > $3
  AND (o.key = '' OR NOT EXISTS (
        SELECT 1 FROM {{outbox}} e WHERE e.key = o.key AND e.seq <= $3
          AND e.seq > coalesce(($5::jsonb ->> o.key)::bigint, 0)))`)
}

// FetchPriority returns due messages with a priority above 0 of the relay's unexpired
// shards, highest priority first, then in seq order (outboxdriver.PriorityFetcher), with
// their priority last. $1 relay id, $2 shards, $3 seqs the relay holds, $4 limit, $5 the
// keys it holds (HeldKeys).
//
// A row is taken only if every earlier pending row of its key that the relay does not
// hold (above the key's held seq in $5) is due and of the same priority: those come
// first. It is worked out per key, not per row (a probe per row would read the rows of
// its key before it, n²/2 for a key of n rows): the candidates are the first 2×$4 rows
// with a priority, in the order of the partial priority index; for each key among them,
// one probe of the key index finds the first row from the key's held seq up that stops
// the key: one before its first candidate, or one of another priority than that
// candidate's, or one that waits (a retry, a delay). The key's candidates before it are
// taken. A row the relay holds above its key's held seq (a key whose lane failed, or
// whose messages are all confirmed and being recorded) stops the key too, until the next
// fetch. Rows are read whole only once chosen, by primary key: a large payload is never
// sorted.
func (n *Names) FetchPriority() string {
	stop := `e.seq < k.lo OR e.priority <> f.priority OR NOT (e.next_attempt_at <= now() OR e.next_attempt_at = e.created_at)`
	if broken.Has(broken.PriorityOvertakes) {
		stop = `false` // canary: nothing stops a key
	}
	return n.r(`WITH c AS MATERIALIZED (
    SELECT o.seq, o.bucket, o.key, o.priority, coalesce(($5::jsonb ->> o.key)::bigint, 0) AS held
    FROM (SELECT p.seq, p.bucket, p.key, p.priority, p.shard, p.next_attempt_at, p.created_at FROM {{outbox}} p
          WHERE p.priority > 0 AND p.seq NOT IN (SELECT unnest($3::bigint[]))
          ORDER BY p.priority DESC, p.seq LIMIT $4 * 2) o
    WHERE (o.next_attempt_at <= now() OR o.next_attempt_at = o.created_at)
      AND o.shard = ANY(ARRAY(SELECT l.shard FROM {{leases}} l WHERE l.owner = $1 AND l.shard = ANY($2::smallint[])))
), k AS (
    SELECT c.key, min(c.seq) AS lo, max(c.seq) AS hi, max(c.held) AS held FROM c WHERE c.key <> '' GROUP BY c.key
), open AS MATERIALIZED (
    SELECT k.key, coalesce(b.seq, k.hi + 1) AS upto
    FROM k JOIN c f ON f.key = k.key AND f.seq = k.lo
    LEFT JOIN LATERAL (
        SELECT e.seq FROM {{outbox}} e
        WHERE e.key = k.key AND e.seq > k.held AND e.seq <= k.hi AND (` + stop + `)
        ORDER BY e.seq LIMIT 1) b ON true
), chosen AS (
    SELECT c.seq, c.bucket FROM c LEFT JOIN open ON open.key = c.key
    WHERE c.key = '' OR c.seq < open.upto
    ORDER BY c.priority DESC, c.seq
    LIMIT $4
)
SELECT ` + ReadColumns("o.") + `, o.priority
FROM chosen JOIN {{outbox}} o ON o.seq = chosen.seq AND o.bucket = chosen.bucket
ORDER BY o.priority DESC, o.seq`)
}

// HeldKeys renders the keys a relay holds (FetchRequest.Held), for FetchAfter's $5: a
// JSON object of each key to the highest seq held. A jsonb object is looked up by binary
// search, so the check costs one lookup and one index probe per row, and the scan keeps
// its seq order.
func HeldKeys(held map[string]int64) (string, error) {
	b, err := json.Marshal(held)
	return string(b), err
}

func (n *Names) fetch(cond string) string {
	leased := `o.shard = ANY(ARRAY(SELECT l.shard FROM {{leases}} l WHERE l.owner = $1 AND l.shard = ANY($2::smallint[])))`
	if broken.Has(broken.NoKeyGate) {
		leased = `$1::text IS NOT NULL AND $2::smallint[] IS NOT NULL` // canary: every shard's rows
	}
	return n.r(`SELECT ` + ReadColumns("o.") + `
FROM {{outbox}} o
WHERE (o.next_attempt_at <= now() OR o.next_attempt_at = o.created_at)
  AND ` + leased + `
  AND ` + cond + `
  AND (o.key = '' OR o.seq <= coalesce(((
        SELECT jsonb_object_agg(w.key, w.seq) FROM (
            SELECT w.key, min(w.seq) AS seq FROM {{outbox}} w
            WHERE w.next_attempt_at > w.created_at AND w.next_attempt_at > now()
            GROUP BY w.key) w) ->> o.key)::bigint, o.seq))
ORDER BY o.seq
LIMIT $4`)
}

// Complete records outcomes in one statement, fenced: a row is touched only if its
// shard's lease is still the relay's, under one of the tokens the relay claims ($2). No
// time is read: a lease changes hands (owner and token) only when another relay takes it
// after its owner's heartbeat expired, and until then the owner's outcomes are its own.
// Tokens are unique per shard ownership, so that is the token under which the relay
// fetched the row (the relay drops outcomes whose token it no longer holds
// before it calls this). The lease rows are locked FOR SHARE, so a takeover waits for
// this statement. Rows are found by "seq = ANY", a primary-key lookup that stays cheap
// however the planner's statistics look.
//
// Published rows move to the published table, dead ones to the dead table, retried ones
// get their attempt counted (unless deferred) and their next attempt time set. $1 relay
// id, $2 tokens, $3 published seqs, $4..$6 retried seqs/errors/delay ms, $7..$8 dead
// seqs/errors, $9 the attempts each retry counts (1, or 0 deferred). Returns the seqs it
// applied.
func (n *Names) Complete() string {
	return n.r(`WITH valid AS (
    SELECT shard FROM {{leases}}
    WHERE owner = $1 AND token = ANY($2::bigint[])
    FOR SHARE
), pub AS (
    DELETE FROM {{outbox}} o
    WHERE o.seq = ANY($3::bigint[]) AND o.shard = ANY(ARRAY(SELECT shard FROM valid))
    RETURNING {{columns}}
), pub_moved AS (
    INSERT INTO {{published}} ({{columns}}) SELECT {{columns}} FROM pub
    RETURNING seq
), retry AS (
    UPDATE {{outbox}} o SET attempts = o.attempts + f.counted, last_error = f.err,
        next_attempt_at = now() + f.delay_ms * interval '1 millisecond'
    FROM unnest($4::bigint[], $5::text[], $6::bigint[], $9::int[]) AS f(seq, err, delay_ms, counted)
    WHERE o.seq = ANY($4::bigint[]) AND o.seq = f.seq AND o.shard = ANY(ARRAY(SELECT shard FROM valid))
    RETURNING o.seq
), died AS (
    DELETE FROM {{outbox}} o
    WHERE o.seq = ANY($7::bigint[]) AND o.shard = ANY(ARRAY(SELECT shard FROM valid))
    RETURNING {{columns}}
), dead_moved AS (
    INSERT INTO {{dead}} ({{columns}}, last_error)
    SELECT d.seq, d.id, d.topic, d.key, d.aggregate_type, d.event_type, d.content_type, d.payload, d.headers,
           d.dedup_key, d.shard, d.created_at, d.attempts + 1, e.err
    FROM died d JOIN unnest($7::bigint[], $8::text[]) AS e(seq, err) ON e.seq = d.seq
    RETURNING seq
)
SELECT seq FROM pub_moved UNION ALL SELECT seq FROM retry UNION ALL SELECT seq FROM dead_moved`)
}

// DeletePublished deletes up to $2 published rows older than $1 seconds. A row is named
// by its table and ctid: once the history is partitioned (migration 3), a ctid alone is
// the same in every partition. Relays drop whole days instead (DropPartitions); this
// serves Store.DeletePublished's callers and the layout before migration 3.
func (n *Names) DeletePublished() string {
	return n.r(`DELETE FROM {{published}} p USING (
    SELECT tableoid AS t, ctid AS c FROM {{published}} WHERE published_at < now() - $1 * interval '1 second' LIMIT $2 FOR UPDATE SKIP LOCKED
) x WHERE p.tableoid = x.t AND p.ctid = x.c`)
}

// DeleteDedup deletes up to $2 dedup keys written more than $1 seconds ago whose message
// is neither pending nor dead: past the retention time a published message's key may be
// used again. The pending table is the backlog, small enough to hash; dead letters are
// looked up by index.
func (n *Names) DeleteDedup() string {
	return n.r(`DELETE FROM {{dedup}} WHERE dedup_key IN (
    SELECT k.dedup_key FROM {{dedup}} k
    WHERE k.created_at < now() - $1 * interval '1 second'
      AND k.dedup_key NOT IN (SELECT dedup_key FROM {{outbox}})
      AND NOT EXISTS (SELECT 1 FROM {{dead}} d WHERE d.dedup_key = k.dedup_key)
    LIMIT $2 FOR UPDATE SKIP LOCKED)`)
}

// Replay moves dead letters back to pending with their original seq, id and dedup key
// (so consumers deduplicate, and the message keeps its place among its key's), attempts
// reset, due at once (next_attempt_at = created_at keeps it out of the waiting index).
// $1 seqs. Returns the seqs moved.
func (n *Names) Replay() string {
	return n.r(`WITH back AS (
    DELETE FROM {{dead}} WHERE seq = ANY($1::bigint[])
    RETURNING seq, id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, created_at, last_error
)
INSERT INTO {{outbox}} (seq, id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, created_at, next_attempt_at, attempts, last_error)
OVERRIDING SYSTEM VALUE
SELECT seq, id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, created_at, created_at, 0, last_error FROM back
RETURNING seq`)
}

// Lease statements, run in one transaction by SyncLeases.
//
// A lease row says who holds a shard (owner, token) and is written only when the shard
// changes hands: taken, adopted, released. Whether its owner is alive is the owner's row
// in the relays table, whose heartbeat (expires_at) each round renews: one row a relay,
// however many shards it holds. Under a long transaction elsewhere in the database every
// row written is a version vacuum cannot remove, and every fetch and every outcome reads
// the lease rows, so they must not change while held (renewing each lease made 64 rows
// a second, about 38,000 dead versions in 10 minutes). The lease rows' expires_at is
// written when a shard is taken or adopted, a TTL ahead; it is read only for a lease
// whose owner has no relay row (LeaseAcquire), and by tools.
//
// Under the canary broken.LocalClockLeases they judge time by the relay's clock, which
// SyncLeases sets first in the transaction (ClockSetting, RelayClock).
func (n *Names) lease(s string) string {
	if broken.Has(broken.LocalClockLeases) {
		return relayClock(n.r(s))
	}
	return n.r(s)
}

func (n *Names) LeaseHeartbeat() string {
	return n.lease(`INSERT INTO {{relays}} (id, hostname, pid, expires_at) VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond')
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), expires_at = excluded.expires_at, hostname = excluded.hostname, pid = excluded.pid`)
}

// LeaseFingerprint records the relay's ($1) fingerprint ($2) and destination states
// ($3), when they changed (a row version fewer per round while a long transaction keeps
// vacuum from removing them), and returns the live relays whose fingerprint differs from
// it, both being set: id, fingerprint, and whether each holds a lease
// (outboxdriver.Peer). It needs schema version 8. (The query reads the snapshot from
// before the update, in which the relay's row is excluded anyway.)
func (n *Names) LeaseFingerprint() string {
	return n.lease(`WITH mine AS (UPDATE {{relays}} SET fingerprint = $2, destinations = $3
    WHERE id = $1 AND (fingerprint, destinations) IS DISTINCT FROM ($2, $3))
SELECT r.id, r.fingerprint, EXISTS (SELECT 1 FROM {{leases}} l WHERE l.owner = r.id)
FROM {{relays}} r
WHERE r.expires_at > now() AND r.id <> $1 AND r.fingerprint <> '' AND r.fingerprint <> $2
ORDER BY r.id`)
}

func (n *Names) LeaseForgetRelay() string { return n.lease(`DELETE FROM {{relays}} WHERE id = $1`) }

// LeasePruneRelays deletes the relays gone for an hour that own no lease: while a relay
// owns one, its row is what a taker locks (LeaseLockExpired).
func (n *Names) LeasePruneRelays() string {
	return n.lease(`DELETE FROM {{relays}} r WHERE r.expires_at < now() - interval '1 hour'
  AND NOT EXISTS (SELECT 1 FROM {{leases}} l WHERE l.owner = r.id)`)
}

// LeaseLockExpired locks the rows of the relays whose heartbeat expired, and returns
// their ids: the owners whose shards LeaseAcquire may take. The lock orders a take
// against the owner's own round: a heartbeat that committed since the statement's
// snapshot is seen (the lock rechecks the row's latest version), one in progress makes
// the row skipped (its owner is alive), and one that comes later waits for the take to
// commit, so that the owner's round then sees its shards gone. Without it, a take judged
// on a snapshot from before the owner's late heartbeat left two relays each holding the
// shard until the owner's next round (the torture's lease check caught it). SKIP LOCKED:
// two relays taking at once, or a heartbeat, never wait on each other, so no deadlock.
func (n *Names) LeaseLockExpired() string {
	return n.lease(`SELECT id FROM {{relays}} WHERE expires_at <= now() FOR UPDATE SKIP LOCKED`)
}

// NotifyLeases is the payload of the notification a lease round that released shards
// sends on the outbox's channel (outboxdriver.WakeLeases). The NOTIFY trigger's is the
// lowest seq the transaction wrote (migration 6), or empty before migration 6.
const NotifyLeases = "leases"

// NotifyProbe returns the payload of a notification a listening session sends itself to
// learn that it is kept from one statement to the next (it comes back), before it takes
// the gate: unique, and not a seq (relays before version 7 take it as a plain wake-up).
func NotifyProbe() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return notifyProbePrefix + hex.EncodeToString(b[:])
}

// IsNotifyProbe reports whether payload is a NotifyProbe.
func IsNotifyProbe(payload string) bool { return strings.HasPrefix(payload, notifyProbePrefix) }

const notifyProbePrefix = "probe:"

// NotifiedFrom reads the seq in the NOTIFY trigger's payload: 0 when it has none (an
// outbox before migration 6, or a payload from something else).
func NotifiedFrom(payload string) int64 {
	seq, err := strconv.ParseInt(payload, 10, 64)
	if err != nil || seq < 0 {
		return 0
	}
	return seq
}

// GateVersion is the schema version from which writers notify only while a relay holds
// the gate (migration 7).
const GateVersion = 7

// GateArm is a listening session's ask for the gate ($1: its backend's pid, as it
// listened): 'armed' when the session took it, 'covered' when another session holds it,
// 'busy' when writers hold it shared (between their insert and their commit), 'moved'
// when the statement ran in another backend than the one that listened (PgBouncer in
// transaction pooling mode), which then takes nothing. Taking it shared tells a relay
// from writers: only relays take it alone.
func (n *Names) GateArm() string {
	k := strconv.FormatInt(n.WakeKey, 10)
	return `SELECT CASE
    WHEN pg_backend_pid() <> $1 THEN 'moved'
    WHEN pg_try_advisory_lock(` + k + `) THEN 'armed'
    WHEN NOT pg_try_advisory_lock_shared(` + k + `) THEN 'covered'
    WHEN pg_advisory_unlock_shared(` + k + `) THEN 'busy'
    ELSE 'busy' END`
}

// GateRelease lets go of the gate ($1: the backend's pid, as it listened); false when the
// statement ran in another backend, which holds nothing.
func (n *Names) GateRelease() string {
	return `SELECT CASE WHEN pg_backend_pid() <> $1 THEN false ELSE pg_advisory_unlock(` + strconv.FormatInt(n.WakeKey, 10) + `) END`
}

// AnyDue is a condition: the outbox has a message due (not delayed, not waiting for a
// retry).
func (n *Names) AnyDue() string {
	return n.r(`EXISTS (SELECT 1 FROM {{outbox}} o WHERE o.next_attempt_at <= now() OR o.next_attempt_at = o.created_at)`)
}

// Served returns the live relays other than $1 and whether at least $3
// messages have waited longer than $2 milliseconds while they could be sent: due, and
// not behind a message of their key that is not (a delayed message, or one waiting for
// its retry, holds its key's later ones back by design). A
// process of a fleet that leaves the outbox to another's relay asks it, to take over or
// help with a backlog.
func (n *Names) Served() string {
	return n.r(`SELECT (SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM {{relays}} WHERE expires_at > now() AND id <> $1),
    (SELECT count(*) FROM (SELECT 1 FROM {{outbox}} o WHERE o.next_attempt_at <= now() - $2 * interval '1 millisecond'
        AND (o.key = '' OR NOT EXISTS (SELECT 1 FROM {{outbox}} p WHERE p.key = o.key AND p.seq < o.seq
            AND p.next_attempt_at > p.created_at AND p.next_attempt_at > now())) LIMIT $3) w) >= $3`)
}

// SchemaVersion reads the highest schema version applied.
func (n *Names) SchemaVersion() string {
	return `SELECT coalesce(max(version), 0) FROM ` + n.Migrations
}

func (n *Names) LeaseRelease() string {
	return n.lease(`UPDATE {{leases}} SET owner = NULL, expires_at = '-infinity' WHERE owner = $1 AND token = ANY($2::bigint[])`)
}

func (n *Names) LeaseCounts() string {
	return n.lease(`SELECT (SELECT count(*) FROM {{leases}}), (SELECT count(*) FROM {{relays}} WHERE expires_at > now())`)
}

// LeaseAcquire gives the relay $1 up to $3 shards that are free, whose owner is among
// $4 (expired, locked by LeaseLockExpired), or whose owner has no row (it left) and
// which were taken more than a TTL ago, under new tokens, and returns the tokens ($2:
// the TTL in ms, for expires_at).
//
// The last condition needs the lease row's own expires_at. A row that another round
// takes and commits while this statement runs is re-checked (FOR UPDATE) in its new
// version but against this statement's snapshot of the relays table, which lacks the
// taker's row when that round was the taker's first (it inserts the row): "no row"
// alone would take the shard straight back, and two relays would hold it (a canary
// test starting relays together caught it). The new version's expires_at lies a TTL
// ahead, so the re-check fails as it should.
func (n *Names) LeaseAcquire() string {
	return n.lease(`UPDATE {{leases}} SET owner = $1, token = nextval('{{token_seq}}'), expires_at = now() + $2 * interval '1 millisecond'
WHERE shard IN (SELECT l.shard FROM {{leases}} l
    WHERE l.owner IS NULL OR l.owner = ANY($4::text[])
       OR (l.expires_at <= now() AND NOT EXISTS (SELECT 1 FROM {{relays}} r WHERE r.id = l.owner))
    ORDER BY l.shard LIMIT $3 FOR UPDATE SKIP LOCKED)
RETURNING token`)
}

// LeaseAdopt gives the relay $1 its leases whose token is not among $3 (an earlier
// process's of the same ID) under new tokens, and returns the tokens ($2: the TTL in
// ms, for expires_at).
func (n *Names) LeaseAdopt() string {
	return n.lease(`UPDATE {{leases}} SET token = nextval('{{token_seq}}'), expires_at = now() + $2 * interval '1 millisecond'
WHERE owner = $1 AND NOT token = ANY($3::bigint[])
RETURNING token`)
}

// LeaseHeld returns the relay's ($1) leases under the tokens $2: shard, token. (Its
// heartbeat, renewed in the same transaction, is what keeps them.)
func (n *Names) LeaseHeld() string {
	return n.lease(`SELECT shard, token FROM {{leases}} WHERE owner = $1 AND token = ANY($2::bigint[]) ORDER BY shard`)
}
