-- Back to version 6: every writer notifies, and the bucket column's default is an SQL
-- function again.
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

CREATE OR REPLACE FUNCTION {{.BucketFunc}}() RETURNS smallint LANGUAGE sql STABLE
AS $fn$ SELECT current FROM {{.Ring}} $fn$;
