package outboxcli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testnats"
	"github.com/outboxkit/outbox/internal/testinfra/testpg"
	"github.com/outboxkit/outbox/outboxpgx"
)

// fleetRelay runs `outbox relay --config config --metrics-addr 127.0.0.1:0` against the
// test database until stop, which returns its exit status (once the test ends at the
// latest).
func fleetRelay(t *testing.T, config string) (log *syncBuffer, stop func() int) {
	t.Helper()
	return fleetRelayAs(t, config, "")
}

// fleetRelayAs is fleetRelay with --relay-id id (none when empty).
func fleetRelayAs(t *testing.T, config, id string) (log *syncBuffer, stop func() int) {
	t.Helper()
	env := map[string]string{"OUTBOX_DATABASE_URL": testdb.URL()}
	if id != "" {
		env["OUTBOX_RELAY_ID"] = id
	}
	return backgroundRelay(t, env, "relay", "--config", config, "--metrics-addr", "127.0.0.1:0")
}

// fleetConfig writes a relay config file that publishes to the NATS stream made for
// the test, with settings (YAML lines) and the outboxes list.
func fleetConfig(t *testing.T, prefix, stream, settings, outboxes string) string {
	return writeFile(t, "outbox.yaml", fmt.Sprintf("broker: %s\nroute: %s{topic}\nnats-create-stream: %s\nlog-format: json\n%soutboxes:\n%s",
		testnats.URL(), prefix, stream, settings, outboxes))
}

// dropAtEnd drops schemas when the test ends.
func dropAtEnd(t *testing.T, b *testBundle, schemas ...string) {
	t.Cleanup(func() {
		ctx, cancel := testenv.CallContext()
		defer cancel()
		for _, s := range schemas {
			_, _ = b.Pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+s+`" CASCADE`)
		}
	})
}

