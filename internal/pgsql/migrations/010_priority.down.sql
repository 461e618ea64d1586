-- Back to version 9: pending messages lose their priorities, and the relay reads its
-- backlog in seq order alone.
DROP INDEX IF EXISTS {{.QualifiedIndex "priority"}};
ALTER TABLE {{.Outbox}} DROP COLUMN IF EXISTS priority;
