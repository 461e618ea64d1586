-- Back to version 6: every writer notifies (the trigger loses its condition; its
-- function is version 6's), and the bucket column's default is an SQL function again.
DO $do$
DECLARE
    disabled boolean;
BEGIN
    SELECT tgenabled = 'D' INTO disabled FROM pg_catalog.pg_trigger
    WHERE tgrelid = to_regclass({{.TableLiteral "outbox"}}) AND tgname = {{.NameLiteral "outbox_notify"}};
    DROP TRIGGER IF EXISTS {{.Trigger}} ON {{.Outbox}};
    CREATE TRIGGER {{.Trigger}} AFTER INSERT ON {{.Outbox}}
        REFERENCING NEW TABLE AS written
        FOR EACH STATEMENT EXECUTE FUNCTION {{.NotifyFunc}}();
    IF disabled THEN
        ALTER TABLE {{.Outbox}} DISABLE TRIGGER {{.Trigger}};
    END IF;
END
$do$;

CREATE OR REPLACE FUNCTION {{.BucketFunc}}() RETURNS smallint LANGUAGE sql STABLE
AS $fn$ SELECT current FROM {{.Ring}} $fn$;