// logAddr returns the addr of the first JSON log line whose msg is msg.
func logAddr(log, msg string) string {
	for _, line := range strings.Split(log, "\n") {
		var rec struct{ Msg, Addr string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == msg {
			return rec.Addr
		}
	}
	return ""
}

// TestRelayFleetDiscoversSchemas: one relay process serves every schema a rule of the
// config file's outboxes list matches: the one there at start, and one created while it
// runs, without a restart. Each outbox's metrics carry its name; a schema dropped while
// it runs stops being served; the process stops cleanly.
func TestRelayFleetDiscoversSchemas(t *testing.T) {
	t.Parallel()
	b := setup(t)
	js := testnats.JetStream(t, "")
	stream, prefix := natsStream(t, js)
	first := b.Schema
	second := first + "_b"
	dropAtEnd(t, b, second)
	must(t, 0, b.env, "migrate", "up")
	b.Write(t, outbox.Message{Topic: "first", Key: "k", Payload: []byte(`a1`)})

	config := fleetConfig(t, prefix, stream, `poll-interval: 50ms
discover-interval: 100ms
`, fmt.Sprintf(`  - schemas: %s*
`, first))
	stderr, stop := fleetRelay(t, config)
	got := streamMessages(t, js, stream, 1)
	if string(got[0].Data) != "a1" || got[0].Subject != prefix+"first" {
		t.Fatalf("first message: %s %q", got[0].Subject, got[0].Data)
	}

	// A tenant created while the relay runs.
	must(t, 0, with(b.env, "OUTBOX_SCHEMA", second), "migrate", "up")
	other := &testdb.DB{Pool: b.Pool, Schema: second}
	other.Write(t, outbox.Message{Topic: "second", Key: "k", Payload: []byte(`b1`)})
	got = streamMessages(t, js, stream, 2)
	if string(got[1].Data) != "b1" || got[1].Subject != prefix+"second" {
		t.Fatalf("second message: %s %q", got[1].Subject, got[1].Data)
	}

	addr := logAddr(stderr.String(), "serving metrics and health checks")
	if addr == "" {
		t.Fatalf("no metrics address in the log:\n%s", stderr.String())
	}
	dbName := strings.TrimPrefix(testdbName(t), "/")
	testenv.Await(t, "both outboxes' published counts in /metrics, and /readyz ready", func() (any, bool) {
		_, _, metrics := httpGet(t, "http://"+addr+"/metrics")
		code, _, ready := httpGet(t, "http://"+addr+"/readyz")
		var seen []string
		for _, name := range []string{dbName + "." + first, dbName + "." + second} {
			if strings.Contains(metrics, `outbox_published_total{broker="nats",outbox="`+name+`"`) {
				seen = append(seen, name)
			}
		}
		return fmt.Sprintf("metrics for %v; readyz %d %s", seen, code, ready), len(seen) == 2 && code == 200
	})

	// A tenant dropped while the relay runs (the DROP may deadlock with the relay's
	// statements, and is then tried again, as an operator would).
	testenv.Await(t, "the second tenant's schema dropped", func() (any, bool) {
		_, err := b.Pool.Exec(context.Background(), `DROP SCHEMA "`+second+`" CASCADE`)
		if err != nil && !strings.Contains(err.Error(), "40P01") {
			t.Fatal(err)
		}
		return err, err == nil
	})
	testenv.Await(t, "the dropped tenant's relay to stop", func() (any, bool) {
		log := stderr.String()
		return lastLines(log, 3), strings.Contains(log, `"msg":"outbox gone: stopping its relay","outbox":"`+dbName+"."+second+`"`)
	})
	testenv.Await(t, "the dropped tenant's series gone from /metrics", func() (any, bool) {
		_, _, metrics := httpGet(t, "http://"+addr+"/metrics")
		left := grepLines(metrics, `outbox="`+dbName+"."+second+`"`)
		return left, left == ""
	})

	if code := stop(); code != 0 {
		t.Fatalf("relay exited %d\nstderr:\n%s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), `"msg":"relay exited cleanly"`) {
		t.Errorf("no clean exit logged:\n%s", stderr.String())
	}
}

// testdbName returns the test database's name.
func testdbName(t *testing.T) string {
	t.Helper()
	cfg, err := (&dbFlags{url: testdb.URL()}).poolConfig("test")
	if err != nil {
		t.Fatal(err)
	}
	return cfg.ConnConfig.Database
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// TestRelayFleetConfigErrors: a mistake in the outboxes list stops the relay before it
// connects, with status 2 and the file's line.
func TestRelayFleetConfigErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, outboxes string
		args           []string
		want           string
	}{
		{"process setting per outbox", "  - schema: a\n    broker: nats://x:4222\n", nil, `outbox.yaml:3: "broker" cannot be set per outbox`},
		{"schema and schemas", "  - schema: a\n    schemas: a*\n", nil, "outbox.yaml:2: an outbox has schema (one) or schemas (a rule), not both"},
		{"listed twice", "  - schema: a\n  - schema: b\n  - schema: a\n", nil, "outbox.yaml:4: the outbox at line 2 already names these tables"},
		{"bad pattern", "  - schemas: 'a['\n", nil, `outbox.yaml:2: schemas: "a[" is not a pattern`},
		{"bad databases pattern", "  - databases: 'a['\n", nil, `outbox.yaml:2: databases: "a[" is not a pattern`},
		{"named rule", "  - databases: shop_*\n    name: shop\n", nil, "outbox.yaml:3: name: a rule finds many outboxes"},
		{"databases of a file", "  - databases: shop_*\n    database-url: sqlite:/tmp/x.db\n", nil, "outbox.yaml:2: databases: shop_*: SQLite has no schemas or databases"},
		{"bad name", "  - schema: a\n    name: 'a b'\n", nil, `outbox.yaml:3: name "a b"`},
		{"name taken", "  - schema: a\n    name: x\n  - schema: b\n    name: x\n", nil, `outbox.yaml:5: name "x" is taken by the outbox at line 2`},
		{"bad value", "  - schema: a\n    max-attempts: lots\n", nil, "outbox.yaml:3: --max-attempts"},
		{"bad schema", "  - schema: 'A-b'\n", nil, "outbox.yaml:2: --schema"},
		{"not a list", "  schema: a\n", nil, `outbox.yaml:2: key "outboxes": want a list`},
		{"console beyond loopback without a token", "  - schema: a\n", []string{"--http-addr", "0.0.0.0:0"}, "is beyond loopback"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			config := filepath.Join(dir, "outbox.yaml")
			if err := os.WriteFile(config, []byte("outboxes:\n"+tc.outboxes), 0o600); err != nil {
				t.Fatal(err)
			}
			args := slices.Concat([]string{"relay", "--config", config, "--database-url", "postgres://u:secret@127.0.0.1:1/db"}, tc.args)
			r := cli(t, nil, args...)
			if r.code != 2 || !strings.Contains(strings.ReplaceAll(r.stderr, config, "outbox.yaml"), tc.want) {
				t.Fatalf("want exit 2 and %q, got %s", tc.want, r)
			}
			if strings.Contains(r.stderr, "secret") {
				t.Errorf("the password is in the output: %s", r.stderr)
			}
		})
	}
}

