-- outbox schema, version 4: the pending table becomes a ring of buckets.
--
-- A pending row used to be deleted from one table that stays, and a long transaction
-- anywhere in the database (a report, a stuck session, a replica's feedback) kept vacuum
-- from removing the dead rows: every fetch walked over all the rows published since it
-- began. Now pending rows live in LIST partitions ("buckets") of the same
-- table. Writers append to the current bucket, named in {{.Bare "outbox_ring"}}; relays move
-- on to the next bucket once the current one has taken its share of rows, and empty a
-- retired bucket with TRUNCATE, which gives its storage back at once, whatever snapshot
-- is open. The few rows still pending in a retired bucket (retries, delayed messages)
-- move to the current one first, keeping their seq: order, leases and fencing name a row
-- by seq, never by where it is stored. docs/design.md, "Bloat-proof storage", has the
-- states and locks.
--
-- This migration copies the pending rows while it holds the outbox's lock: writers and
-- relays wait for it. `outbox migrate up` says how many rows it copies before it starts.
LOCK TABLE {{.Outbox}} IN ACCESS EXCLUSIVE MODE;
DROP TRIGGER {{.Trigger}} ON {{.Outbox}};
DROP INDEX {{.QualifiedIndex "waiting"}}, {{.QualifiedIndex "key"}};
ALTER TABLE {{.Outbox}} RENAME TO {{.Bare "outbox_unringed"}};
ALTER INDEX {{.Table "outbox_pkey"}} RENAME TO {{.Bare "outbox_unringed_pkey"}};
ALTER SEQUENCE {{.Table "outbox_seq_seq"}} RENAME TO {{.Bare "outbox_unringed_seq"}};

-- The ring: which bucket writers append to, the seq value when it became current
-- (rotation counts the rows it has taken from there), and how often it moved on.
CREATE TABLE {{.Ring}} (
    one         boolean     PRIMARY KEY DEFAULT true CHECK (one),
    current     smallint    NOT NULL DEFAULT 0 CHECK (current >= 0 AND current < {{len .Buckets}}),
    rotated_seq bigint      NOT NULL DEFAULT 0,
    rotated_at  timestamptz NOT NULL DEFAULT now(),
    rotations   bigint      NOT NULL DEFAULT 0
);
-- The sequence's value as rotation reads it: pg_sequence_last_value, NULL (0) until the
-- first nextval.
INSERT INTO {{.Ring}} (rotated_seq)
SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {{.Table "outbox_unringed_seq"}};

-- The bucket a row goes to when the INSERT does not say: any writer (an older library
-- during an upgrade, a hand-written INSERT) lands in the ring. The library's own INSERT
-- names the bucket once per statement instead.
CREATE FUNCTION {{.BucketFunc}}() RETURNS smallint LANGUAGE sql STABLE
AS $fn$ SELECT current FROM {{.Ring}} $fn$;

CREATE TABLE {{.Outbox}} (
    seq             bigint      GENERATED ALWAYS AS IDENTITY,
    id              uuid        NOT NULL,
    topic           text        NOT NULL,
    key             text        NOT NULL DEFAULT '',
    aggregate_type  text        NOT NULL DEFAULT '',
    event_type      text        NOT NULL DEFAULT '',
    content_type    text        NOT NULL DEFAULT 'application/octet-stream',
    payload         bytea       NOT NULL,
    headers         jsonb       NOT NULL DEFAULT '{}',
    dedup_key       text        NOT NULL,
    shard           smallint    NOT NULL GENERATED ALWAYS AS (
                        (('x' || substr(md5(CASE WHEN key = '' THEN id::text ELSE key END), 1, 8))::bit(32)::int & {{.ShardMask}})::smallint
                    ) STORED,
    created_at      timestamptz NOT NULL DEFAULT now(),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    bucket          smallint    NOT NULL DEFAULT {{.BucketFunc}}(),
    -- A key of a partitioned table must hold the partition key. seq is still unique: it
    -- comes from one sequence, and a move deletes its source in the same transaction.
    CONSTRAINT {{.Bare "outbox_pkey"}} PRIMARY KEY (seq, bucket)
) PARTITION BY LIST (bucket);
{{range .Buckets}}
CREATE TABLE {{$.Bucket .}} PARTITION OF {{$.Outbox}} FOR VALUES IN ({{.}})
    WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000, autovacuum_vacuum_cost_delay = 0);
{{- end}}

CREATE INDEX {{.Index "waiting"}} ON {{.Outbox}} (key, seq) WHERE next_attempt_at > created_at;
CREATE INDEX {{.Index "key"}} ON {{.Outbox}} (key, seq);

INSERT INTO {{.Outbox}} (seq, id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key,
                         created_at, next_attempt_at, attempts, last_error, bucket)
OVERRIDING SYSTEM VALUE
SELECT seq, id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key,
       created_at, next_attempt_at, attempts, last_error, 0
FROM {{.Table "outbox_unringed"}} ORDER BY seq;
SELECT setval(pg_get_serial_sequence({{.TableLiteral "outbox"}}, 'seq'), last_value, is_called)
FROM {{.Table "outbox_unringed_seq"}};
DROP TABLE {{.Table "outbox_unringed"}};

CREATE TRIGGER {{.Trigger}} AFTER INSERT ON {{.Outbox}}
    FOR EACH STATEMENT EXECUTE FUNCTION {{.NotifyFunc}}();
