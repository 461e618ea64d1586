package outboxsql

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/outboxdriver"
)

// This file is the relay's side of the driver (outboxdriver.Store) that is its own:
// SyncLeases and DeletePublished are the embedded pgsql.DB's. The statements are
// pgsql's, the same text outboxpgx runs, so the two drivers claim, fence and record
// outcomes identically and can even serve relays of one outbox side by side. Array
// parameters travel as PostgreSQL array literals (pgsql.IntArray, pgsql.TextArray),
// which every database/sql driver binds as a plain string.

// leasedShards returns the shards of leases, as the fetch statements take them.
func leasedShards(leases []outboxdriver.Lease) []int {
	shards := make([]int, len(leases))
	for i, l := range leases {
		shards[i] = l.Shard
	}
	return shards
}

// Fetch implements outboxdriver.Store.
func (d *Driver) Fetch(ctx context.Context, req outboxdriver.FetchRequest) ([]*outbox.Message, error) {
	if err := d.needDB(); err != nil {
		return nil, err
	}
	shards := leasedShards(req.Leases)
	var query string
	var args []any
	if req.After > 0 {
		held, err := pgsql.HeldKeys(req.Held())
		if err != nil {
			return nil, err
		}
		query, args = d.fetchAfterSQL, []any{req.RelayID, pgsql.IntArray(shards), req.After, req.Limit, held}
	} else {
		query, args = d.fetchSQL, []any{req.RelayID, pgsql.IntArray(shards), pgsql.IntArray(req.Exclude), req.Limit}
	}
	msgs, err := queryNoJIT(ctx, d.db, query, args, func(r pgsql.Row) (*outbox.Message, error) {
		m := &outbox.Message{}
		return m, pgsql.ScanMessage(r, m)
	})
	if err != nil {
		return nil, fmt.Errorf("fetch: %w", err)
	}
	return msgs, nil
}

// FetchPriority implements outboxdriver.PriorityFetcher (schema version 10).
func (d *Driver) FetchPriority(ctx context.Context, req outboxdriver.FetchRequest) ([]*outbox.Message, error) {
	if err := d.needDB(); err != nil {
		return nil, err
	}
	shards := leasedShards(req.Leases)
	exclude, limit, held, err := pgsql.PriorityFetchArgs(req)
	if err != nil {
		return nil, err
	}
	args := []any{req.RelayID, pgsql.IntArray(shards), pgsql.IntArray(exclude), limit, held}
	msgs, err := queryNoJIT(ctx, d.db, d.fetchPrioSQL, args, func(r pgsql.Row) (*outbox.Message, error) {
		m := &outbox.Message{}
		return m, pgsql.ScanMessage(r, m, &m.Priority)
	})
	if err != nil {
		return nil, pgsql.PriorityFetchError(err)
	}
	return msgs, nil
}

// queryNoJIT runs one relay statement with JIT compilation off, in a transaction of its
// own: BEGIN, SET LOCAL jit = off, the statement, COMMIT.
//
// The planner cannot know that a fetch stops after Limit rows of a short pending index,
// so on a large backlog, or before the table has statistics, its cost estimate crosses
// jit_above_cost and compiling takes hundreds of milliseconds for a query that runs in a
// few. outboxpgx sends set_config('jit', 'off', true) and the statement in one batch, one
// round trip; database/sql cannot batch a parameterised statement with another. Folding
// set_config into the statement itself would not work: PostgreSQL decides on JIT when it
// plans the statement, before anything in it runs. A session-wide SET would leak into the
// caller's pool, which is often the application's own. So the setting is SET LOCAL in a
// transaction that ends with the statement, at the price of three more round trips per
// fetch and per outcome batch: well under a millisecond on a local network, against the
// hundreds that one compilation costs.
func queryNoJIT[T any](ctx context.Context, db *sql.DB, query string, args []any, scan func(pgsql.Row) (T, error)) ([]T, error) {
	var out []T
	err := withTx(ctx, db, nil, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, pgsql.NoJIT); err != nil {
			return err
		}
		var err error
		out, err = pgsql.Collect(ctx, sqlQuerier{tx}, query, args, scan)
		return err
	})
	return out, err
}

// withTx runs fn in a transaction of db, committing when fn returns nil.
func withTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// Complete implements outboxdriver.Store in one statement.
func (d *Driver) Complete(ctx context.Context, c outboxdriver.Completion) ([]int64, error) {
	if err := d.needDB(); err != nil {
		return nil, err
	}
	a := pgsql.NewCompleteArgs(c)
	args := []any{c.RelayID, pgsql.IntArray(a.Tokens), pgsql.IntArray(a.Published),
		pgsql.IntArray(a.RetrySeqs), pgsql.TextArray(a.RetryErrors), pgsql.IntArray(a.RetryDelayMillis),
		pgsql.IntArray(a.DeadSeqs), pgsql.TextArray(a.DeadErrors), pgsql.IntArray(a.RetryCounts)}
	applied, err := queryNoJIT(ctx, d.db, d.completeSQL, args, pgsql.ScanInt64)
	if err != nil {
		return nil, pgsql.CompleteError(err)
	}
	return pgsql.Refused(c, applied), nil
}

// ErrNoPartition is wrapped by Complete's error when the published history has no
// partition for the day an outcome is recorded (schema version 3): the messages stay
// pending, nothing is lost, and Maintain (which every relay runs) or `outbox partitions
// create` creates the day.
var ErrNoPartition = pgsql.ErrNoPartition

// ErrCopyLimit is wrapped by MigrateUp's error when making the pending table a ring
// (migration 4) would copy more pending messages than Config.MigrateCopyLimit.
var ErrCopyLimit = pgsql.ErrCopyLimit

// Recycle implements outboxdriver.Recycler (schema version 4): retired buckets of the pending
// ring whose rows are nearly all gone are emptied with TRUNCATE, their few pending rows
// moved to the current bucket first with their seq, and the ring moves on once the
// current bucket has taken Config.RotateRows rows. Every relay calls it about every
// second; one at a time does the work. Before migration 4 it does nothing.
func (d *Driver) Recycle(ctx context.Context) (outboxdriver.Recycling, error) {
	r, err := d.names.Recycle(ctx, d.inTx)
	if err != nil {
		return r, fmt.Errorf("recycle: %w", err)
	}
	return r, nil
}

// Maintain implements outboxdriver.Maintainer: the published history's daily partitions are
// created 7 days ahead and dropped whole once older than the retention time, and expired
// dedup keys are deleted in batches of req.Limit. Every relay calls it; one at a time does
// the work (an advisory lock), and DDL gives up after a short lock_timeout and is tried
// again at the next call. Before migration 3 it deletes expired published rows instead.
func (d *Driver) Maintain(ctx context.Context, req outboxdriver.MaintainRequest) (outboxdriver.Maintenance, error) {
	m, err := d.names.Maintain(ctx, d.inTx, req)
	if err != nil {
		return m, fmt.Errorf("maintenance: %w", err)
	}
	return m, nil
}
