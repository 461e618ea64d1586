-- One event per transaction with a generated id, through the statement the Writer runs
-- for one such message (internal/pgsql InsertFresh), into an outbox migrated with
-- outbox migrate up --schema pgbench_outbox.
BEGIN;
INSERT INTO pgbench_outbox.outbox (id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, next_attempt_at)
SELECT u, 'orders', 'order-' || :client_id || '-' || random(), 'order', 'order.created', 'application/json',
       '{"order":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'::bytea, '{}'::jsonb, u::text,
       CASE WHEN NULL::timestamptz IS NULL THEN now() ELSE greatest(now(), NULL::timestamptz) END
FROM gen_random_uuid() u
RETURNING dedup_key;
COMMIT;
