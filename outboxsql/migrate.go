package outboxsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/outboxkit/outbox/internal/pgsql"
)

// MigrationStatus is one schema migration and whether it is applied.
type MigrationStatus = pgsql.MigrationStatus

// sqlQuerier adapts a *sql.DB or a *sql.Tx to pgsql.Querier.
type sqlQuerier struct {
	db interface {
		ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
		QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
		QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	}
}

func (q sqlQuerier) Exec(ctx context.Context, query string, args ...any) error {
	_, err := q.db.ExecContext(ctx, query, args...)
	return err
}

func (q sqlQuerier) ExecCount(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := q.db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (q sqlQuerier) Query(ctx context.Context, query string, args []any, scan func(pgsql.Row) error) error {
	rows, err := q.db.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return rows.Close()
}

func (q sqlQuerier) QueryRow(ctx context.Context, query string, args []any, dest ...any) error {
	err := q.db.QueryRowContext(ctx, query, args...).Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return pgsql.ErrNoRows
	}
	return err
}

// txWith returns a pgsql.InTx that runs fn in a transaction of d.db begun with opts,
// for the shared code behind the store and admin calls (pgsql.DB), which checks for a
// missing d.db first.
func (d *Driver) txWith(opts *sql.TxOptions) pgsql.InTx {
	return func(ctx context.Context, fn func(pgsql.Querier) error) error {
		return withTx(ctx, d.db, opts, func(tx *sql.Tx) error { return fn(sqlQuerier{tx}) })
	}
}

// inTx runs fn in one transaction of d.db, committing when fn returns nil.
func (d *Driver) inTx(ctx context.Context, fn func(pgsql.Querier) error) (err error) {
	if d.db == nil {
		return errors.New("outboxsql: migrations need a database: pass a *sql.DB to outboxsql.New")
	}
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if err := fn(sqlQuerier{tx}); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// MigrateUp applies the schema migrations up to version target (0 for all) and returns
// the versions it applied. It is safe to run from several processes at once, and with
// outboxpgx's MigrateUp: both apply the same migrations and record them in the same
// table.
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
// migrations with their own tool. It needs no database.
func (d *Driver) MigrationSQL() (string, error) { return d.names.SQL() }
