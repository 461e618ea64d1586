-- outbox schema, version 6: the NOTIFY trigger says where a transaction's messages start.
--
-- Its payload was empty, so a relay it woke could only fetch from the oldest pending row,
-- and that fetch walks every row published since the oldest open snapshot began (up to a
-- bucket of the pending ring). The payload is now the lowest seq the transaction wrote:
-- a relay whose cursor lies below it reads the new messages by a continuation above the
-- cursor (docs/design.md, "LISTEN/NOTIFY"). A transaction notifies once in the usual
-- case: a later statement of it notifies again only when it wrote a lower seq than the
-- earlier ones (a replay, a ring's move), which a transaction-local setting remembers,
-- named by the table's OID so that two outboxes written in one transaction do not mix.
--
-- The trigger now reads the statement's rows (a transition table), so it is dropped and
-- created again, in the state it was in: WAL mode's setup disables it. Dropping it locks
-- the pending table and its buckets for a moment.
--
-- Deferrable: relays of version 5 take any payload but "leases" as a plain wake-up, and
-- relays of this version take an empty one as before.
DO $do$
DECLARE
    disabled boolean;
BEGIN
    SELECT tgenabled = 'D' INTO disabled FROM pg_catalog.pg_trigger
    WHERE tgrelid = to_regclass({{.TableLiteral "outbox"}}) AND tgname = {{.NameLiteral "outbox_notify"}};
    DROP TRIGGER IF EXISTS {{.Trigger}} ON {{.Outbox}};
    CREATE OR REPLACE FUNCTION {{.NotifyFunc}}() RETURNS trigger LANGUAGE plpgsql AS $fn$
    DECLARE
        lowest  bigint;
        setting text := 'outbox.notified_' || TG_RELID;
        sent    text;
    BEGIN
        SELECT min(seq) INTO lowest FROM written;
        IF lowest IS NULL THEN
            RETURN NULL; -- the statement wrote nothing
        END IF;
        sent := current_setting(setting, true);
        IF sent IS NULL OR sent = '' OR lowest < sent::bigint THEN
            PERFORM pg_notify({{.ChannelLiteral}}, lowest::text);
            PERFORM set_config(setting, lowest::text, true);
        END IF;
        RETURN NULL;
    END
    $fn$;
    CREATE TRIGGER {{.Trigger}} AFTER INSERT ON {{.Outbox}}
        REFERENCING NEW TABLE AS written
        FOR EACH STATEMENT EXECUTE FUNCTION {{.NotifyFunc}}();
    IF disabled THEN
        ALTER TABLE {{.Outbox}} DISABLE TRIGGER {{.Trigger}};
    END IF;
END
$do$;
