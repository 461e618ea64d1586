package outboxsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/outboxdriver"
)

var (
	_ outboxdriver.InboxDriver[*sql.Tx]   = (*Driver)(nil)
	_ outboxdriver.VersionDriver[*sql.Tx] = (*Driver)(nil)
)

// Claim implements outboxdriver.InboxDriver: one INSERT ... ON CONFLICT DO NOTHING in tx.
func (d *Driver) Claim(ctx context.Context, tx *sql.Tx, consumer string, ids []string) ([]bool, error) {
	recorded, err := pgsql.Collect(ctx, sqlQuerier{tx}, d.names.InboxClaim(), []any{consumer, pgsql.TextArray(ids)}, func(r pgsql.Row) (string, error) {
		var id string
		err := r.Scan(&id)
		return id, err
	})
	if err != nil {
		return nil, err
	}
	return pgsql.InboxFresh(ids, recorded), nil
}

// AdvanceVersion implements outboxdriver.VersionDriver with one upsert in tx.
func (d *Driver) AdvanceVersion(ctx context.Context, tx *sql.Tx, consumer, aggregateType, aggregateID string, version int64) (bool, error) {
	var ok bool
	err := tx.QueryRowContext(ctx, d.names.VersionAdvance(), consumer, aggregateType, aggregateID, version).Scan(&ok)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return ok, err
}

// DeleteInbox deletes up to limit inbox rows processed more than olderThan ago, in
// database time, and returns how many it deleted; fewer than limit means it is done for
// now. Run it periodically with a retention longer than the longest time a message can
// be redelivered: a message redelivered after its row is gone is processed again.
func (d *Driver) DeleteInbox(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	if err := d.needDB(); err != nil {
		return 0, err
	}
	res, err := d.db.ExecContext(ctx, d.names.InboxDelete(), olderThan.Seconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("delete inbox rows: %w", err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}
