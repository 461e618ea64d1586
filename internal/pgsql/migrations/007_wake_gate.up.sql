-- outbox schema, version 7: writers notify only while a relay waits, and the bucket
-- column's default costs less.
--
-- A transaction that queued a notification takes a lock on the whole server's
-- notification queue at commit and keeps it until its commit record is flushed: every
-- notifying commit of the server waits for the one before it, and none can share a WAL
-- flush. Writers that notified on every commit therefore committed at about a quarter
-- of the rate of a table without the trigger. Now the trigger notifies only while a
-- relay holds the outbox's gate, an advisory lock its listening session takes when it
-- has nothing left to fetch and lets go of at the first notification.
--
-- The trigger's condition tests the gate by taking it shared until its transaction
-- ends. While a writer holds it so, no relay can take it: a relay that takes it knows
-- that every writer that did not notify has ended, so the fetch it makes next sees
-- their rows, and that every later writer notifies. docs/design.md, "The wake gate", has
-- the states.
--
-- A relay of version 6 or older never takes the gate: with this schema it finds new
-- messages by polling only, so upgrade the relays with the schema.
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
    -- The gate is tested in the trigger's condition: while it is open the function is
    -- not called at all.
    CREATE TRIGGER {{.Trigger}} AFTER INSERT ON {{.Outbox}}
        REFERENCING NEW TABLE AS written
        FOR EACH STATEMENT
        WHEN (NOT pg_try_advisory_xact_lock_shared({{.WakeKey}}))
        EXECUTE FUNCTION {{.NotifyFunc}}();
    IF disabled THEN
        ALTER TABLE {{.Outbox}} DISABLE TRIGGER {{.Trigger}};
    END IF;
END
$do$;

-- The bucket column's default is evaluated for every row. PL/pgSQL keeps the plan of
-- its query for the session; an SQL function's query was planned again for every
-- statement, about a sixth of a one-row INSERT's time.
CREATE OR REPLACE FUNCTION {{.BucketFunc}}() RETURNS smallint LANGUAGE plpgsql STABLE AS $fn$
BEGIN
    RETURN (SELECT current FROM {{.Ring}});
END
$fn$;
