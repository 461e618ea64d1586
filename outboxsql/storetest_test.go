package outboxsql_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxtest/storetest"
)

// The store conformance suite, once per database/sql driver: the store binds every
// parameter as a plain value (arrays as literals), so each driver must pass it whole.

func TestStoreConformancePgxStdlib(t *testing.T) { runStoreConformance(t, "pgx") }

func TestStoreConformanceLibPQ(t *testing.T) { runStoreConformance(t, "postgres") }

func runStoreConformance(t *testing.T, driverName string) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Outbox {
		b := setupUnmigrated(t, driverName)
		if _, err := b.drv.MigrateUp(testenv.Context(t), 0); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		return storetest.Outbox{
			Store: b.drv,
			Write: func(ctx context.Context, msgs []outbox.Message, rollback bool) error {
				tx, err := b.db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback() }()
				werr := b.w.Write(ctx, tx, msgs...)
				if rollback {
					return tx.Rollback()
				}
				if err := tx.Commit(); err != nil {
					return err
				}
				return werr
			},
			WriteSavepoint: func(ctx context.Context, kept, rolledBack []outbox.Message) error {
				return inTx(ctx, b.db, func(tx *sql.Tx) error {
					if err := b.w.Write(ctx, tx, kept...); err != nil {
						return err
					}
					if _, err := tx.ExecContext(ctx, "SAVEPOINT s"); err != nil {
						return err
					}
					if err := b.w.Write(ctx, tx, rolledBack...); err != nil {
						return err
					}
					_, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT s")
					return err
				})
			},
		}
	})
}

// inTx runs fn in a transaction of db and commits it when fn returns nil.
func inTx(ctx context.Context, db *sql.DB, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return errors.Join(err, tx.Rollback())
	}
	return tx.Commit()
}
