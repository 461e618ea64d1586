-- outbox schema, version 9: replay jobs.
--
-- A replay publishes again messages of the published history (outbox replay). Its row
-- says what it selects, where it sends, and how far it got: the publication time up to
-- which every selected message was sent, from where a replay run again goes on.
--
-- Deferrable: relays never read the table; outbox replay needs it.
CREATE TABLE IF NOT EXISTS {{.Replays}} (
    name        text        PRIMARY KEY,
    filter      jsonb       NOT NULL,
    destination text        NOT NULL,
    state       text        NOT NULL,
    total       bigint      NOT NULL,
    sent        bigint      NOT NULL,
    failed      bigint      NOT NULL,
    cursor_at   timestamptz NOT NULL,
    error       text        NOT NULL DEFAULT '',
    started_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