// TestRelayFleetParksIdleOutboxes: the relay of an outbox that published nothing for
// --park-after stops and gives its shards back; the outbox counts as ready and its
// relay as up meanwhile, and the next write wakes it and is published.
func TestRelayFleetParksIdleOutboxes(t *testing.T) {
	t.Parallel()
	b := migrated(t)
	js := testnats.JetStream(t, "")
	stream, prefix := natsStream(t, js)
	config := fleetConfig(t, prefix, stream, `park-after: 1s
parked-poll-interval: 1h
http-addr: 127.0.0.1:0
`, fmt.Sprintf(`  - schema: %s
    name: solo
`, b.Schema))
	stderr, stop := fleetRelay(t, config)
	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`1`)})
	streamMessages(t, js, stream, 1)

	testenv.Await(t, "the idle outbox's relay to park and give its shards back", func() (any, bool) {
		st := statusJSON(t, b)
		parked := strings.Contains(stderr.String(), `"msg":"outbox idle: relay parked until a message comes"`)
		return fmt.Sprintf("parked %v, %d shards leased", parked, st.ShardsLeased), parked && st.ShardsLeased == 0
	})
	addr := logAddr(stderr.String(), "serving metrics and health checks")
	code, _, ready := httpGet(t, "http://"+addr+"/readyz")
	_, _, metrics := httpGet(t, "http://"+addr+"/metrics")
	up := grepLines(metrics, `outbox_relay_up{outbox="solo"`)
	if code != 200 || up == "" || strings.HasSuffix(up, " 0") {
		t.Fatalf("parked: readyz %d %q; relay_up: %s", code, ready, grepLines(metrics, "outbox_relay_up{"))
	}
	// The web console lists it as parked, and shows its pages.
	console := listeningURL(stderr.String())
	if _, _, body := httpGet(t, console); !strings.Contains(body, `<tr data-outbox="solo">`) || !strings.Contains(body, "<td>parked</td>") {
		t.Errorf("the console's overview of the fleet:\n%s", body)
	}
	if code, _, body := httpGet(t, console+"o/solo/"); code != 200 || !strings.Contains(body, `data-stat="outbox">solo<`) {
		t.Errorf("the console's page of outbox solo: %d\n%s", code, body)
	}

	// The next write wakes it (a notification: the check for messages due runs hourly).
	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`2`)})
	got := streamMessages(t, js, stream, 2)
	if string(got[1].Data) != "2" {
		t.Fatalf("second message %q", got[1].Data)
	}
	if !strings.Contains(stderr.String(), `"msg":"outbox woken: relay starting"`) {
		t.Errorf("no wake logged:\n%s", lastLines(stderr.String(), 10))
	}
	if code := stop(); code != 0 {
		t.Fatalf("relay exited %d\nstderr:\n%s", code, stderr.String())
	}
	if strings.Contains(stderr.String(), `"level":"ERROR"`) {
		t.Errorf("an error was logged:\n%s", stderr.String())
	}
}

// TestRelayFleetTwoProcesses: two relay processes started on one config file, woken
// together by the same writes, publish each outbox's messages once, in key order, however
// they share the outboxes (both relays of an outbox, or one while the other stands by).
func TestRelayFleetTwoProcesses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	js := testnats.JetStream(t, "")
	stream, prefix := natsStream(t, js)
	second := b.Schema + "_b"
	dropAtEnd(t, b, second)
	must(t, 0, b.env, "migrate", "up")
	must(t, 0, with(b.env, "OUTBOX_SCHEMA", second), "migrate", "up")
	config := fleetConfig(t, prefix, stream, `poll-interval: 50ms
lease-ttl: 3s
`, fmt.Sprintf(`  - schemas: %s*
`, b.Schema))
	var logs [2]*syncBuffer
	var stops [2]func() int
	for i := range logs {
		logs[i], stops[i] = fleetRelay(t, config)
	}
	const perOutbox, keys = 300, 10
	dbs := []*testdb.DB{b.DB, {Pool: b.Pool, Schema: second}}
	for i := range perOutbox {
		for o, db := range dbs {
			db.Write(t, outbox.Message{Topic: fmt.Sprintf("o%d", o), Key: fmt.Sprintf("k%d", i%keys), Payload: []byte(fmt.Sprint(i))})
		}
	}
	checkKeyOrder(t, streamMessages(t, js, stream, 2*perOutbox), keys)
	for i, stop := range stops {
		if code := stop(); code != 0 {
			t.Fatalf("relay %d exited %d", i, code)
		}
	}
}

