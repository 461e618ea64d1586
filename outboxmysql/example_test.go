package outboxmysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"log/slog"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testmysql"
	"github.com/outboxkit/outbox/outboxmysql"
	"github.com/outboxkit/outbox/outboxtest"
)

// Example writes an event in the same transaction as the business change, and a relay
// publishes it once the transaction commits. The in-memory publisher of outboxtest
// stands in for a broker.
func Example() {
	ctx := context.Background()
	cfg, err := mysql.ParseDSN(testmysql.DSN()) // your server: "user:password@tcp(host:3306)/app"
	if err != nil {
		log.Fatal(err)
	}
	cfg.DBName = "outbox_example"
	admin, err := sql.Open("mysql", testmysql.DSN())
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Close()
	_, _ = admin.ExecContext(ctx, "DROP DATABASE IF EXISTS outbox_example")
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE outbox_example"); err != nil {
		log.Fatal(err)
	}
	defer admin.ExecContext(ctx, "DROP DATABASE IF EXISTS outbox_example")

	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	drv, err := outboxmysql.New(db, outboxmysql.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := drv.MigrateUp(ctx, 0); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id VARCHAR(64) PRIMARY KEY, total INT)`); err != nil {
		log.Fatal(err)
	}
	w, err := outbox.NewWriter(drv, outbox.WriterConfig{})
	if err != nil {
		log.Fatal(err)
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, total) VALUES (?, ?)`, "order-42", 1999); err != nil {
		log.Fatal(err)
	}
	err = w.Write(ctx, tx, outbox.Message{
		Topic:     "orders",
		Key:       "order-42", // events of one order keep their order
		EventType: "order.placed",
		Payload:   []byte(`{"id":"order-42","total":1999}`),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	pub := &outboxtest.Publisher{}
	relay, err := outbox.NewRelay(drv, pub, outbox.RelayConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil {
		log.Fatal(err)
	}
	// A bound on a hang, not on how long publishing takes: generous for a loaded machine.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	msgs, err := pub.WaitFor(wctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Stop(wctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println(msgs[0].Topic, msgs[0].EventType, string(msgs[0].Payload))
	// Output: orders order.placed {"id":"order-42","total":1999}
}
