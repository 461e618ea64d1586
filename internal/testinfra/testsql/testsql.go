// Package testsql is what the tests of the stores written through database/sql
// (outboxsql, outboxmysql, outboxsqlite) share: the conformance suite's view of such a
// store.
package testsql

import (
	"context"
	"database/sql"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxtest/storetest"
)

// Outbox is the storetest view of store, written by w in transactions of db. The
// savepoint test uses the SQL standard's SAVEPOINT and ROLLBACK TO SAVEPOINT, which
// PostgreSQL, MySQL, MariaDB and SQLite all take.
func Outbox(store outboxdriver.Store, db *sql.DB, w *outbox.Writer[*sql.Tx]) storetest.Outbox {
	return storetest.Outbox{
		Store: store,
		Write: func(ctx context.Context, msgs []outbox.Message, rollback bool) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			werr := w.Write(ctx, tx, msgs...)
			if rollback {
				return tx.Rollback()
			}
			if err := tx.Commit(); err != nil {
				return err
			}
			return werr
		},
		WriteSavepoint: func(ctx context.Context, kept, rolledBack []outbox.Message) error {
			return outbox.SQLTx(db, nil)(ctx, func(tx *sql.Tx) error {
				if err := w.Write(ctx, tx, kept...); err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, "SAVEPOINT sp"); err != nil {
					return err
				}
				if err := w.Write(ctx, tx, rolledBack...); err != nil {
					return err
				}
				_, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT sp")
				return err
			})
		},
	}
}
