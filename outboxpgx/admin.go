package outboxpgx

import (
	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/outboxdriver"
)

// The operator's side of the driver (outboxdriver.Admin: the figures behind `outbox
// status` and the dead-letter tooling behind `outbox dead`) is pgsql's DB, embedded in
// Driver and shared with outboxsql; these are the names its documentation refers to.

// ErrEmptyDeadFilter is outboxdriver.ErrEmptyDeadFilter.
var ErrEmptyDeadFilter = outboxdriver.ErrEmptyDeadFilter

// PublishedExactBelow is the size of the published table, as estimated by PostgreSQL's
// statistics, under which Status counts published rows exactly. Above it Status reports
// that estimate, because counting them exactly means reading the whole table.
const PublishedExactBelow = pgsql.PublishedExactBelow
