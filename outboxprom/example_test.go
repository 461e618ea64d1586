package outboxprom_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxprom"
	"github.com/outboxkit/outbox/outboxtest"
)

// Example gives a relay Prometheus metrics and serves them with the outbox's backlog:
// the message written shows as pending, then as published.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.URL()) // your database
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	_, _ = pool.Exec(ctx, `DROP SCHEMA IF EXISTS outboxprom_example CASCADE`)
	defer pool.Exec(ctx, `DROP SCHEMA IF EXISTS outboxprom_example CASCADE`)
	drv, err := outboxpgx.New(pool, outboxpgx.Config{Schema: "outboxprom_example"})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := drv.MigrateUp(ctx, 0); err != nil {
		log.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	metrics := outboxprom.New(outboxprom.Config{Registerer: reg, Broker: "nats"})
	// MaxAge -1 reads the status on every scrape; the default reuses it for a second.
	reg.MustRegister(outboxprom.NewStatusCollector(drv, outboxprom.StatusConfig{MaxAge: -1}))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})) // usually: http.Handle("/metrics", ...)
	defer srv.Close()

	w, err := outbox.NewWriter(drv, outbox.WriterConfig{})
	if err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return w.Write(ctx, tx, outbox.Message{Topic: "orders", Key: "order-42", Payload: []byte(`{"id":42}`)})
	})
	if err != nil {
		log.Fatal(err)
	}
	scrape(srv.URL, "outbox_pending")

	pub := &outboxtest.Publisher{} // stands in for outboxnats
	relay, err := outbox.NewRelay(drv, pub, outbox.RelayConfig{ID: "relay-1", Observer: metrics,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil {
		log.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := pub.WaitFor(wctx, 1); err != nil {
		log.Fatal(err)
	}
	if err := relay.Stop(wctx); err != nil { // drains: the outcome is recorded
		log.Fatal(err)
	}
	scrape(srv.URL, "outbox_pending", "outbox_published_total", "outbox_relay_up")
	// Output:
	// outbox_pending{topic="orders"} 1
	// outbox_pending{topic="orders"} 0
	// outbox_published_total{broker="nats",relay="relay-1",topic="orders"} 1
	// outbox_relay_up{relay="relay-1"} 0
}

// scrape prints the samples of the metrics named.
func scrape(url string, names ...string) {
	resp, err := http.Get(url)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, _, _ := strings.Cut(sc.Text(), "{")
		for _, n := range names {
			if name == n {
				fmt.Println(sc.Text())
			}
		}
	}
}
