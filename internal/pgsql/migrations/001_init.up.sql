-- outbox schema, version 1.
CREATE SCHEMA IF NOT EXISTS {{.Schema}};

-- One row per message. State is derived from the timestamps:
--   pending: published_at IS NULL AND dead_at IS NULL (due when next_attempt_at <= now())
--   published: published_at IS NOT NULL
--   dead: dead_at IS NOT NULL (see the {{.DeadView}} view)
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
    last_error      text,
    published_at    timestamptz,
    dead_at         timestamptz
);

-- Dedup keys are unique for as long as rows are kept (the retention window).
CREATE UNIQUE INDEX {{.Index "dedup"}} ON {{.Outbox}} (dedup_key);

-- The pending scan walks this index in seq order. It holds pending rows only, so its size
-- follows the backlog, not the history.
CREATE INDEX {{.Index "pending"}} ON {{.Outbox}} (seq) WHERE published_at IS NULL AND dead_at IS NULL;

-- Pending rows that wait (a retry backing off, a delayed message): they hold back later
-- rows of their key. Fresh rows have next_attempt_at = created_at and never enter it.
CREATE INDEX {{.Index "waiting"}} ON {{.Outbox}} (key, seq)
    WHERE published_at IS NULL AND dead_at IS NULL AND next_attempt_at > created_at;

-- Dead letters, newest first for `outbox dead list`.
CREATE INDEX {{.Index "dead"}} ON {{.Outbox}} (dead_at) WHERE dead_at IS NOT NULL;

-- Retention cleanup finds old rows by creation time; BRIN costs almost nothing to keep
-- for an append-mostly table.
CREATE INDEX {{.Index "created"}} ON {{.Outbox}} USING brin (created_at);

CREATE VIEW {{.DeadView}} AS
    SELECT id, seq, topic, key, aggregate_type, event_type, content_type, payload, headers,
           dedup_key, created_at, attempts, last_error, dead_at
    FROM {{.Outbox}} WHERE dead_at IS NOT NULL;

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
