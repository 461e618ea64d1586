package demo

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxsqlite"
)

// sqliteBackend runs the demo on two SQLite files in dir: the order service's database
// (orders and the outbox) and the shipping consumer's (shipments and its inbox), as two
// services would have.
// kept says whether dir outlives the run (--dir), which decides what to run next.
func sqliteBackend(ctx context.Context, dir string, kept bool) (*backend, error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	open := func(name, tables string) (*sql.DB, *outboxsqlite.Driver, error) {
		db, err := outboxsqlite.Open(filepath.Join(dir, name))
		if err != nil {
			return nil, nil, err
		}
		closers = append(closers, func() { _ = db.Close() })
		drv, err := outboxsqlite.New(db, outboxsqlite.Config{})
		if err == nil {
			_, err = drv.MigrateUp(ctx, 0)
		}
		if err == nil {
			_, err = db.ExecContext(ctx, tables)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("SQLite %s: %w", name, err)
		}
		return db, drv, nil
	}
	orders, drv, err := open("orders.db", `CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, customer TEXT NOT NULL, amount_cents INTEGER NOT NULL)`)
	if err != nil {
		closeAll()
		return nil, err
	}
	shipping, shippingDrv, err := open("shipping.db", `CREATE TABLE IF NOT EXISTS shipments (event_id TEXT NOT NULL, order_id TEXT NOT NULL, event_type TEXT NOT NULL)`)
	if err != nil {
		closeAll()
		return nil, err
	}
	w, err := outbox.NewWriter[*sql.Tx](drv, outbox.WriterConfig{})
	if err != nil {
		closeAll()
		return nil, err
	}
	inbox, err := outbox.NewInbox[*sql.Tx](shippingDrv, outbox.InboxConfig{Consumer: "shipping"})
	if err != nil {
		closeAll()
		return nil, err
	}
	inTx := outbox.SQLTx(shipping, nil)
	return &backend{
		name:  "SQLite files orders.db (order service and outbox) and shipping.db (consumer and inbox) in " + dir,
		store: drv,
		admin: drv,
		placeOrder: func(ctx context.Context, id, customer string, cents int, events []outbox.Message, rollback bool) error {
			tx, err := orders.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			if _, err := tx.ExecContext(ctx, `INSERT INTO orders VALUES (?, ?, ?)`, id, customer, cents); err != nil {
				return err
			}
			if err := w.Write(ctx, tx, events...); err != nil {
				return err
			}
			if rollback {
				return tx.Rollback()
			}
			return tx.Commit()
		},
		consume: func(ctx context.Context, ds []*outbox.Delivery) (fresh []bool, err error) {
			err = inTx(ctx, func(tx *sql.Tx) error {
				ids := make([]string, len(ds))
				for i, d := range ds {
					ids[i] = d.ID
				}
				if fresh, err = inbox.ClaimBatch(ctx, tx, ids); err != nil {
					return err
				}
				for i, d := range ds {
					if !fresh[i] {
						continue
					}
					if _, err := tx.ExecContext(ctx, `INSERT INTO shipments VALUES (?, ?, ?)`, d.ID, d.Key, d.EventType); err != nil {
						return err
					}
				}
				return nil
			})
			return fresh, err
		},
		effects: func(ctx context.Context) (rows, distinct int, err error) {
			err = shipping.QueryRowContext(ctx, `SELECT count(*), count(DISTINCT event_id) FROM shipments`).Scan(&rows, &distinct)
			return rows, distinct, err
		},
		next:  sqliteNext(dir, kept),
		close: closeAll,
	}, nil
}

// sqliteNext is what to run after a demo on SQLite: look at the outbox it left, or, when
// its directory is removed at the end, run it again keeping one.
func sqliteNext(dir string, kept bool) []string {
	if !kept {
		return []string{
			"{cli} demo --dir outbox-demo     (keeps the databases; then:)",
			"{cli} status --database-url sqlite:outbox-demo/orders.db",
			"{cli} console --database-url sqlite:outbox-demo/orders.db   (the web console, http://127.0.0.1:8080)",
		}
	}
	url := "sqlite:" + filepath.ToSlash(filepath.Join(dir, "orders.db"))
	if abs, err := filepath.Abs(filepath.Join(dir, "orders.db")); err == nil {
		url = "sqlite://" + filepath.ToSlash(abs)
	}
	return []string{
		"{cli} status --database-url " + url,
		"{cli} console --database-url " + url + "   (the web console, http://127.0.0.1:8080)",
	}
}
