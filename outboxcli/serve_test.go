package outboxcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testnats"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxsqlite"
)

// opsGet returns the status and body of a GET, or 0 and the error's text.
func opsGet(t *testing.T, u string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: testenv.Stall()} // bounds a hang
	resp, err := c.Get(u)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err.Error()
	}
	return resp.StatusCode, string(body)
}

// TestRelayMetricsAndHealth runs `outbox relay --metrics-addr` against PostgreSQL and a
// private NATS server, both reached with a password, and checks the endpoints through
// the relay's life: not ready until its first lease round (held back here by a lock),
// ready with its shards, metrics moving with a publish, not ready while the broker is
// down and ready again once it is back, gone after the relay exits. No password appears
// in any response or in the log.
func TestRelayMetricsAndHealth(t *testing.T) {
	t.Parallel()
	b := migrated(t)
	nsrv := testnats.StartServer(t)
	const natsPassword = "natsSecretPw-7Qx"
	natsURL := strings.Replace(nsrv.URL(), "nats://", "nats://relay:"+natsPassword+"@", 1)
	js := testnats.JetStream(t, nsrv.URL())
	stream, prefix := natsStream(t, js)

	// The database URL with a password: the test server trusts loopback connections, so
	// any password is accepted; one already in OUTBOX_TEST_DATABASE_URL is used as is.
	dbURL, err := url.Parse(testdb.URL())
	if err != nil {
		t.Fatal(err)
	}
	dbPassword, has := dbURL.User.Password()
	if !has {
		dbPassword = "dbSecretPw-3Zr"
		dbURL.User = url.UserPassword(dbURL.User.Username(), dbPassword)
	}
	// The default lease TTL (15 s): a renewal may take a third of it, and a short TTL on a
	// loaded machine could lose and retake the leases, which the exact shards_gained_total
	// below would take for a bug.
	env := with(b.env, "OUTBOX_DATABASE_URL", dbURL.String(), "OUTBOX_POLL_INTERVAL", "50ms",
		"OUTBOX_METRICS_ADDR", "127.0.0.1:0")

	// An uncommitted row of the relay's id in the relays table makes its first lease round
	// (whose heartbeat inserts that row) wait until this transaction ends.
	ctx := context.Background()
	lock, err := b.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx)
	if _, err := lock.Exec(ctx, `INSERT INTO "`+b.Schema+`".outbox_relays (id, expires_at) VALUES ('obs-relay', now() + interval '1 minute')`); err != nil {
		t.Fatal(err)
	}

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(rctx, []string{"relay", "--broker", natsURL, "--route", prefix + "{topic}",
			"--nats-create-stream", stream, "--log-format", "json", "--relay-id", "obs-relay"},
			func(k string) string { return env[k] }, &stdout, &stderr)
	}()
	exited := false
	defer func() {
		if !exited {
			cancel()
			testenv.AwaitRecv(t, "the relay to stop", done)
		}
	}()

	var base string
	addrLine := regexp.MustCompile(`"msg":"serving metrics and health checks","addr":"([^"]+)"`)
	testenv.AwaitCond(t, "the metrics server's address in the log", func() bool {
		if m := addrLine.FindStringSubmatch(stderr.String()); m != nil {
			base = "http://" + m[1]
		}
		return base != ""
	})
	var seen []string // every response body, checked for secrets at the end
	get := func(path string) (int, string) {
		code, body := opsGet(t, base+path)
		seen = append(seen, body)
		return code, body
	}
	waitReady := func(what string, want int, wantText string) string {
		t.Helper()
		var code int
		var body string
		testenv.Await(t, what, func() (any, bool) {
			code, body = get("/readyz")
			return fmt.Sprintf("%d %q", code, body), code == want && strings.Contains(body, wantText)
		})
		return body
	}

	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	waitReady("not ready: waiting for the first lease round", 503, "not ready: no lease round completed yet")
	if _, body := get("/metrics"); !strings.Contains(body, `outbox_shards_held{relay="obs-relay"} 0`) {
		t.Errorf("before its first lease round the relay should hold 0 shards:\n%s", grepLines(body, "outbox_shards"))
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if body := waitReady("ready once the leases are taken", 200, "ready: holds 64 of 64 shards"); body != "ready: holds 64 of 64 shards (fair share 64, 1 live relays)\n" {
		t.Errorf("/readyz: %q", body)
	}

	b.Write(t, outbox.Message{Topic: "orders", Key: "o-1", Payload: []byte(`{}`)})
	// (The status figures may lag a scrape behind: they are read at most once a second.)
	wantMetrics := []string{
		`outbox_published_total{broker="nats",relay="obs-relay",topic="orders"} 1`,
		`outbox_relay_up{relay="obs-relay"} 1`,
		`outbox_shards_held{relay="obs-relay"} 64`,
		`outbox_shards_gained_total{relay="obs-relay"} 64`,
		`outbox_publish_latency_seconds_count{relay="obs-relay",topic="orders"} 1`,
		`outbox_status_up 1`,
		`outbox_shards_leased 64`,
		`outbox_relays_live 1`,
		"go_goroutines ",
		"process_start_time_seconds ",
	}
	var metrics string
	if err := testenv.Progress(context.Background(), "/metrics to show the publish", testenv.Stall(), func() (any, bool) {
		_, metrics = get("/metrics")
		missing := slices.DeleteFunc(slices.Clone(wantMetrics), func(w string) bool { return strings.Contains(metrics, w) })
		return fmt.Sprintf("lacks %q", missing), len(missing) == 0
	}); err != nil {
		t.Fatalf("%v:\n%s", err, grepLines(metrics, "outbox_"))
	}

	nsrv.Stop()
	waitReady("not ready while the broker is down", 503, "not ready: broker unreachable")
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz while the broker is down: %d", code)
	}
	nsrv.Start()
	waitReady("ready once the broker is back", 200, "ready: holds 64")

	cancel()
	code := testenv.AwaitRecv(t, "the relay to stop after its context ended", done)
	exited = true // its status is received: the deferred wait must not wait for another
	if code != 0 {
		t.Fatalf("relay exited %d\n%s", code, stderr.String())
	}
	if code, body := opsGet(t, base+"/healthz"); code != 0 {
		t.Errorf("the server still answers after the relay exited: %d %q", code, body)
	}

	logs := stderr.String()
	for _, want := range []string{`"msg":"not ready: broker unreachable"`, `"msg":"ready"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log lacks %s", want)
		}
	}
	for _, secret := range []string{dbPassword, natsPassword} {
		for _, body := range seen {
			if strings.Contains(body, secret) {
				t.Errorf("a response shows the password %q:\n%s", secret, body)
			}
		}
		if strings.Contains(logs, secret) || strings.Contains(stdout.String(), secret) {
			t.Errorf("the output shows the password %q", secret)
		}
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestMetricsAddrRejectedBeforeConnecting(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OUTBOX_DATABASE_URL": unreachableDB}
	for _, addr := range []string{"9187", "localhost:port-of-call", "[::1"} {
		r := cli(t, env, "relay", "--metrics-addr", addr)
		if r.code != 2 || !strings.Contains(errorLine(r.stderr), "--metrics-addr") {
			t.Errorf("--metrics-addr %q: want exit 2 naming the flag, got %s", addr, r)
		}
	}
	// A taken address fails at once, before connecting, with status 1.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	r := cli(t, env, "relay", "--metrics-addr", ln.Addr().String())
	if r.code != 1 || !strings.Contains(errorLine(r.stderr), "--metrics-addr") || strings.Contains(r.stderr, "connect to PostgreSQL") {
		t.Errorf("--metrics-addr on a taken port: want exit 1 before connecting, got %s", r)
	}
}

// TestReadiness checks each answer of /readyz against the relay's state, without a
// database: the phases, a failing check (whose error stays out of the response and goes
// to the log once), and the lease rounds.
func TestReadiness(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	r := newReadiness(slog.New(slog.NewTextHandler(&logs, nil)))
	answer := func() (int, string) {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
		return rec.Code, rec.Body.String()
	}
	expect := func(wantCode int, wantBody string) {
		t.Helper()
		if code, body := answer(); code != wantCode || body != wantBody {
			t.Errorf("/readyz: %d %q, want %d %q", code, body, wantCode, wantBody)
		}
	}
	expect(503, "not ready: starting: connecting to the database and the broker\n")

	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	w := &leaseWatch{ttl: 15 * time.Second, now: func() time.Time { return now }}
	brokerErr := errors.New("dial tcp 10.0.0.7:4222: connection refused (user relay, password hunter2-secret)")
	var brokerDown bool
	r.running(w,
		readyCheck{name: "database", check: func(context.Context) error { return nil }},
		readyCheck{name: "broker", check: func(context.Context) error {
			if brokerDown {
				return brokerErr
			}
			return nil
		}})
	expect(503, "not ready: no lease round completed yet\n")

	set := func(synced time.Time, held, live, target int, released bool) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.synced, w.released = synced, released
		w.state = outboxdriver.LeaseState{Shards: 64, Live: live, Target: target}
		for i := range held {
			w.state.Held = append(w.state.Held, outboxdriver.Lease{Shard: i})
		}
	}
	set(now, 32, 2, 32, false)
	expect(200, "ready: holds 32 of 64 shards (fair share 32, 2 live relays)\n")
	set(now, 0, 70, 1, false)
	expect(200, "ready: standby: every shard is leased by the other relays (70 live relays, 64 shards)\n")
	set(now, 0, 1, 0, false)
	w.state.GiveWay = []outboxdriver.Peer{{ID: "old-1", Fingerprint: "f-old", Holds: true}, {ID: "old-2", Fingerprint: "f-old", Holds: true}}
	expect(200, "ready: standby: relays old-1, old-2 hold the shards under other destinations and routing (fingerprint f-old); this relay takes them once those stop\n")
	set(now.Add(-15*time.Second), 32, 2, 32, false)
	expect(200, "ready: holds 32 of 64 shards (fair share 32, 2 live relays)\n")
	set(now.Add(-16*time.Second), 32, 2, 32, false)
	expect(503, "not ready: no successful lease round for 16s (longer than the lease TTL, 15s)\n")

	set(now, 32, 2, 32, false)
	brokerDown = true
	expect(503, "not ready: broker unreachable\n")
	expect(503, "not ready: broker unreachable\n")
	brokerDown = false
	expect(200, "ready: holds 32 of 64 shards (fair share 32, 2 live relays)\n")
	if n := strings.Count(logs.String(), "not ready: broker unreachable"); n != 1 {
		t.Errorf("the broker failure logged %d times, want once:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "connection refused") {
		t.Errorf("the log lacks the broker's error:\n%s", logs.String())
	}

	set(now, 0, 1, 64, true)
	expect(503, "not ready: leases given back: stopping\n")
	r.stopping()
	expect(503, "not ready: stopping\n")
}

// TestServerTimeouts: the metrics and console servers bound every phase of a request, so
// a client that sends slowly or never reads cannot hold a connection open.
func TestServerTimeouts(t *testing.T) {
	srv := newServer(http.NotFoundHandler(), slog.New(slog.DiscardHandler))
	for name, d := range map[string]time.Duration{"ReadHeaderTimeout": srv.ReadHeaderTimeout, "ReadTimeout": srv.ReadTimeout,
		"WriteTimeout": srv.WriteTimeout, "IdleTimeout": srv.IdleTimeout} {
		if d <= 0 {
			t.Errorf("%s is %v: unbounded", name, d)
		}
	}
}

// TestLeaseWatchKeepsOptionalInterfaces: the readiness wrapper hides none of the store's
// optional interfaces from the relay (PostgreSQL's LISTEN, maintenance, pending ring),
// and adds none to a store without them.
func TestLeaseWatchKeepsOptionalInterfaces(t *testing.T) {
	pg, err := outboxpgx.New(nil, outboxpgx.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s := newLeaseWatch(pg, time.Second).store()
	_, lis := s.(outboxdriver.Listener)
	_, mnt := s.(outboxdriver.Maintainer)
	_, rec := s.(outboxdriver.Recycler)
	if !lis || !mnt || !rec {
		t.Errorf("PostgreSQL behind the lease watch: Listener %v, Maintainer %v, Recycler %v", lis, mnt, rec)
	}
	lite, err := outboxsqlite.New(nil, outboxsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := newLeaseWatch(lite, time.Second).store().(outboxdriver.Listener); ok {
		t.Error("SQLite behind the lease watch claims LISTEN")
	}
}
