-- Back to version 7: relays no longer record their destinations and routing.
ALTER TABLE {{.Relays}} DROP COLUMN IF EXISTS destinations;
ALTER TABLE {{.Relays}} DROP COLUMN IF EXISTS fingerprint;
