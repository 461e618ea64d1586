-- outbox schema for MySQL 8+ and MariaDB 10.6+, version 2: the consumer side.
--
-- The inbox: one row per message a consumer processed, inserted in the consumer's
-- transaction before its work; a second delivery of the message finds it, or waits for
-- the transaction that inserted it. Ids are compared byte for byte.
CREATE TABLE IF NOT EXISTS {{.Inbox}} (
    consumer     VARBINARY(255) NOT NULL,
    message_id   VARBINARY(512) NOT NULL,
    processed_at DATETIME(6)    NOT NULL,
    PRIMARY KEY (consumer, message_id),
    KEY {{.Index "inbox_processed"}} (processed_at)
) ENGINE = InnoDB;

-- Aggregate versions: the newest version of each aggregate a consumer applied.
CREATE TABLE IF NOT EXISTS {{.Versions}} (
    consumer       VARBINARY(255) NOT NULL,
    aggregate_type VARBINARY(255) NOT NULL,
    aggregate_id   VARBINARY(255) NOT NULL,
    version        BIGINT         NOT NULL,
    updated_at     DATETIME(6)    NOT NULL,
    PRIMARY KEY (consumer, aggregate_type, aggregate_id)
) ENGINE = InnoDB;
