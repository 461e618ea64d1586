-- outbox schema for SQLite, version 2: the consumer side.
--
-- The inbox: one row per message a consumer processed, inserted in the consumer's
-- transaction before its work; a second delivery of the message finds it.
CREATE TABLE {{.Inbox}} (
    consumer     TEXT    NOT NULL,
    message_id   TEXT    NOT NULL,
    processed_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, message_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX {{.Index "inbox_processed"}} ON {{.Inbox}} (processed_at);

-- Aggregate versions: the newest version of each aggregate a consumer applied.
CREATE TABLE {{.Versions}} (
    consumer       TEXT    NOT NULL,
    aggregate_type TEXT    NOT NULL,
    aggregate_id   TEXT    NOT NULL,
    version        INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    PRIMARY KEY (consumer, aggregate_type, aggregate_id)
) STRICT, WITHOUT ROWID;
