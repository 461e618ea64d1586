-- Back to version 5: the NOTIFY trigger's payload is empty again, and the trigger keeps
-- its state (WAL mode's setup disables it).
DO $do$
DECLARE
    disabled boolean;
BEGIN
    SELECT tgenabled = 'D' INTO disabled FROM pg_catalog.pg_trigger
    WHERE tgrelid = to_regclass({{.TableLiteral "outbox"}}) AND tgname = {{.NameLiteral "outbox_notify"}};
    DROP TRIGGER IF EXISTS {{.Trigger}} ON {{.Outbox}};
    CREATE OR REPLACE FUNCTION {{.NotifyFunc}}() RETURNS trigger LANGUAGE plpgsql AS $fn$
    BEGIN
        PERFORM pg_notify({{.ChannelLiteral}}, '');
        RETURN NULL;
    END
    $fn$;
    CREATE TRIGGER {{.Trigger}} AFTER INSERT ON {{.Outbox}}
        FOR EACH STATEMENT EXECUTE FUNCTION {{.NotifyFunc}}();
    IF disabled THEN
        ALTER TABLE {{.Outbox}} DISABLE TRIGGER {{.Trigger}};
    END IF;
END
$do$;