// checkKeyOrder checks that got holds, per subject and key "k<n>" of keys, the payloads
// n, n+keys, n+2*keys ... in that order, each once: message i of an outbox was written
// with key k<i%keys> and payload i.
func checkKeyOrder(t *testing.T, got []*jetstream.RawStreamMsg, keys int) {
	t.Helper()
	next := map[string]int{} // subject/key -> the payload expected next
	for _, m := range got {
		key := m.Header.Get(outbox.HeaderKey)
		k := m.Subject + "/" + key
		want, ok := next[k]
		if !ok {
			_, _ = fmt.Sscanf(key, "k%d", &want)
		}
		if string(m.Data) != fmt.Sprint(want) {
			t.Fatalf("%s: payload %s, want %d (out of order or duplicated)", k, m.Data, want)
		}
		next[k] = want + keys
	}
}

// TestMigrateUpOutboxList: `migrate up` with an outboxes list migrates every outbox of
// it, a rule's matching schemas included, goes on past one that fails, exits 1 naming
// it, and leaves the others at the latest version.
func TestMigrateUpOutboxList(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ruled, declared := b.Schema+"_r1", b.Schema+"_d"
	dropAtEnd(t, b, ruled, declared)
	must(t, 0, with(b.env, "OUTBOX_SCHEMA", ruled), "migrate", "up", "--to", "3")
	config := writeFile(t, "outbox.yaml", fmt.Sprintf(`outboxes:
  - schemas: %s_r*
  - schema: %s
    name: declared
  - schema: unreachable
    database-url: postgres://postgres:hunter2@127.0.0.1:1/test?connect_timeout=2
`, b.Schema, declared))
	env := map[string]string{"OUTBOX_DATABASE_URL": testdb.URL()}
	r := must(t, 1, env, "migrate", "up", "--config", config)
	db := testdbName(t)
	for _, want := range []string{
		"[1/3] " + db + "." + ruled + ": applied 004_",
		"[2/3] declared: applied 001_init",
		"[3/3] " + "test.unreachable: failed: connect to PostgreSQL",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, r)
		}
	}
	if !strings.Contains(r.stderr, "1 of 3 outboxes failed ([test.unreachable]") || strings.Contains(r.stdout+r.stderr, "hunter2") {
		t.Errorf("stderr:\n%s", r)
	}
	for _, s := range []string{ruled, declared} {
		if r := must(t, 0, with(b.env, "OUTBOX_SCHEMA", s), "migrate", "up"); !strings.Contains(r.stdout, "is up to date") {
			t.Errorf("%s not at the latest version: %s", s, r)
		}
	}
}

// TestStatusOutboxList: `status` with an outboxes list shows one line per outbox, worst
// first; --outbox (or OUTBOX_OUTBOX) picks one outbox of the list for any command;
// --json gives the lines as JSON.
func TestStatusOutboxList(t *testing.T) {
	t.Parallel()
	b := migrated(t)
	quiet := b.Schema + "_q"
	dropAtEnd(t, b, quiet)
	must(t, 0, with(b.env, "OUTBOX_SCHEMA", quiet), "migrate", "up")
	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`1`)}, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`2`)})
	config := writeFile(t, "outbox.yaml", fmt.Sprintf("outboxes:\n  - schema: %s\n    name: quiet\n  - schema: %s\n    name: busy\n", quiet, b.Schema))
	env := map[string]string{"OUTBOX_DATABASE_URL": testdb.URL()}

	r := must(t, 0, env, "status", "--config", config)
	lines := strings.Split(r.stdout, "\n")
	if len(lines) < 3 || !strings.HasPrefix(lines[1], "busy ") || !strings.HasPrefix(lines[2], "quiet ") ||
		!strings.Contains(lines[1], " 2 ") || !strings.Contains(r.stdout, "2 outboxes, worst first") {
		t.Fatalf("overview:\n%s", r)
	}
	r = must(t, 0, env, "status", "--config", config, "--outbox", "busy")
	if !strings.Contains(r.stdout, "due and no relay holds a shard") {
		t.Errorf("busy's status lacks its warning:\n%s", r)
	}
	r = must(t, 0, env, "status", "--config", config, "--json")
	var got []struct {
		Name   string
		Status struct{ Pending int }
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got) != 2 || got[0].Name != "busy" || got[0].Status.Pending != 2 {
		t.Errorf("--json: %v %+v\n%s", err, got, r.stdout)
	}
	// --outbox works for every command that takes an outbox.
	r = must(t, 0, with(env, "OUTBOX_OUTBOX", "quiet"), "migrate", "status", "--config", config)
	if !strings.Contains(r.stdout, "wake_gate            yes") {
		t.Errorf("migrate status of quiet:\n%s", r)
	}
	r = must(t, 2, env, "status", "--config", config, "--outbox", "nope")
	if !strings.Contains(r.stderr, `no outbox "nope"`) {
		t.Errorf("unknown outbox: %s", r)
	}
}

