package outboxsqlite_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest/storetest"
)

func TestStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Outbox {
		t.Parallel() // each test has a database file of its own
		b := setup(t)
		return storetest.Outbox{
			Store: b.drv,
			Write: func(ctx context.Context, msgs []outbox.Message, rollback bool) error {
				tx, err := b.db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
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
					if _, err := tx.ExecContext(ctx, "SAVEPOINT sp"); err != nil {
						return err
					}
					if err := b.w.Write(ctx, tx, rolledBack...); err != nil {
						return err
					}
					_, err := tx.ExecContext(ctx, "ROLLBACK TO sp")
					return err
				})
			},
		}
	})
}
