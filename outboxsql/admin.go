package outboxsql

import (
	"context"

	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/outboxdriver"
)

// This file is the operator's side of the driver (outboxdriver.Admin): the figures behind
// `outbox status` and the dead-letter tooling behind `outbox dead`. The statements and
// the logic that runs them are pgsql's (pgsql.DB), the same code outboxpgx runs, so both
// report and act alike; the methods here carry the documentation.

// PublishedExactBelow is the size of the published table, as estimated by PostgreSQL's
// statistics, under which Status counts published rows exactly. Above it the count is an
// estimate (see Status), because counting them exactly means reading the whole table.
const PublishedExactBelow = pgsql.PublishedExactBelow

// Status returns a snapshot of the outbox, read in one repeatable-read, read-only
// transaction so that its figures agree with each other and share one database clock.
//
// The pending and dead figures are exact and cheap: the pending table holds only the
// backlog and the dead table only the dead letters, so their cost follows the backlog and
// the dead-letter store, not the history kept. Published is exact while PostgreSQL
// estimates the published table below PublishedExactBelow rows; above that it is
// PostgreSQL's row-count estimate for that table (pg_class.reltuples). OldestPendingAge
// is measured from when the message was written, so a message delayed with DeliverAt
// counts from its write too.
//
// Relays lists the relays in the relays table (expired ones are kept about an hour and
// shown with Live false) with the number of shards each holds an unexpired lease on.
func (d *Driver) Status(ctx context.Context) (outboxdriver.Status, error) {
	return d.shared.Status(ctx)
}

// DeadList returns the dead letters that match f, most recently dead-lettered first.
func (d *Driver) DeadList(ctx context.Context, f outboxdriver.DeadFilter) ([]outboxdriver.DeadLetter, error) {
	return d.shared.DeadList(ctx, f)
}

// DeadCount returns how many dead letters match f (at most f.Limit when it is set): what
// DeadReplay or DeadPurge would act on if called now.
func (d *Driver) DeadCount(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	return d.shared.DeadCount(ctx, f)
}

// DeadReplay moves the dead letters that match f back to pending, due at once, with
// their attempt count reset, and returns how many it moved. With f.Limit set it takes the
// ones DeadList would show first.
//
// A replayed message keeps its ID, dedup key and position (seq), so it reaches the broker
// with the identity it was written with and consumers that already saw it (a broker that
// accepted it but whose confirmation was lost) deduplicate it as usual. Replayed messages
// of one key are published in their original order; messages of that key written after
// them and already published are not held back, so a consumer sees the replayed message
// after its successors. The last error is kept until the next attempt overwrites it, for
// whoever investigates a message that fails again.
//
// The matching dead letters are locked and moved from the dead table to the pending one
// in one transaction, which also wakes the relays that listen for notifications (relays
// on outboxpgx; relays on this package poll).
func (d *Driver) DeadReplay(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	return d.shared.DeadReplay(ctx, f)
}

// DeadPurge deletes the dead letters that match f and returns how many it deleted. With
// f.Limit set it takes the ones DeadList would show first.
//
// A purged message's dedup key is not released at once: the relay's retention cleanup
// releases it later, once it is older than the retention time. Until then a message
// written with the same dedup key is still skipped as a duplicate.
//
// A filter that selects nothing in particular is refused with outboxdriver.ErrEmptyDeadFilter:
// deleting everything is DeadPurgeAll.
func (d *Driver) DeadPurge(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	return d.shared.DeadPurge(ctx, f)
}

// DeadPurgeAll deletes every dead letter and returns how many it deleted. Pending and
// published messages are not touched. Dedup keys are released later, as for DeadPurge.
func (d *Driver) DeadPurgeAll(ctx context.Context) (int, error) {
	return d.shared.DeadPurgeAll(ctx)
}