// TestRelayFleetDatabaseRestart: a fleet's database restarts while its outboxes are
// served, some parked and some running, all on the database's one listening session.
// Every message written before and after reaches the broker, each from its own outbox,
// and the parked outboxes are woken by writes after the restart (the watch's session is
// made again).
func TestRelayFleetDatabaseRestart(t *testing.T) {
	t.Parallel()
	srv := testpg.StartServer(t)
	schemas := []string{"tenant_a", "tenant_b", "tenant_c"}
	for _, s := range schemas {
		must(t, 0, map[string]string{"OUTBOX_DATABASE_URL": srv.URL(), "OUTBOX_SCHEMA": s}, "migrate", "up")
	}
	pool := testdb.PoolAt(t, srv.URL())
	js := testnats.JetStream(t, "")
	stream, prefix := natsStream(t, js)
	config := fleetConfig(t, prefix, stream, "poll-interval: 50ms\npark-after: 1s\nparked-poll-interval: 1s\n",
		fmt.Sprintf("  - schemas: tenant_*\n    database-url: %s\n", srv.URL()))
	log, _ := fleetRelay(t, config)

	writers := map[string]*outbox.Writer[pgx.Tx]{}
	for _, s := range schemas {
		drv, err := outboxpgx.New(pool, outboxpgx.Config{Schema: s})
		if err != nil {
			t.Fatal(err)
		}
		if writers[s], err = outbox.NewWriter(drv, outbox.WriterConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	// write writes n messages into each of outboxes, its schema as their topic, once the
	// database takes them.
	sent := map[string]int{}
	write := func(n int, outboxes ...string) {
		t.Helper()
		for _, s := range outboxes {
			for range n {
				msg := outbox.Message{Topic: s, Key: "k", Payload: fmt.Appendf(nil, "%s-%d", s, sent[s])}
				testenv.Await(t, "a write into "+s, func() (any, bool) {
					ctx, cancel := testenv.CallContext()
					defer cancel()
					err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return writers[s].Write(ctx, tx, msg) })
					return err, err == nil
				})
				sent[s]++
			}
		}
	}
	check := func(n int) {
		t.Helper()
		got := streamMessages(t, js, stream, n)
		seen := map[string]bool{}
		for _, m := range got {
			schema, _, _ := strings.Cut(string(m.Data), "-")
			if m.Subject != prefix+schema {
				t.Errorf("message %q of %s reached %s", m.Data, schema, m.Subject)
			}
			seen[string(m.Data)] = true
		}
		if len(seen) != n {
			t.Fatalf("%d distinct messages in the stream, want %d", len(seen), n)
		}
	}

	write(5, schemas...)
	check(15)
	testenv.AwaitCond(t, "an outbox parked after --park-after", func() bool {
		return strings.Contains(log.String(), "outbox idle: relay parked")
	})
	write(5, "tenant_a") // running at the restart, the others parked or parking
	srv.Restart(testpg.Fast)
	write(5, schemas...)
	check(35)
}

