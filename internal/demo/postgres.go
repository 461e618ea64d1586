package demo

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxpgx"
)

// postgresBackend runs the demo in a schema of its own on a real PostgreSQL, dropped at
// the end.
func postgresBackend(ctx context.Context, url string) (*backend, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL: %w", err)
	}
	schema := "outbox_demo_" + randomTag()
	drv, err := outboxpgx.New(pool, outboxpgx.Config{Schema: schema})
	if err == nil {
		_, err = drv.MigrateUp(ctx, 0)
	}
	q := func(table string) string { return `"` + schema + `".` + table }
	if err == nil {
		_, err = pool.Exec(ctx, `CREATE TABLE `+q("orders")+` (id text PRIMARY KEY, customer text NOT NULL, amount_cents int NOT NULL);
CREATE TABLE `+q("shipments")+` (event_id text NOT NULL, order_id text NOT NULL, event_type text NOT NULL)`)
	}
	drop := func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
		pool.Close()
	}
	if err != nil {
		drop()
		return nil, fmt.Errorf("PostgreSQL: %w", err)
	}
	w, err := outbox.NewWriter(drv, outbox.WriterConfig{})
	if err != nil {
		drop()
		return nil, err
	}
	inbox, err := outbox.NewInbox[pgx.Tx](drv, outbox.InboxConfig{Consumer: "shipping"})
	if err != nil {
		drop()
		return nil, err
	}
	return &backend{
		name:  "PostgreSQL, schema " + schema + " (dropped at the end)",
		store: drv,
		admin: drv,
		placeOrder: func(ctx context.Context, id, customer string, cents int, events []outbox.Message, rollback bool) error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, `INSERT INTO `+q("orders")+` VALUES ($1, $2, $3)`, id, customer, cents); err != nil {
				return err
			}
			if err := w.Write(ctx, tx, events...); err != nil {
				return err
			}
			if rollback {
				return tx.Rollback(ctx)
			}
			return tx.Commit(ctx)
		},
		consume: func(ctx context.Context, ds []*outbox.Delivery) (fresh []bool, err error) {
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				ids := make([]string, len(ds))
				for i, d := range ds {
					ids[i] = d.ID
				}
				if fresh, err = inbox.ClaimBatch(ctx, tx, ids); err != nil {
					return err
				}
				var rows [][]any
				for i, d := range ds {
					if fresh[i] {
						rows = append(rows, []any{d.ID, d.Key, d.EventType})
					}
				}
				_, err := tx.CopyFrom(ctx, pgx.Identifier{schema, "shipments"}, []string{"event_id", "order_id", "event_type"}, pgx.CopyFromRows(rows))
				return err
			})
			return fresh, err
		},
		effects: func(ctx context.Context) (rows, distinct int, err error) {
			err = pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM `+q("shipments")).Scan(&rows, &distinct)
			return rows, distinct, err
		},
		next: []string{
			"{cli} demo --help                 (bigger runs: --orders, --writers)",
			"{cli} migrate up --database-url URL, then {cli} relay --database-url URL --broker nats://...   (an outbox of your own)",
		},
		close: drop,
	}, nil
}
