package outboxpgx

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/internal/pgsql/pgxq"
)

// MigrationStatus is one schema migration and whether it is applied.
type MigrationStatus = pgsql.MigrationStatus

// inTx runs fn in a transaction of the pool, for the shared code (pgsql.InTx).
func (d *Driver) inTx(ctx context.Context, fn func(pgsql.Querier) error) error {
	return d.begin(ctx, pgx.TxOptions{}, fn)
}

// inSnapshot runs fn in a read-only REPEATABLE READ transaction of the pool.
func (d *Driver) inSnapshot(ctx context.Context, fn func(pgsql.Querier) error) error {
	return d.begin(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, fn)
}

// begin runs fn in a transaction of the pool, again at once on another connection when
// the connection turned out to be gone or silent (onConn): every caller's fn is safe to
// repeat (the migrations read the applied versions in the transaction).
func (d *Driver) begin(ctx context.Context, opts pgx.TxOptions, fn func(pgsql.Querier) error) error {
	if err := d.needPool(); err != nil {
		return err
	}
	_, err := onConn(ctx, d, func(c *pgxpool.Conn) (struct{}, error) {
		return struct{}{}, pgx.BeginTxFunc(ctx, c, opts, func(tx pgx.Tx) error { return fn(pgxq.Querier{DB: tx}) })
	})
	return err
}

// MigrateUp applies the schema migrations up to version target (0 for all) and returns
// the versions it applied. It is safe to run from several processes at once.
func (d *Driver) MigrateUp(ctx context.Context, target int) ([]int, error) {
	return d.names.Up(ctx, d.inTx, target)
}

// MigrateDown reverts migrations above version target (0 reverts all, dropping the
// outbox and everything in it) and returns the versions it reverted.
func (d *Driver) MigrateDown(ctx context.Context, target int) ([]int, error) {
	return d.names.Down(ctx, d.inTx, target)
}

// MigrationStatus lists the migrations and whether each is applied.
func (d *Driver) MigrationStatus(ctx context.Context) ([]MigrationStatus, error) {
	return d.names.Status(ctx, d.inTx)
}

// MigrationSQL returns the whole schema as one SQL script, for teams that run
// migrations with their own tool.
func (d *Driver) MigrationSQL() (string, error) { return d.names.SQL() }