// TestRelayFleetDiscoversDatabases: a databases: rule serves the outbox (schema app) of
// every database of the server whose name matches, and of one created while the relay
// runs; a matching database without the outbox is passed over, and one dropped while
// the relay runs is released. migrate up and status with the file cover the same
// outboxes.
func TestRelayFleetDiscoversDatabases(t *testing.T) {
	t.Parallel()
	admin := testdb.Pool(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	stem := "fleetdb_" + hex.EncodeToString(b[:])
	create := func(suffix string, withOutbox bool) (url string, w *outbox.Writer[pgx.Tx], pool *pgxpool.Pool) {
		t.Helper()
		url = testdb.NewDatabase(t, testdb.URL(), stem+"_"+suffix)
		if !withOutbox {
			return url, nil, nil
		}
		must(t, 0, map[string]string{"OUTBOX_DATABASE_URL": url, "OUTBOX_SCHEMA": "app"}, "migrate", "up")
		pool = testdb.PoolAt(t, url)
		drv, err := outboxpgx.New(pool, outboxpgx.Config{Schema: "app"})
		if err != nil {
			t.Fatal(err)
		}
		if w, err = outbox.NewWriter(drv, outbox.WriterConfig{}); err != nil {
			t.Fatal(err)
		}
		return url, w, pool
	}
	write := func(w *outbox.Writer[pgx.Tx], pool *pgxpool.Pool, topic string) {
		t.Helper()
		ctx, cancel := testenv.CallContext()
		defer cancel()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return w.Write(ctx, tx, outbox.Message{Topic: topic, Key: "k", Payload: []byte(topic)})
		}); err != nil {
			t.Fatal(err)
		}
	}
	_, wa, pa := create("a", true)
	_, wb, pb := create("b", true)
	create("d", false) // matches, holds no outbox
	js := testnats.JetStream(t, "")
	stream, prefix := natsStream(t, js)
	config := fleetConfig(t, prefix, stream, "poll-interval: 50ms\ndiscover-interval: 100ms\npark-after: -1\n",
		fmt.Sprintf("  - databases: %s_*\n    schema: app\n", stem))

	env := map[string]string{"OUTBOX_DATABASE_URL": testdb.URL()}
	status := must(t, 0, env, "status", "--config", config)
	for _, name := range []string{stem + "_a.app", stem + "_b.app"} {
		if !strings.Contains(status.stdout, name) {
			t.Errorf("status does not list %s:\n%s", name, status.stdout)
		}
	}
	if strings.Contains(status.stdout, stem+"_d") {
		t.Errorf("status lists the database without an outbox:\n%s", status.stdout)
	}

	migrated := must(t, 0, env, "migrate", "up", "--config", config)
	if !strings.Contains(migrated.stdout, "[2/2] "+stem+"_b.app") {
		t.Errorf("migrate up does not go through both outboxes:\n%s", migrated.stdout)
	}

	log, stop := fleetRelay(t, config)
	write(wa, pa, "a")
	write(wb, pb, "b")
	check := func(n int) map[string]bool {
		t.Helper()
		seen := map[string]bool{}
		for _, m := range streamMessages(t, js, stream, n) {
			if m.Subject != prefix+string(m.Data) {
				t.Errorf("message %q reached %s", m.Data, m.Subject)
			}
			seen[string(m.Data)] = true
		}
		return seen
	}
	if seen := check(2); !seen["a"] || !seen["b"] {
		t.Fatalf("delivered %v, want a and b", seen)
	}
	// The database without an outbox is searched on a connection closed after, not
	// kept as a pool and a listening session.
	testenv.Await(t, "no session left on the database without an outbox", func() (any, bool) {
		var n int
		if err := admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, stem+"_d").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("%d sessions", n), n == 0
	})

	// A database created (and its outbox made) while the relay runs.
	_, wc, pc := create("c", true)
	write(wc, pc, "c")
	if seen := check(3); !seen["c"] {
		t.Fatalf("delivered %v, want c too", seen)
	}

	// A database dropped while the relay runs.
	pb.Close()
	if _, err := admin.Exec(context.Background(), "DROP DATABASE "+stem+"_b WITH (FORCE)"); err != nil {
		t.Fatal(err)
	}
	testenv.Await(t, "the dropped database's relay to stop", func() (any, bool) {
		l := log.String()
		return lastLines(l, 3), strings.Contains(l, `"msg":"outbox gone: stopping its relay","outbox":"`+stem+`_b.app"`)
	})
	if code := stop(); code != 0 {
		t.Fatalf("relay exited %d\nstderr:\n%s", code, log.String())
	}
}

