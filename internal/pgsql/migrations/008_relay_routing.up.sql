-- outbox schema, version 8: each relay's destinations and routing, with its heartbeat.
--
-- fingerprint identifies where a relay sends messages; relays whose fingerprints differ
-- never hold shards at the same time, so that a key's messages never go to two places
-- at once (docs/operations.md, "Changing the routing"). destinations is the state of
-- each of the relay's destinations at its last heartbeat (JSON), for outbox status and
-- the console.
--
-- Deferrable: relays of the previous version never read the columns, and relays of
-- this version run without them, comparing no fingerprints.
ALTER TABLE {{.Relays}} ADD COLUMN IF NOT EXISTS fingerprint text NOT NULL DEFAULT '';
ALTER TABLE {{.Relays}} ADD COLUMN IF NOT EXISTS destinations text NOT NULL DEFAULT '';
