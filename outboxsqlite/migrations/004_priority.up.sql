-- outbox schema for SQLite, version 4: message priorities.
--
-- priority orders the relay's backlog: with messages waiting, those of a higher priority
-- are fetched first, each still behind the earlier messages of its key. Writers name the
-- column only for messages that have one, and the partial index holds only those rows.
-- Adding a column with a constant default rewrites no row.
--
-- Deferrable: writers and relays of the previous version never read it, and writers of
-- this version refuse a priority until it is there (outbox.ErrNoPriorities).
ALTER TABLE {{.Outbox}} ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
CREATE INDEX {{.Index "priority"}} ON {{.Outbox}} (priority DESC, seq) WHERE priority > 0;
