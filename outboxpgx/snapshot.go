package outboxpgx

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/outboxdriver"
)

var _ outboxdriver.SnapshotFetcher = (*Driver)(nil)

// FetchSnapshot implements outboxdriver.SnapshotFetcher: Fetch's statement, and the
// snapshot it read in (pg_current_snapshot(), PostgreSQL 13 or later). Under READ
// COMMITTED every statement takes a snapshot of its own, so the two run in one read-only
// REPEATABLE READ transaction, where the first statement takes the snapshot that every
// later one sees.
//
// Like Fetch, it costs one round trip: the whole transaction (BEGIN, the snapshot, JIT
// off, the fetch, COMMIT) goes as one pgx batch. A statement that fails leaves the
// connection in an aborted transaction; pgxpool destroys a connection released outside
// the idle state, so it is never lent again, and the error costs that connection rather
// than a ROLLBACK's round trip. A connection the server had closed is replaced at once
// (onLiveConn).
func (d *Driver) FetchSnapshot(ctx context.Context, req outboxdriver.FetchRequest) ([]*outbox.Message, outboxdriver.Snapshot, error) {
	if err := d.needPool(); err != nil {
		return nil, outboxdriver.Snapshot{}, err
	}
	sql, args, err := d.fetchStatement(req)
	if err != nil {
		return nil, outboxdriver.Snapshot{}, err
	}
	type result struct {
		msgs []*outbox.Message
		snap string
	}
	r, err := onLiveConn(ctx, d.pool, func() (result, error) {
		var r result
		b := &pgx.Batch{}
		b.Queue("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
		// The locks before the snapshot: TRUNCATE is not MVCC-safe, and the ring's
		// reclaim moves a bucket's last pending rows to the current bucket, then
		// truncates it. A snapshot taken before a reclaim that commits before the fetch
		// reads would see neither the moved rows nor the emptied bucket's, and the key
		// gate would let a key's later rows overtake them (the torture caught it). LOCK
		// takes no snapshot, so the one below is taken once any reclaim committed.
		b.Queue("LOCK TABLE " + d.names.Outbox + " IN ACCESS SHARE MODE")
		b.Queue("SELECT pg_current_snapshot()::text").QueryRow(func(row pgx.Row) error { return row.Scan(&r.snap) })
		b.Queue("SELECT set_config('jit', 'off', true)")
		b.Queue(sql, args...).Query(func(rows pgx.Rows) error {
			var err error
			r.msgs, err = pgx.CollectRows(rows, scanMessage)
			return err
		})
		b.Queue("COMMIT")
		return r, d.pool.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return nil, outboxdriver.Snapshot{}, fmt.Errorf("fetch: %w", err)
	}
	snap, err := pgsql.ParseSnapshot(r.snap)
	if err != nil {
		return nil, outboxdriver.Snapshot{}, fmt.Errorf("fetch: %w", err)
	}
	return r.msgs, snap, nil
}

// fetchStatement returns the statement and arguments of Fetch and FetchSnapshot for req:
// a continuation (req.After) or a full fetch.
func (d *Driver) fetchStatement(req outboxdriver.FetchRequest) (string, []any, error) {
	shards := make([]int16, len(req.Leases))
	for i, l := range req.Leases {
		shards[i] = int16(l.Shard)
	}
	if req.After > 0 {
		held, err := pgsql.HeldKeys(req.Held())
		if err != nil {
			return "", nil, err
		}
		return d.fetchAfterSQL, []any{req.RelayID, shards, req.After, req.Limit, held}, nil
	}
	exclude := req.Exclude
	if exclude == nil {
		exclude = []int64{}
	}
	return d.fetchSQL, []any{req.RelayID, shards, exclude, req.Limit}, nil
}
