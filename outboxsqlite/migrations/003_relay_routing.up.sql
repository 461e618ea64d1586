-- outbox schema for SQLite, version 3: each relay's destinations and routing, with its
-- heartbeat. Relays whose fingerprints differ never hold shards at the same time, so
-- that a key's messages never go to two places at once; destinations is the state of
-- each of the relay's destinations at its last heartbeat (JSON). Relays of this version
-- need it: apply it before upgrading them (relays of the previous version run with it).
ALTER TABLE {{.Relays}} ADD COLUMN fingerprint TEXT NOT NULL DEFAULT '';
ALTER TABLE {{.Relays}} ADD COLUMN destinations TEXT NOT NULL DEFAULT '';
