package outboxsql

import "github.com/outboxkit/outbox/internal/pgsql"

// The operator's side of the driver (outboxdriver.Admin: the figures behind `outbox
// status` and the dead-letter tooling behind `outbox dead`) is pgsql's DB, embedded in
// Driver: the same code outboxpgx runs, so both report and act alike.

// PublishedExactBelow is the size of the published table, as estimated by PostgreSQL's
// statistics, under which Status counts published rows exactly. Above it Status reports
// that estimate, because counting them exactly means reading the whole table.
const PublishedExactBelow = pgsql.PublishedExactBelow
