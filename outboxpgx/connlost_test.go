package outboxpgx_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// TestFetchAndCompleteSurviveTerminatedSessions: after pg_terminate_backend of every
// session of the relay's pool (an operator's kill, a failover proxy), the next Fetch,
// FetchSnapshot and Complete succeed at their first call, on new connections, instead of failing once per
// dead connection and making the relay back off each time. The pool never pings a
// connection before use here, as a pool whose connections were used within the last
// second does not.
func TestFetchAndCompleteSurviveTerminatedSessions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	pool, drv, app := taggedDriver(t, b, 4, nil)

	// Fill the pool: four connections, all idle afterwards.
	var conns []*pgxpool.Conn
	for range 4 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`1`)})
	held := leaseAll(t, drv)

	terminate := func() {
		t.Helper()
		var n int
		if err := b.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != int(pool.Stat().IdleConns()) {
			t.Fatalf("terminated %d sessions, the pool has %d idle connections", n, pool.Stat().IdleConns())
		}
	}

	terminate()
	msgs, err := drv.Fetch(ctx, outboxdriver.FetchRequest{RelayID: "r", Leases: held, Limit: 10})
	if err != nil {
		t.Fatalf("Fetch after its sessions were terminated: %v", err)
	}
	if len(msgs) != 1 {
		t.Fatalf("Fetch returned %d messages, want 1", len(msgs))
	}

	// FetchSnapshot, as Fetch.
	terminate()
	msgs, snap, err := drv.FetchSnapshot(ctx, outboxdriver.FetchRequest{RelayID: "r", Leases: held, Limit: 10})
	if err != nil {
		t.Fatalf("FetchSnapshot after its sessions were terminated: %v", err)
	}
	if len(msgs) != 1 || snap.Xmax == 0 {
		t.Fatalf("FetchSnapshot returned %d messages and snapshot %+v, want 1 and a snapshot", len(msgs), snap)
	}

	// Complete: the fetches' new connections and the dead ones left.
	terminate()
	token := map[int]int64{}
	for _, l := range held {
		token[l.Shard] = l.Token
	}
	m := msgs[0]
	refused, err := drv.Complete(ctx, outboxdriver.Completion{RelayID: "r",
		Published: []outboxdriver.Outcome{{Seq: m.Seq, Token: token[m.Shard]}}})
	if err != nil {
		t.Fatalf("Complete after its sessions were terminated: %v", err)
	}
	if len(refused) != 0 {
		t.Fatalf("Complete refused %v", refused)
	}
	if n := b.count(t, "true"); n != 0 {
		t.Fatalf("%d messages still pending after Complete", n)
	}
}

// taggedDriver returns a driver on b's schema over a pool of its own, of at most maxConns
// connections and closed when the test ends, whose sessions carry an application_name
// of their own (returned, to find them in pg_stat_activity). The pool never pings a
// connection before lending it, so a dead one is found by the call that uses it.
func taggedDriver(t *testing.T, b *testBundle, maxConns int32, configure func(*pgxpool.Config)) (*pgxpool.Pool, *outboxpgx.Driver, string) {
	t.Helper()
	var tag [6]byte
	_, _ = rand.Read(tag[:])
	app := "outboxpgx_test_" + hex.EncodeToString(tag[:])
	cfg, err := pgxpool.ParseConfig(testdb.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	if configure != nil {
		configure(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	drv, err := outboxpgx.New(pool, outboxpgx.Config{Schema: b.Schema})
	if err != nil {
		t.Fatal(err)
	}
	return pool, drv, app
}

// leaseAll makes drv take every shard for relay "r", for an hour, and returns its leases.
func leaseAll(t *testing.T, drv *outboxpgx.Driver) []outboxdriver.Lease {
	t.Helper()
	st, err := drv.SyncLeases(context.Background(), outboxdriver.LeaseRequest{RelayID: "r", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return st.Held
}
