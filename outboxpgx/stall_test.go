package outboxpgx_test

import (
	"cmp"
	"context"
	"errors"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testproxy"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// TestStallSilentConnectionReplaced: a Fetch sent while the network to the database
// drops everything, on a connection that afterwards never answers again and is never
// closed, returns its message soon after the network is back, on another connection,
// instead of at its own deadline (or the operating system's TCP timeouts).
func TestStallSilentConnectionReplaced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	proxy, viaProxy := dbProxy(t)
	_, drv, _ := taggedDriver(t, b, 4, viaProxy)
	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`1`)})
	held := leaseAll(t, drv)

	restore := proxy.Silence(t)
	type result struct {
		msgs []*outbox.Message
		err  error
	}
	done := make(chan result, 1)
	fetchCtx, cancel := context.WithTimeout(ctx, testenv.Stall())
	defer cancel()
	go func() {
		msgs, err := drv.Fetch(fetchCtx, outboxdriver.FetchRequest{RelayID: "r", Leases: held, Limit: 10})
		done <- result{msgs, err}
	}()
	// Heal once the fetch is lost on its way.
	if err := testenv.Progress(ctx, "the fetch dropped by the silenced proxy", testenv.Stall(), func() (any, bool) {
		n := proxy.Silenced()
		return n, n > 0
	}); err != nil {
		t.Fatal(err)
	}
	restore()
	healed := time.Now()
	r := <-done
	if r.err != nil {
		t.Fatalf("Fetch on a connection that went silent: %v (%s after the heal)", r.err, time.Since(healed).Round(time.Millisecond))
	}
	if len(r.msgs) != 1 {
		t.Fatalf("Fetch returned %d messages, want 1", len(r.msgs))
	}
	t.Logf("fetch returned %s after the heal", time.Since(healed).Round(time.Millisecond))
	// Sent into the silence, the fetch never reached its session, which the first probe
	// that answers can tell without waiting for the margin.
	if _, unsent := outboxpgx.StallCounts(drv); unsent == 0 {
		t.Fatal("the fetch's connection was not judged as one whose statement never arrived")
	}
}

// TestStallAbandonedSessionTerminated: a relay transaction that holds a lock and gives up
// (cancelled) while the network is silent closes its socket, which the server never
// hears of; once the network is back, the watch terminates the session left behind, and
// the lock is free again (the server alone would keep it until TCP keepalive, hours).
func TestStallAbandonedSessionTerminated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	proxy, viaProxy := dbProxy(t)
	_, drv, _ := taggedDriver(t, b, 2, viaProxy)
	if _, err := drv.MigrateUp(ctx, 0); err != nil {
		t.Fatal(err)
	}
	txCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var pid int32
	var restore func()
	err := outboxpgx.InRelayTx(txCtx, drv, func(q pgsql.Querier) error {
		if err := q.QueryRow(txCtx, "SELECT pg_backend_pid()", nil, &pid); err != nil {
			return err
		}
		if err := q.Exec(txCtx, "LOCK TABLE "+b.Schema+".outbox_migrations IN ACCESS EXCLUSIVE MODE"); err != nil {
			return err
		}
		restore = proxy.Silence(t)
		go func() { // give up once the next statement is lost on its way
			_ = testenv.Progress(ctx, "a statement dropped by the silenced proxy", testenv.Stall(), func() (any, bool) {
				n := proxy.Silenced()
				return n, n > 0
			})
			cancel()
		}()
		return q.Exec(txCtx, "SELECT 1")
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("the transaction given up on: %v; want it cancelled", err)
	}
	restore()
	testenv.AwaitCond(t, "the session given up on terminated", func() bool {
		var n int
		err := b.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n)
		return err == nil && n == 0
	})
	if err := pgx.BeginFunc(ctx, b.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "LOCK TABLE "+b.Schema+".outbox_migrations IN ACCESS EXCLUSIVE MODE NOWAIT")
		return err
	}); err != nil {
		t.Fatalf("the lock of the session given up on: %v", err)
	}
}

// TestStallWaitingForClientLeftAlone: a session that answered and waits for its client
// (between a transaction's statements here; in production also an answer a client
// starved of CPU has not read yet) has not gone silent, however often the watch looks at
// it before the margin: the transaction ends on the connection it began on.
func TestStallWaitingForClientLeftAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	drv, sameConn := oneConnDriver(t, b)
	err := outboxpgx.InRelayTx(ctx, drv, func(q pgsql.Querier) error {
		if err := q.Exec(ctx, "SELECT 1"); err != nil {
			return err
		}
		// Idle in transaction until the watch has judged two probes of the session.
		before, _ := outboxpgx.StallCounts(drv)
		if err := testenv.Progress(ctx, "probes of the idle transaction", testenv.Stall(), func() (any, bool) {
			judged, _ := outboxpgx.StallCounts(drv)
			return judged, judged >= before+2
		}); err != nil {
			return err
		}
		return q.Exec(ctx, "SELECT 1")
	})
	if err != nil {
		t.Fatalf("a transaction waiting for its client: %v", err)
	}
	sameConn("a session that was waiting for its client")
}

// TestStallSlowStatementLeftAlone: a statement that waits on a lock for many probe
// periods is running, not silent: it ends when the lock is let go, on the connection it
// started on.
func TestStallSlowStatementLeftAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	drv, sameConn := oneConnDriver(t, b)

	tx, err := b.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "LOCK TABLE "+b.Schema+".outbox_migrations IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := drv.MigrateUp(ctx, 0)
		done <- err
	}()
	// Hold the lock while MigrateUp waits for it, for several probe periods past the margin.
	var waiting bool
	if err := testenv.Progress(ctx, "MigrateUp waiting for the lock", testenv.Stall(), func() (any, bool) {
		err := b.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND query LIKE '%outbox_migrations%' AND query_start < now() - interval '3 seconds')`).Scan(&waiting)
		return waiting, err != nil || waiting
	}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("MigrateUp after waiting on a lock: %v", err)
	}
	sameConn("a statement waiting on a lock")
}

// dbProxy starts a proxy to the test database, and returns it with a pool option that
// connects through it.
func dbProxy(t *testing.T) (*testproxy.Proxy, func(*pgxpool.Config)) {
	t.Helper()
	u, err := url.Parse(testdb.URL())
	if err != nil {
		t.Fatal(err)
	}
	port := cmp.Or(u.Port(), "5432")
	proxy := testproxy.New(t, net.JoinHostPort(u.Hostname(), port))
	return proxy, func(cfg *pgxpool.Config) {
		host, port, _ := net.SplitHostPort(proxy.Addr())
		p, _ := strconv.Atoi(port)
		cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	}
}

// oneConnDriver returns a driver on a pool of one connection, made already, and a check
// that fails t if the pool has had to make another since: the watch closed the
// connection of what.
func oneConnDriver(t *testing.T, b *testBundle) (*outboxpgx.Driver, func(what string)) {
	t.Helper()
	pool, drv, _ := taggedDriver(t, b, 1, nil)
	if _, err := drv.MigrateUp(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	made := pool.Stat().NewConnsCount()
	return drv, func(what string) {
		t.Helper()
		if n := pool.Stat().NewConnsCount(); n != made {
			t.Fatalf("the pool made %d connections: the watch closed the connection of %s", n-made, what)
		}
	}
}
