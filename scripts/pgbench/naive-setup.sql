-- The users' naive outbox table (one table: a uuid primary key, a unique dedup key, a
-- pending index and an aggregate index), the reference for the Writer's commit rate.
DROP SCHEMA IF EXISTS pgbench_naive CASCADE;
CREATE SCHEMA pgbench_naive;
CREATE TABLE pgbench_naive.outbox_events (
    id             uuid        PRIMARY KEY,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        jsonb       NOT NULL,
    headers        jsonb       NOT NULL DEFAULT '{}',
    dedup_key      text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    published_at   timestamptz NULL,
    attempt        smallint    NOT NULL DEFAULT 0
);
CREATE INDEX ON pgbench_naive.outbox_events (published_at NULLS FIRST, created_at);
CREATE INDEX ON pgbench_naive.outbox_events (aggregate_type, aggregate_id);
CREATE UNIQUE INDEX ON pgbench_naive.outbox_events (dedup_key);
