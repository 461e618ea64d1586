-- outbox schema, version 2: the consumer side.
--
-- The inbox: one row per message a consumer processed, inserted in the consumer's
-- transaction before its work, so that a second delivery of the same message finds the
-- row (or waits for the transaction that holds it) instead of doing the work again.
CREATE TABLE {{.Inbox}} (
    consumer     text        NOT NULL,
    message_id   text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
-- Retention deletes by age; BRIN costs almost nothing on an append-only table.
CREATE INDEX {{.Index "inbox_processed"}} ON {{.Inbox}} USING brin (processed_at);

-- Aggregate versions: the newest version of each aggregate a consumer applied, for
-- consumers that apply an event only if it is newer than what they have.
CREATE TABLE {{.Versions}} (
    consumer       text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    version        bigint      NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, aggregate_type, aggregate_id)
);
