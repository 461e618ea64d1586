-- outbox schema, version 3: published history in daily partitions.
--
-- Retention drops a whole day instead of deleting rows one by one, so keeping history
-- costs no vacuum and no dead rows. A partition covers one UTC day of published_at. There
-- is no DEFAULT partition: a missing day makes recording an outcome fail, which leaves
-- the message pending (nothing is lost) and is reported; outbox_published_partition(day)
-- creates days ahead, and relays call it.
--
-- The history kept so far stays in outbox_published_legacy, a plain table that is dropped
-- whole once it is older than the retention time (or right away when it is empty):
-- attaching it as a partition would scan it while holding a lock that stops relays
-- from recording outcomes.
ALTER TABLE {{.Published}} RENAME TO {{.Bare "outbox_published_legacy"}};
ALTER INDEX {{.QualifiedIndex "published_at"}} RENAME TO {{.Index "legacy_at"}};

CREATE TABLE {{.Published}} (LIKE {{.PublishedLegacy}} INCLUDING DEFAULTS)
    PARTITION BY RANGE (published_at);
CREATE INDEX {{.Index "published_at"}} ON {{.Published}} USING brin (published_at);

-- outbox_published_partition(day) makes sure the partition of the UTC day exists and is
-- attached, and returns its name. It creates a plain table and attaches it: ATTACH
-- PARTITION takes SHARE UPDATE EXCLUSIVE on the parent, which does not wait for, or
-- block, relays recording outcomes (CREATE TABLE ... PARTITION OF would take ACCESS
-- EXCLUSIVE). Callers set a short lock_timeout and try again later when it fails.
--
-- The bounds are UTC midnights written out as text, so neither the session's TimeZone (a
-- day is 23 or 25 hours long across a daylight-saving change in local time) nor its
-- DateStyle can shift them.
CREATE FUNCTION {{.PartitionFunc}}(day date) RETURNS text LANGUAGE plpgsql
SET TimeZone = 'UTC' AS $fn$
DECLARE
    part text := {{.NameLiteral "outbox_published"}} || '_' || to_char(day, 'YYYYMMDD');
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_inherits i
               JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
               JOIN pg_catalog.pg_namespace s ON s.oid = c.relnamespace
               WHERE i.inhparent = {{.TableLiteral "outbox_published"}}::regclass AND c.relname = part AND s.nspname = {{.SchemaLiteral}}) THEN
        RETURN part;
    END IF;
    EXECUTE format('CREATE TABLE IF NOT EXISTS %I.%I (LIKE %s INCLUDING DEFAULTS)', {{.SchemaLiteral}}, part, {{.TableLiteral "outbox_published"}});
    EXECUTE format('ALTER TABLE %s ATTACH PARTITION %I.%I FOR VALUES FROM (%L) TO (%L)',
                   {{.TableLiteral "outbox_published"}}, {{.SchemaLiteral}}, part,
                   to_char(day, 'YYYY-MM-DD') || ' 00:00:00+00', to_char(day + 1, 'YYYY-MM-DD') || ' 00:00:00+00');
    RETURN part;
END
$fn$;

SELECT {{.PartitionFunc}}(d::date)
FROM generate_series((now() AT TIME ZONE 'UTC')::date, (now() AT TIME ZONE 'UTC')::date + 7, interval '1 day') d;

DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {{.PublishedLegacy}}) THEN
        DROP TABLE {{.PublishedLegacy}};
    END IF;
END
$do$;
