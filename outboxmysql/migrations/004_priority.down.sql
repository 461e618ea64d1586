-- Back to version 3: pending messages lose their priorities, and the relay reads its
-- backlog in seq order alone.
DROP INDEX {{.Index "priority"}} ON {{.Outbox}};
ALTER TABLE {{.Outbox}} DROP COLUMN priority;
