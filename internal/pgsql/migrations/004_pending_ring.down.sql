-- Back to one pending table: the buckets' rows move into it with their seq, and the
-- sequence continues where the ring's left off.
LOCK TABLE {{.Outbox}} IN ACCESS EXCLUSIVE MODE;
DROP TRIGGER {{.Trigger}} ON {{.Outbox}};
DROP INDEX {{.QualifiedIndex "waiting"}}, {{.QualifiedIndex "key"}};
ALTER TABLE {{.Outbox}} RENAME TO {{.Bare "outbox_ringed"}};
ALTER INDEX {{.Table "outbox_pkey"}} RENAME TO {{.Bare "outbox_ringed_pkey"}};
ALTER SEQUENCE {{.Table "outbox_seq_seq"}} RENAME TO {{.Bare "outbox_ringed_seq"}};

CREATE TABLE {{.Outbox}} (
    seq             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
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
    last_error      text
)
WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000, autovacuum_vacuum_cost_delay = 0);
CREATE INDEX {{.Index "waiting"}} ON {{.Outbox}} (key, seq) WHERE next_attempt_at > created_at;
CREATE INDEX {{.Index "key"}} ON {{.Outbox}} (key, seq);

INSERT INTO {{.Outbox}} (seq, id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key,
                         created_at, next_attempt_at, attempts, last_error)
OVERRIDING SYSTEM VALUE
SELECT seq, id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key,
       created_at, next_attempt_at, attempts, last_error
FROM {{.Table "outbox_ringed"}} ORDER BY seq;
SELECT setval(pg_get_serial_sequence({{.TableLiteral "outbox"}}, 'seq'), last_value, is_called)
FROM {{.Table "outbox_ringed_seq"}};
DROP TABLE {{.Table "outbox_ringed"}};
DROP FUNCTION {{.BucketFunc}}();
DROP TABLE {{.Ring}};

CREATE TRIGGER {{.Trigger}} AFTER INSERT ON {{.Outbox}}
    FOR EACH STATEMENT EXECUTE FUNCTION {{.NotifyFunc}}();
