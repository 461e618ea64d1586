-- outbox schema for SQLite, version 1.
--
-- As in PostgreSQL, a message lives in exactly one of three tables: {{.Outbox}} while it
-- is pending, {{.Published}} once the broker confirmed it (kept for the retention time),
-- {{.Dead}} once it was dead-lettered. The pending table stays as small as the backlog.
--
-- Times are integers: microseconds since the Unix epoch (UTC), read from this machine's
-- clock by the statement that writes them (SQLite's 'now' has millisecond resolution).
-- Read them with datetime(created_at / 1000000.0, 'unixepoch', 'subsec').
-- Tables are STRICT, so a value of the wrong type is an error rather than a surprise.

-- seq is AUTOINCREMENT, not a plain rowid: a plain rowid reuses the highest value once
-- its row is deleted (published), and a seq must never come back.
CREATE TABLE {{.Outbox}} (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    id              BLOB    NOT NULL,
    topic           TEXT    NOT NULL,
    "key"           TEXT    NOT NULL DEFAULT '',
    aggregate_type  TEXT    NOT NULL DEFAULT '',
    event_type      TEXT    NOT NULL DEFAULT '',
    content_type    TEXT    NOT NULL DEFAULT 'application/octet-stream',
    payload         BLOB    NOT NULL,
    headers         TEXT    NOT NULL DEFAULT '{}',
    dedup_key       TEXT    NOT NULL,
    -- Lease shard of the key, computed by the writer exactly as PostgreSQL's generated
    -- column does (first 32 bits of md5(key, or the id's text), masked to 64 shards).
    shard           INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    next_attempt_at INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT
) STRICT;

-- Pending rows that wait (a retry backing off, a delayed message): they hold back later
-- rows of their key. Fresh rows have next_attempt_at = created_at and never enter it.
CREATE INDEX {{.Index "waiting"}} ON {{.Outbox}} ("key", seq) WHERE next_attempt_at > created_at;

-- A key's oldest pending row, for continuation fetches.
CREATE INDEX {{.Index "key"}} ON {{.Outbox}} ("key", seq);

CREATE TABLE {{.Published}} (
    seq             INTEGER PRIMARY KEY,
    id              BLOB    NOT NULL,
    topic           TEXT    NOT NULL,
    "key"           TEXT    NOT NULL,
    aggregate_type  TEXT    NOT NULL,
    event_type      TEXT    NOT NULL,
    content_type    TEXT    NOT NULL,
    payload         BLOB    NOT NULL,
    headers         TEXT    NOT NULL,
    dedup_key       TEXT    NOT NULL,
    shard           INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    attempts        INTEGER NOT NULL,
    published_at    INTEGER NOT NULL
) STRICT;
-- Retention deletes by publication time.
CREATE INDEX {{.Index "published_at"}} ON {{.Published}} (published_at);

CREATE TABLE {{.Dead}} (
    seq             INTEGER PRIMARY KEY,
    id              BLOB    NOT NULL,
    topic           TEXT    NOT NULL,
    "key"           TEXT    NOT NULL,
    aggregate_type  TEXT    NOT NULL,
    event_type      TEXT    NOT NULL,
    content_type    TEXT    NOT NULL,
    payload         BLOB    NOT NULL,
    headers         TEXT    NOT NULL,
    dedup_key       TEXT    NOT NULL,
    shard           INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    attempts        INTEGER NOT NULL,
    last_error      TEXT    NOT NULL,
    dead_at         INTEGER NOT NULL
) STRICT;
CREATE INDEX {{.Index "dead_id"}} ON {{.Dead}} (id);
CREATE INDEX {{.Index "dead_at"}} ON {{.Dead}} (dead_at);
CREATE INDEX {{.Index "dead_dedup"}} ON {{.Dead}} (dedup_key);

-- Dedup keys are unique while their message is pending or dead, and for the retention
-- time after it was written. claim is the number a Write drew to recognise the keys it
-- claimed (see internal/sqlstore).
CREATE TABLE {{.Dedup}} (
    dedup_key  TEXT    PRIMARY KEY,
    claim      INTEGER NOT NULL,
    created_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
CREATE INDEX {{.Index "dedup_created"}} ON {{.Dedup}} (created_at);

-- Shard leases. owner/token/expires_at change together; token grows by one with every
-- new owner of the shard, which fences outcomes of an earlier ownership.
CREATE TABLE {{.Leases}} (
    shard      INTEGER PRIMARY KEY,
    owner      TEXT,
    token      INTEGER NOT NULL DEFAULT 0,
    expires_at INTEGER NOT NULL DEFAULT 0
) STRICT;
INSERT INTO {{.Leases}} (shard) VALUES {{.ShardValues}};

-- Live relays, for the fair share of shards.
CREATE TABLE {{.Relays}} (
    id           TEXT    PRIMARY KEY,
    hostname     TEXT    NOT NULL DEFAULT '',
    pid          INTEGER NOT NULL DEFAULT 0,
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL
) STRICT;
