package outboxpgx_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/outboxtest/storetest"
)

func TestStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Outbox {
		db := testdb.Migrated(t)
		return storetest.Outbox{
			Store: db.Driver,
			Write: func(ctx context.Context, msgs []outbox.Message, rollback bool) error {
				tx, err := db.Pool.Begin(ctx)
				if err != nil {
					return err
				}
				defer tx.Rollback(ctx)
				werr := db.Writer.Write(ctx, tx, msgs...)
				if rollback {
					return tx.Rollback(ctx)
				}
				if err := tx.Commit(ctx); err != nil {
					return err
				}
				return werr
			},
			WriteSavepoint: func(ctx context.Context, kept, rolledBack []outbox.Message) error {
				return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					if err := db.Writer.Write(ctx, tx, kept...); err != nil {
						return err
					}
					sp, err := tx.Begin(ctx)
					if err != nil {
						return err
					}
					if err := db.Writer.Write(ctx, sp, rolledBack...); err != nil {
						return err
					}
					return sp.Rollback(ctx)
				})
			},
		}
	})
}
