-- One event per transaction with a dedup key the caller chose, through the statement the
-- Writer runs for one such message (internal/pgsql InsertOne), into an outbox migrated
-- with outbox migrate up --schema pgbench_outbox.
BEGIN;
WITH claimed AS (
    INSERT INTO pgbench_outbox.outbox_dedup (dedup_key) VALUES (gen_random_uuid()::text)
    ON CONFLICT (dedup_key) DO NOTHING
    RETURNING dedup_key
)
INSERT INTO pgbench_outbox.outbox (id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, next_attempt_at)
SELECT gen_random_uuid(), 'orders', 'order-' || :client_id || '-' || random(), 'order', 'order.created', 'application/json',
       '{"order":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'::bytea, '{}'::jsonb, dedup_key,
       CASE WHEN NULL::timestamptz IS NULL THEN now() ELSE greatest(now(), NULL::timestamptz) END
FROM claimed
RETURNING dedup_key;
COMMIT;
