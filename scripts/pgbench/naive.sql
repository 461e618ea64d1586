-- One event per transaction into the naive table (naive-setup.sql).
BEGIN;
INSERT INTO pgbench_naive.outbox_events (id, aggregate_type, aggregate_id, event_type, payload, dedup_key)
VALUES (gen_random_uuid(), 'order', 'order-' || :client_id || '-' || random(), 'order.created',
        '{"order":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}', gen_random_uuid()::text);
COMMIT;
