-- Back to one published table: the partitions' rows, and those of the history kept from
-- before version 3, move into it (a scan of all the history kept).
-- EXCLUSIVE lets readers read and keeps relays from recording outcomes until the copy is
-- done, so none lands in a table about to be dropped.
LOCK TABLE {{.Published}} IN EXCLUSIVE MODE;
CREATE TABLE {{.Table "outbox_published_flat"}} (LIKE {{.Published}} INCLUDING DEFAULTS);
INSERT INTO {{.Table "outbox_published_flat"}} SELECT * FROM {{.Published}};
DROP TABLE {{.Published}};
DROP FUNCTION {{.PartitionFunc}}(date);
DO $do$
BEGIN
    IF to_regclass({{.TableLiteral "outbox_published_legacy"}}) IS NOT NULL THEN
        INSERT INTO {{.Table "outbox_published_flat"}} SELECT * FROM {{.PublishedLegacy}};
        DROP TABLE {{.PublishedLegacy}};
    END IF;
END
$do$;
ALTER TABLE {{.Table "outbox_published_flat"}} RENAME TO {{.Bare "outbox_published"}};
CREATE INDEX {{.Index "published_at"}} ON {{.Published}} USING brin (published_at);
