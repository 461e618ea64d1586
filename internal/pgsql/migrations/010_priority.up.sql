-- outbox schema, version 10: message priorities.
--
-- priority orders the relay's backlog: with messages waiting, those of a higher priority
-- are fetched first (outboxdriver.PriorityFetcher), each still behind the earlier
-- messages of its key. Writers set it only for messages that have one, so the column
-- costs the others nothing, and the index holds only those rows. Adding a column with a
-- constant default rewrites no row; the index is built from the pending rows alone.
--
-- Deferrable: writers and relays of the previous version never read it, and writers of
-- this version refuse a priority until it is there (outboxdriver.ErrNoPriorities).
ALTER TABLE {{.Outbox}} ADD COLUMN IF NOT EXISTS priority smallint NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS {{.Index "priority"}} ON {{.Outbox}} (priority DESC, seq) WHERE priority > 0;
