-- outbox schema, version 1.
--
-- A message lives in exactly one of three tables: {{.Outbox}} while it is pending,
-- {{.Published}} once the broker confirmed it (kept for the retention time), or
-- {{.Dead}} once it was dead-lettered. Moving a row is a DELETE plus an INSERT into an
-- append-only table, which costs PostgreSQL about a third of an UPDATE that must add
-- entries to every index; and the pending table stays as small as the backlog, however
-- much history is kept.
CREATE SCHEMA IF NOT EXISTS {{.Schema}};

CREATE TABLE {{.Outbox}} (
    seq             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id              uuid        NOT NULL,
    topic           text        NOT NULL,
    key             text        NOT NULL DEFAULT '',
    aggregate_type  text        NOT NULL DEFAULT '',
    event_type      text        NOT NULL DEFAULT '',
    content_type    text        NOT NULL DEFAULT 'application/octet-stream',
    payload         bytea       NOT NULL,
    headers         jsonb       NOT NULL DEFAULT '{}',
    dedup_key       text        NOT NULL,
    -- Lease shard of the key: relays lease shards, so one key is worked by one relay at a
    -- time. md5 keeps the value stable across PostgreSQL versions and computable anywhere.
    shard           smallint    NOT NULL GENERATED ALWAYS AS (
                        (('x' || substr(md5(CASE WHEN key = '' THEN id::text ELSE key END), 1, 8))::bit(32)::int & {{.ShardMask}})::smallint
                    ) STORED,
    created_at      timestamptz NOT NULL DEFAULT now(),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text
)
-- Every row is inserted and soon deleted: vacuum by the number of dead rows, not by a
-- fraction of a table whose live size is only the backlog.
WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000, autovacuum_vacuum_cost_delay = 0);

-- Pending rows that wait (a retry backing off, a delayed message): they hold back later
-- rows of their key. Fresh rows have next_attempt_at = created_at and never enter it.
CREATE INDEX {{.Index "waiting"}} ON {{.Outbox}} (key, seq) WHERE next_attempt_at > created_at;

-- A key's oldest pending row: a relay continuing a scan above the highest seq it has seen
-- must not take a row whose key still has an older pending row it does not hold.
CREATE INDEX {{.Index "key"}} ON {{.Outbox}} (key, seq);

CREATE TABLE {{.Published}} (
    seq             bigint      NOT NULL,
    id              uuid        NOT NULL,
    topic           text        NOT NULL,
    key             text        NOT NULL,
    aggregate_type  text        NOT NULL,
    event_type      text        NOT NULL,
    content_type    text        NOT NULL,
    payload         bytea       NOT NULL,
    headers         jsonb       NOT NULL,
    dedup_key       text        NOT NULL,
    shard           smallint    NOT NULL,
    created_at      timestamptz NOT NULL,
    attempts        integer     NOT NULL,
    published_at    timestamptz NOT NULL DEFAULT now()
);
-- Retention deletes by publication time; BRIN costs almost nothing on an append-only table.
CREATE INDEX {{.Index "published_at"}} ON {{.Published}} USING brin (published_at);

CREATE TABLE {{.Dead}} (
    seq             bigint      PRIMARY KEY,
    id              uuid        NOT NULL,
    topic           text        NOT NULL,
    key             text        NOT NULL,
    aggregate_type  text        NOT NULL,
    event_type      text        NOT NULL,
    content_type    text        NOT NULL,
    payload         bytea       NOT NULL,
    headers         jsonb       NOT NULL,
    dedup_key       text        NOT NULL,
    shard           smallint    NOT NULL,
    created_at      timestamptz NOT NULL,
    attempts        integer     NOT NULL,
    last_error      text        NOT NULL,
    dead_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX {{.Index "dead_id"}} ON {{.Dead}} (id);
CREATE INDEX {{.Index "dead_at"}} ON {{.Dead}} (dead_at);
CREATE INDEX {{.Index "dead_dedup"}} ON {{.Dead}} (dedup_key);

-- Dedup keys are unique while their message is pending or dead, and for the retention
-- time after it was written.
CREATE TABLE {{.Dedup}} (
    dedup_key  text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX {{.Index "dedup_created"}} ON {{.Dedup}} USING brin (created_at);

-- Shard leases. owner/token/expires_at change together; token comes from the sequence,
-- so it is never reused and fences outcomes of an earlier ownership.
CREATE TABLE {{.Leases}} (
    shard      smallint PRIMARY KEY,
    owner      text,
    token      bigint      NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL DEFAULT '-infinity'
);
CREATE SEQUENCE {{.TokenSeq}};
INSERT INTO {{.Leases}} (shard) SELECT generate_series(0, {{.ShardMask}});

-- Live relays, for the fair share of shards.
CREATE TABLE {{.Relays}} (
    id           text PRIMARY KEY,
    hostname     text        NOT NULL DEFAULT '',
    pid          integer     NOT NULL DEFAULT 0,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);

-- Wake relays on insert: one notification per statement, merged per transaction.
CREATE FUNCTION {{.NotifyFunc}}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify({{.ChannelLiteral}}, '');
    RETURN NULL;
END
$fn$;
CREATE TRIGGER {{.Trigger}} AFTER INSERT ON {{.Outbox}}
    FOR EACH STATEMENT EXECUTE FUNCTION {{.NotifyFunc}}();
