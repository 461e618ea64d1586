-- Back to version 4. A replication slot retains WAL until it is dropped, and once this
-- table is gone nothing names it: refuse while a slot recorded here still exists. A NOTIFY
-- trigger that setup disabled is turned back on, since relays poll from now on.
DO $do$
DECLARE
    slot text;
BEGIN
    IF to_regclass({{.TableLiteral "outbox_wal"}}) IS NULL THEN
        RETURN;
    END IF;
    SELECT w.slot_name INTO slot
    FROM {{.Table "outbox_wal"}} w JOIN pg_catalog.pg_replication_slots s ON s.slot_name = w.slot_name
    ORDER BY w.slot_name LIMIT 1;
    IF slot IS NOT NULL THEN
        RAISE EXCEPTION 'replication slot "%" of WAL mode still exists and would retain WAL with nothing naming it: drop it first with outbox wal drop --slot % (same --schema and --prefix)', slot, slot;
    END IF;
    IF EXISTS (SELECT 1 FROM {{.Table "outbox_wal"}} WHERE notify_disabled) THEN
        ALTER TABLE {{.Outbox}} ENABLE TRIGGER {{.Trigger}};
    END IF;
END
$do$;
DROP TABLE IF EXISTS {{.Table "outbox_wal"}};
ALTER TABLE {{.Relays}} DROP COLUMN IF EXISTS mode;
