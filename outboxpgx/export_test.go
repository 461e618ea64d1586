package outboxpgx

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/internal/pgsql"
)

// InRelayTx runs fn in a transaction on the connections the relay's statements use,
// followed by the stall watch.
func InRelayTx(ctx context.Context, d *Driver, fn func(pgsql.Querier) error) error {
	return d.begin(ctx, pgx.TxOptions{}, fn)
}

// StallCounts returns how many probe results the stall watch judged, and how many of
// its verdicts were on statements that never reached their session.
func StallCounts(d *Driver) (judged, unsent int) {
	d.stalls.mu.Lock()
	defer d.stalls.mu.Unlock()
	return d.stalls.judged, d.stalls.unsent
}

// SetDueChunk makes w look at n outboxes per statement when it looks for messages due.
func SetDueChunk(w *IdleWatch, n int) { w.chunk = n }
