package outboxpgx

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/internal/pgsql"
)

// MigrationStatus is one schema migration and whether it is applied.
type MigrationStatus = pgsql.MigrationStatus

type pgxQuerier struct{ tx pgx.Tx }

func (q pgxQuerier) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := q.tx.Exec(ctx, sql, args...)
	return err
}

func (q pgxQuerier) QueryInts(ctx context.Context, sql string, args ...any) ([]int, error) {
	rows, err := q.tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int])
}

func (q pgxQuerier) QueryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	err := q.tx.QueryRow(ctx, sql, args...).Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return pgsql.ErrNoRows
	}
	return err
}

func (d *Driver) inTx(ctx context.Context, fn func(pgsql.Querier) error) error {
	if err := d.needPool(); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error { return fn(pgxQuerier{tx}) })
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
