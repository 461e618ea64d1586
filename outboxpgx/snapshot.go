package outboxpgx

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/outboxdriver"
)

var _ outboxdriver.SnapshotFetcher = (*Driver)(nil)

// FetchSnapshot implements outboxdriver.SnapshotFetcher: Fetch's statement, and a
// snapshot (pg_current_snapshot(), PostgreSQL 13 or later) taken just before it. Under
// READ COMMITTED the fetch takes its own snapshot once it holds its locks, later than
// the one returned: a transaction finished in the returned snapshot was finished in the
// fetch's, so its rows were there to be read (a reclaim's moved rows included: TRUNCATE
// is not MVCC-safe, but the fetch waits for the reclaim's lock before its snapshot). The
// converse need not hold: a transaction that finished in between counts as running, and
// the relay looks again.
//
// Like Fetch, it costs one round trip and two statements: JIT off with the snapshot, then
// the fetch, as one pgx batch in one implicit transaction. A connection the server had
// closed or silent is replaced at once (onConn).
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
	r, err := onConn(ctx, d, func(c *pgxpool.Conn) (result, error) {
		var r result
		b := &pgx.Batch{}
		b.Queue("SELECT set_config('jit', 'off', true), pg_current_snapshot()::text").QueryRow(func(row pgx.Row) error {
			var jit string
			return row.Scan(&jit, &r.snap)
		})
		b.Queue(sql, args...).Query(func(rows pgx.Rows) error {
			var err error
			r.msgs, err = pgx.CollectRows(rows, scanMessage)
			return err
		})
		return r, c.SendBatch(ctx, b).Close()
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

// leasedShards returns the shards of leases, as the fetch statements take them.
func leasedShards(leases []outboxdriver.Lease) []int16 {
	shards := make([]int16, len(leases))
	for i, l := range leases {
		shards[i] = int16(l.Shard)
	}
	return shards
}

// fetchStatement returns the statement and arguments of Fetch and FetchSnapshot for req:
// a continuation (req.After) or a full fetch.
func (d *Driver) fetchStatement(req outboxdriver.FetchRequest) (string, []any, error) {
	shards := leasedShards(req.Leases)
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