// TestFleetRetryCap: an outbox whose database was out of reach is tried again within
// seconds once the backoff has grown; one that failed otherwise (not migrated) waits
// up to a minute.
func TestFleetRetryCap(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want time.Duration
	}{
		{fmt.Errorf("connect to PostgreSQL at x: %w", &pgconn.ConnectError{}), fleetReconnectMax},
		{fmt.Errorf("check: %w", context.DeadlineExceeded), fleetReconnectMax},
		{&net.OpError{Op: "dial", Err: os.ErrDeadlineExceeded}, fleetReconnectMax},
		{errors.New("the outbox schema is not migrated: run 'outbox migrate up'"), fleetRetryMax},
	} {
		if got := retryCap(tc.err); got != tc.want {
			t.Errorf("retryCap(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestRelayFleetMetricsBound: past --metrics-max-outboxes an outbox is served without
// series of its own; outbox_fleet_outboxes counts every outbox by state, and
// outbox_fleet_outboxes_without_metrics the ones without.
func TestRelayFleetMetricsBound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	js := testnats.JetStream(t, "")
	stream, prefix := natsStream(t, js)
	first, second := b.Schema, b.Schema+"_b"
	dropAtEnd(t, b, second)
	must(t, 0, b.env, "migrate", "up")
	must(t, 0, with(b.env, "OUTBOX_SCHEMA", second), "migrate", "up")
	config := fleetConfig(t, prefix, stream, "poll-interval: 50ms\nmetrics-max-outboxes: 1\n", fmt.Sprintf("  - schemas: %s*\n", first))
	stderr, _ := fleetRelay(t, config)
	b.Write(t, outbox.Message{Topic: "a", Key: "k", Payload: []byte(`a`)})
	(&testdb.DB{Pool: b.Pool, Schema: second}).Write(t, outbox.Message{Topic: "b", Key: "k", Payload: []byte(`b`)})
	streamMessages(t, js, stream, 2)

	testenv.Await(t, "the metrics address in the log", func() (any, bool) {
		return lastLines(stderr.String(), 2), logAddr(stderr.String(), "serving metrics and health checks") != ""
	})
	addr := logAddr(stderr.String(), "serving metrics and health checks")
	testenv.Await(t, "one outbox's series, and the fleet's counts", func() (any, bool) {
		_, _, metrics := httpGet(t, "http://"+addr+"/metrics")
		labels := map[string]bool{}
		for _, line := range strings.Split(metrics, "\n") {
			if rest, ok := strings.CutPrefix(line, "outbox_published_total{"); ok {
				if _, after, ok := strings.Cut(rest, `outbox="`); ok {
					name, _, _ := strings.Cut(after, `"`)
					labels[name] = true
				}
			}
		}
		ok := len(labels) == 1 && strings.Contains(metrics, "outbox_fleet_outboxes_without_metrics 1") &&
			strings.Contains(metrics, `outbox_fleet_outboxes{state="running"} 2`)
		return fmt.Sprintf("outboxes with series %v; fleet lines:\n%s", labels, grepLines(metrics, "outbox_fleet_")), ok
	})
}

// TestRelayFleetStandby: two processes serve three outboxes that trickle. Once settled,
// each outbox is served by one relay, which holds every shard: the other process stands
// by, costing the outbox's writers no notification. When a process stops, the other
// takes its outboxes over, and every message is published once, in order.
func TestRelayFleetStandby(t *testing.T) {
	t.Parallel()
	b := setup(t)
	js := testnats.JetStream(t, "")
	stream, prefix := natsStream(t, js)
	schemas := []string{b.Schema, b.Schema + "_b", b.Schema + "_c"}
	dropAtEnd(t, b, schemas[1:]...)
	var dbs []*testdb.DB
	for _, s := range schemas {
		must(t, 0, with(b.env, "OUTBOX_SCHEMA", s), "migrate", "up")
		dbs = append(dbs, &testdb.DB{Pool: b.Pool, Schema: s})
	}
	// park-after is long: the relay serving the first outbox must not park while the
	// backlog is written (its last trickle may be seconds old by then on a loaded
	// machine), or the process standing by parks too and the backlog wakes them instead.
	// The lease TTL is the default: the processes stop gracefully, giving their leases
	// back, and a lease round may take up to a third of it before it counts as failed
	// (an error the test does not expect), which a loaded machine reached with 3 s.
	config := fleetConfig(t, prefix, stream, `poll-interval: 50ms
park-after: 1m
parked-poll-interval: 200ms
`, fmt.Sprintf(`  - schemas: %s*
`, b.Schema))
	ids := []string{"p0", "p1"}
	var logs [2]*syncBuffer
	var stops [2]func() int
	for i := range logs {
		logs[i], stops[i] = fleetRelayAs(t, config, ids[i])
	}
	sent := 0
	trickle := func() {
		for o, db := range dbs {
			db.Write(t, outbox.Message{Topic: fmt.Sprintf("o%d", o), Key: "k0", Payload: []byte(fmt.Sprint(sent))})
		}
		sent++
	}
	// served reports whether each outbox is served by one relay, the preferred one of
	// the processes running (ids), holding every shard.
	served := func(ids ...string) (seen []string, one bool) {
		one = true
		for _, s := range schemas {
			st := statusJSON(t, &testBundle{env: with(b.env, "OUTBOX_SCHEMA", s)})
			var live []string
			for _, r := range st.Relays {
				if r.Live {
					live = append(live, r.ID)
				}
			}
			slices.Sort(live) // the same set must read the same: a stall is no change
			seen = append(seen, fmt.Sprintf("%s: live %v, %d shards leased", s, live, st.ShardsLeased))
			one = one && slices.Equal(live, []string{preferredOf(testdbName(t)+"."+s, ids)}) && st.ShardsLeased == 64
		}
		return seen, one
	}
	testenv.Await(t, "each outbox served by its preferred relay alone, holding every shard", func() (any, bool) {
		trickle()
		return served(ids...)
	})
	// Standing by is being served: ready, and counted as such.
	standby := ""
	for i := range logs {
		addr := logAddr(logs[i].String(), "serving metrics and health checks")
		if code, _, ready := httpGet(t, "http://"+addr+"/readyz"); code != 200 {
			t.Errorf("process %d not ready: %s", i, ready)
		}
		_, _, metrics := httpGet(t, "http://"+addr+"/metrics")
		standby += grepLines(metrics, `outbox_fleet_outboxes{state="standby"}`)
	}
	if !strings.Contains(standby, `standby"} 1`) && !strings.Contains(standby, `standby"} 2`) && !strings.Contains(standby, `standby"} 3`) {
		t.Errorf("no outbox counted standing by: %q\n%s\n%s", standby, lastLines(logs[0].String(), 20), lastLines(logs[1].String(), 20))
	}

	// A backlog in the first outbox: 20,000 messages over 100 keys, committed a second
	// and more after they were written (so that they have waited). The process standing
	// by for it starts its relay too.
	const backlog, backlogKeys = 20000, 100
	msgs := make([]outbox.Message, backlog)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "bl", Key: fmt.Sprintf("k%d", i%backlogKeys), Payload: []byte(fmt.Sprint(i))}
	}
	ctx := testenv.Context(t)
	if err := pgx.BeginFunc(ctx, b.Pool, func(tx pgx.Tx) error {
		if err := dbs[0].Writer.Write(ctx, tx, msgs...); err != nil { // made by the trickle
			return err
		}
		_, err := tx.Exec(ctx, "SELECT pg_sleep(1.2)")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("process 0's log ends:\n%s\nprocess 1's:\n%s", lastLines(logs[0].String(), 30), lastLines(logs[1].String(), 30))
		}
	})
	testenv.Await(t, "a process standing by to help with the backlog", func() (any, bool) {
		helped := strings.Contains(logs[0].String()+logs[1].String(), `"msg":"outbox has a backlog: relay starting beside the other processes'"`)
		return helped, helped
	})

	if code := stops[0](); code != 0 {
		t.Fatalf("relay 0 exited %d", code)
	}
	testenv.Await(t, "the other process to serve every outbox", func() (any, bool) {
		trickle()
		return served(ids[1])
	})
	// Started again, the first process takes back the outboxes it is preferred for.
	logs[0], stops[0] = fleetRelayAs(t, config, ids[0])
	testenv.Await(t, "the outboxes shared again between the two", func() (any, bool) {
		trickle()
		return served(ids...)
	})
	var trickled, backlogged []*jetstream.RawStreamMsg
	for _, m := range streamMessages(t, js, stream, len(schemas)*sent+backlog) {
		if strings.HasSuffix(m.Subject, ".bl") {
			backlogged = append(backlogged, m)
		} else {
			trickled = append(trickled, m)
		}
	}
	checkKeyOrder(t, trickled, 1)
	checkKeyOrder(t, backlogged, backlogKeys)
	if code := stops[1](); code != 0 {
		t.Fatalf("relay 1 exited %d", code)
	}
	if code := stops[0](); code != 0 {
		t.Fatalf("relay 0 exited %d", code)
	}
	for i := range logs {
		if strings.Contains(logs[i].String(), `"level":"ERROR"`) {
			t.Errorf("process %d logged an error:\n%s", i, logs[i].String())
		}
	}
}

// preferredOf returns the relay of ids preferred for the outbox named name.
func preferredOf(name string, ids []string) string {
	for _, id := range ids {
		if preferred(name, id, slices.DeleteFunc(slices.Clone(ids), func(o string) bool { return o == id })) {
			return id
		}
	}
	return ""
}

// TestPreferred: rendezvous hashing gives each of three relays a fair share of 3,000
// outboxes, and when one leaves only its outboxes move.
func TestPreferred(t *testing.T) {
	t.Parallel()
	ids := []string{"host-a-1-abc", "host-b-7-def", "host-c-3-012"}
	count := map[string]int{}
	for i := range 3000 {
		name := fmt.Sprintf("app.tenant_%05d", i)
		w := preferredOf(name, ids)
		count[w]++
		if w2 := preferredOf(name, ids[:2]); w != ids[2] && w2 != w {
			t.Fatalf("%s moved from %s to %s when %s left", name, w, w2, ids[2])
		}
	}
	for _, id := range ids {
		if n := count[id]; n < 850 || n > 1150 {
			t.Errorf("%s is preferred for %d of 3,000 outboxes: %v", id, n, count)
		}
	}
}
