package pgsql

import (
	"context"
	"errors"
)

// Querier is the little the shared code (migrations, maintenance, the ring, the
// operator's calls, leases and retention) needs from a pool or a transaction. The drivers
// adapt pgxpool.Pool and pgx.Tx, *sql.DB and *sql.Tx to it.
type Querier interface {
	// Exec runs sql, which may hold several statements when args is empty.
	Exec(ctx context.Context, sql string, args ...any) error
	// ExecCount runs one statement and returns the number of rows it affected.
	ExecCount(ctx context.Context, sql string, args ...any) (int64, error)
	// Query runs sql and calls scan on each row in turn; scan's first error ends it.
	Query(ctx context.Context, sql string, args []any, scan func(Row) error) error
	// QueryRow runs sql and scans its first row into dest; ErrNoRows when it has none.
	QueryRow(ctx context.Context, sql string, args []any, dest ...any) error
}

// Row is the current row of Querier.Query: pgx.Rows and *sql.Rows both are one.
type Row interface {
	Scan(dest ...any) error
}

// ErrNoRows is Querier.QueryRow's error for a statement that returned no row.
var ErrNoRows = errors.New("no rows")

// InTx runs fn in one transaction, committing when fn returns nil.
type InTx func(ctx context.Context, fn func(Querier) error) error

// Collect runs sql on q and returns scan's value for every row, an empty slice (not nil)
// for none, like pgx.CollectRows.
func Collect[T any](ctx context.Context, q Querier, sql string, args []any, scan func(Row) (T, error)) ([]T, error) {
	out := []T{}
	err := q.Query(ctx, sql, args, func(r Row) error {
		v, err := scan(r)
		out = append(out, v)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ScanInt64 scans a row of one integer column.
func ScanInt64(r Row) (int64, error) {
	var v int64
	err := r.Scan(&v)
	return v, err
}

// queryInts runs sql on q and returns the first column of every row.
func queryInts(ctx context.Context, q Querier, sql string, args ...any) ([]int, error) {
	return Collect(ctx, q, sql, args, func(r Row) (int, error) {
		var v int
		err := r.Scan(&v)
		return v, err
	})
}

// DB is the part of outboxdriver.Store and outboxdriver.Admin that both PostgreSQL
// drivers run alike over their pool: the operator's calls (admin.go) and the relay's
// lease and retention calls (store.go). The drivers embed it, so its methods are theirs
// and their doc comments here are the user documentation. It is safe for concurrent use
// when its pool is.
type DB struct {
	names *Names
	// ready returns the driver's error for a call that needs the pool when the driver
	// was made without one, and nil otherwise. Every method asks it first.
	ready func() error
	// pool runs single statements, each in a transaction of its own.
	pool Querier
	// inTx runs a read-write transaction of the pool at the default isolation level;
	// snapshot runs a read-only REPEATABLE READ one, whose statements all see one
	// snapshot and one now().
	inTx, snapshot InTx
}

// NewDB returns the shared logic over a driver's pool (see DB's fields for what each
// argument is). The fields stay unexported so that a driver embedding DB adds its
// methods, and nothing else, to its API.
func NewDB(names *Names, ready func() error, pool Querier, inTx, snapshot InTx) *DB {
	return &DB{names: names, ready: ready, pool: pool, inTx: inTx, snapshot: snapshot}
}
