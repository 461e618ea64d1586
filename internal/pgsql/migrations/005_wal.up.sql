-- outbox schema, version 5: the bookkeeping of WAL mode (docs/design-wal.md, §4).
--
-- WAL mode reads inserts into the outbox from a logical replication slot. `outbox wal
-- setup` creates the publication and the slot and records them here, one row per slot:
-- which publication the slot streams, where and when it was created (created_lsn, and
-- created_seq, the outbox sequence's value then: rows at or below it may predate the
-- slot and reach relays by their catch-up fetch, not the stream), the cluster it belongs
-- to (system_id: after a failover to a server without the slot, it differs), and whether
-- setup disabled the NOTIFY trigger (`outbox wal drop` turns it back on).
--
-- One relay at a time reads a slot (PostgreSQL allows one walsender per slot):
-- owner/token/expires_at are its lease, renewed and fenced like the shard leases (token
-- from the same sequence), and state says how the relays get their work, loudly:
-- streaming, or polling in fallback with the reason.
--
-- Deferrable: relays of the previous version never read this table, and relays of this
-- one poll without it.
CREATE TABLE IF NOT EXISTS {{.Table "outbox_wal"}} (
    slot_name       text        PRIMARY KEY,
    publication     text        NOT NULL,
    owner           text,
    token           bigint      NOT NULL DEFAULT 0,
    expires_at      timestamptz NOT NULL DEFAULT '-infinity',
    state           text        NOT NULL DEFAULT 'starting'
                                CHECK (state IN ('starting', 'streaming', 'fallback')),
    state_reason    text        NOT NULL DEFAULT '',
    state_at        timestamptz NOT NULL DEFAULT now(),
    created_lsn     pg_lsn      NOT NULL,
    created_seq     bigint      NOT NULL DEFAULT 0,
    system_id       text        NOT NULL DEFAULT '',
    notify_disabled boolean     NOT NULL DEFAULT false
);

-- How each live relay gets its work, for the share of shards: a slot reader takes every
-- shard only while all live relays are in WAL mode. Relays of the previous version insert
-- without it, and poll.
ALTER TABLE {{.Relays}} ADD COLUMN IF NOT EXISTS mode text NOT NULL DEFAULT 'poll'
    CHECK (mode IN ('poll', 'wal'));
