package outboxpgx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/outboxdriver"
)

var _ outboxdriver.InboxDriver[pgx.Tx] = (*Driver)(nil)

// Claim implements outboxdriver.InboxDriver: one INSERT ... ON CONFLICT DO NOTHING in tx.
func (d *Driver) Claim(ctx context.Context, tx pgx.Tx, consumer string, ids []string) ([]bool, error) {
	rows, err := tx.Query(ctx, d.names.InboxClaim(), consumer, ids)
	if err != nil {
		return nil, err
	}
	recorded, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	return pgsql.InboxFresh(ids, recorded), nil
}

// DeleteInbox deletes up to limit inbox rows processed more than olderThan ago, in
// database time, and returns how many it deleted; fewer than limit means it is done for
// now. Run it periodically with a retention longer than the longest time a message can
// be redelivered: a message redelivered after its row is gone is processed again.
func (d *Driver) DeleteInbox(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	if err := d.needPool(); err != nil {
		return 0, err
	}
	tag, err := d.pool.Exec(ctx, d.names.InboxDelete(), olderThan.Seconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("delete inbox rows: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

var _ outboxdriver.VersionDriver[pgx.Tx] = (*Driver)(nil)

// AdvanceVersion implements outboxdriver.VersionDriver with one upsert in tx.
func (d *Driver) AdvanceVersion(ctx context.Context, tx pgx.Tx, consumer, aggregateType, aggregateID string, version int64) (bool, error) {
	var ok bool
	err := tx.QueryRow(ctx, d.names.VersionAdvance(), consumer, aggregateType, aggregateID, version).Scan(&ok)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return ok, err
}
