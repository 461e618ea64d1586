ALTER TABLE {{.Relays}} DROP COLUMN destinations;
ALTER TABLE {{.Relays}} DROP COLUMN fingerprint;
