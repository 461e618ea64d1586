-- outbox schema for MySQL 8+ and MariaDB 10.6+, version 1.
--
-- As in PostgreSQL, a message lives in exactly one of three tables: {{.Outbox}} while it
-- is pending, {{.Published}} once the broker confirmed it (kept for the retention time),
-- {{.Dead}} once it was dead-lettered. Publishing is a DELETE from a table as small as the
-- backlog plus an append to one that only the retention cleaner reads.
--
-- MySQL commits DDL statement by statement, so a migration cannot be rolled back as a
-- whole. Every statement here is idempotent (IF NOT EXISTS, INSERT IGNORE): a migration
-- interrupted halfway is finished by running it again.
--
-- Times are DATETIME(6) in UTC, written by the server (UTC_TIMESTAMP(6)): the session's
-- time_zone plays no part. Keys and dedup keys are VARBINARY: compared byte for byte, so
-- "a", "A" and "a " are three keys, as in PostgreSQL (MySQL's text collations ignore case,
-- or trailing spaces, or both). Headers are JSON text.

CREATE TABLE IF NOT EXISTS {{.Outbox}} (
    seq             BIGINT         NOT NULL AUTO_INCREMENT,
    id              BINARY(16)     NOT NULL,
    topic           VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    `key`           VARBINARY(255) NOT NULL DEFAULT '',
    aggregate_type  VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    event_type      VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    content_type    VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT 'application/octet-stream',
    payload         LONGBLOB       NOT NULL,
    headers         MEDIUMTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    dedup_key       VARBINARY(255) NOT NULL,
    -- Lease shard of the key, computed by the writer exactly as PostgreSQL's generated
    -- column does (first 32 bits of md5(key, or the id's text), masked to 64 shards).
    shard           SMALLINT       NOT NULL,
    created_at      DATETIME(6)    NOT NULL,
    next_attempt_at DATETIME(6)    NOT NULL,
    attempts        INT            NOT NULL DEFAULT 0,
    last_error      TEXT           CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    -- The key of a row that waits (a retry backing off, a delayed message), NULL for the
    -- others: rows that wait hold back the later rows of their key, and indexing this
    -- column finds them without reading the key's other rows. It stands in for
    -- PostgreSQL's partial index; fresh rows have next_attempt_at = created_at and stay
    -- NULL. (An index on (key, next_attempt_at) does not do: MySQL looks it up by key
    -- only, from a correlated subquery, and reads the whole key's backlog per row.)
    waiting_key     VARBINARY(255) AS (CASE WHEN next_attempt_at > created_at THEN `key` END) STORED,
    PRIMARY KEY (seq),
    -- A key's oldest pending row, for continuation fetches.
    KEY {{.Index "key"}} (`key`, seq),
    KEY {{.Index "waiting"}} (waiting_key, seq)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

CREATE TABLE IF NOT EXISTS {{.Published}} (
    seq             BIGINT         NOT NULL,
    id              BINARY(16)     NOT NULL,
    topic           VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    `key`           VARBINARY(255) NOT NULL,
    aggregate_type  VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    event_type      VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    content_type    VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    payload         LONGBLOB       NOT NULL,
    headers         MEDIUMTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    dedup_key       VARBINARY(255) NOT NULL,
    shard           SMALLINT       NOT NULL,
    created_at      DATETIME(6)    NOT NULL,
    attempts        INT            NOT NULL,
    published_at    DATETIME(6)    NOT NULL,
    PRIMARY KEY (seq),
    -- Retention deletes by publication time.
    KEY {{.Index "published_at"}} (published_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

CREATE TABLE IF NOT EXISTS {{.Dead}} (
    seq             BIGINT         NOT NULL,
    id              BINARY(16)     NOT NULL,
    topic           VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    `key`           VARBINARY(255) NOT NULL,
    aggregate_type  VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    event_type      VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    content_type    VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    payload         LONGBLOB       NOT NULL,
    headers         MEDIUMTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    dedup_key       VARBINARY(255) NOT NULL,
    shard           SMALLINT       NOT NULL,
    created_at      DATETIME(6)    NOT NULL,
    attempts        INT            NOT NULL,
    last_error      TEXT           CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    dead_at         DATETIME(6)    NOT NULL,
    PRIMARY KEY (seq),
    KEY {{.Index "dead_id"}} (id),
    KEY {{.Index "dead_at"}} (dead_at),
    KEY {{.Index "dead_dedup"}} (dedup_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- Dedup keys are unique while their message is pending or dead, and for the retention
-- time after it was written. claim is the number a Write drew to recognise the keys it
-- claimed (see internal/sqlstore).
CREATE TABLE IF NOT EXISTS {{.Dedup}} (
    dedup_key  VARBINARY(255) NOT NULL,
    claim      BIGINT         NOT NULL,
    created_at DATETIME(6)    NOT NULL,
    PRIMARY KEY (dedup_key),
    KEY {{.Index "dedup_created"}} (created_at)
) ENGINE = InnoDB;

-- Shard leases. owner/token/expires_at change together; token grows by one with every
-- new owner of the shard, which fences outcomes of an earlier ownership.
CREATE TABLE IF NOT EXISTS {{.Leases}} (
    shard      SMALLINT     NOT NULL,
    owner      VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    token      BIGINT       NOT NULL DEFAULT 0,
    expires_at DATETIME(6)  NOT NULL DEFAULT '1970-01-01 00:00:00',
    PRIMARY KEY (shard)
) ENGINE = InnoDB;
INSERT IGNORE INTO {{.Leases}} (shard) VALUES {{.ShardValues}};

-- Live relays, for the fair share of shards.
CREATE TABLE IF NOT EXISTS {{.Relays}} (
    id           VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    hostname     VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    pid          INT          NOT NULL DEFAULT 0,
    started_at   DATETIME(6)  NOT NULL,
    heartbeat_at DATETIME(6)  NOT NULL,
    expires_at   DATETIME(6)  NOT NULL,
    PRIMARY KEY (id)
) ENGINE = InnoDB;
