// Package pgxq adapts pgx (a pool, a connection or a transaction) to pgsql.Querier, for
// the code that runs the shared PostgreSQL statements over pgx: outboxpgx and the CLI.
package pgxq

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/outbox/internal/pgsql"
)

// DB is what Querier needs of pgx: a *pgxpool.Pool, a *pgx.Conn and a pgx.Tx have it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Querier runs pgsql.Querier's calls on a DB.
type Querier struct{ DB DB }

var _ pgsql.Querier = Querier{}

func (q Querier) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := q.DB.Exec(ctx, sql, args...)
	return err
}

func (q Querier) ExecCount(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := q.DB.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

func (q Querier) Query(ctx context.Context, sql string, args []any, scan func(pgsql.Row) error) error {
	rows, err := q.DB.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// QueryRow returns pgsql.ErrNoRows for a statement that returned no row.
func (q Querier) QueryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	err := q.DB.QueryRow(ctx, sql, args...).Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return pgsql.ErrNoRows
	}
	return err
}
