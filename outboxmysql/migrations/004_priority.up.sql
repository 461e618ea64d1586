-- outbox schema for MySQL 8+ and MariaDB 10.6+, version 4: message priorities.
--
-- priority orders the relay's backlog: with messages waiting, those of a higher priority
-- are fetched first, each still behind the earlier messages of its key. Writers name the
-- column only for messages that have one. Adding a column with a constant default is an
-- instant change (no row is rewritten); the index is built online from the pending rows.
-- MySQL has no partial indexes, so every pending row has an entry: a priority of 0 sorts
-- first and new rows append at the end of that range, as they do in the primary key.
--
-- Deferrable: writers and relays of the previous version never read it, and writers of
-- this version refuse a priority until it is there (outbox.ErrNoPriorities).
ALTER TABLE {{.Outbox}} ADD COLUMN priority TINYINT NOT NULL DEFAULT 0;
CREATE INDEX {{.Index "priority"}} ON {{.Outbox}} (priority, seq);
