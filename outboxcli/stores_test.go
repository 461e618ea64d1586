package outboxcli

import (
	"context"
	"database/sql"
	"encoding/json"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testmysql"
	"github.com/outboxkit/outbox/internal/testinfra/testnats"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
	"github.com/outboxkit/outbox/outboxsqlite"
)

// TestCommandsOnEveryStore runs the operator's commands on the stores other than
// PostgreSQL (whose tests are the rest of this package), chosen by the URL's scheme:
// migrate up and status, a relay that publishes two messages and dead-letters a third,
// status, dead list and replay, and migrate down.
func TestCommandsOnEveryStore(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "app.db")
		commandsOnStore(t, "sqlite://"+path, func(t *testing.T) (*sql.DB, outboxdriver.WriteDriver[*sql.Tx]) {
			db, err := outboxsqlite.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			drv, err := outboxsqlite.New(db, outboxsqlite.Config{Prefix: "app_"})
			if err != nil {
				t.Fatal(err)
			}
			return db, drv
		})
	})
	t.Run("mysql", func(t *testing.T) {
		t.Parallel()
		dsn := testmysql.NewDatabase(t)
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		u := url.URL{Scheme: "mysql", User: url.UserPassword(cfg.User, cfg.Passwd), Host: cfg.Addr, Path: "/" + cfg.DBName}
		commandsOnStore(t, u.String(), func(t *testing.T) (*sql.DB, outboxdriver.WriteDriver[*sql.Tx]) {
			db := testmysql.Open(t, dsn)
			drv, err := outboxmysql.New(db, outboxmysql.Config{Prefix: "app_"})
			if err != nil {
				t.Fatal(err)
			}
			return db, drv
		})
	})
}

func commandsOnStore(t *testing.T, dbURL string, open func(*testing.T) (*sql.DB, outboxdriver.WriteDriver[*sql.Tx])) {
	env := map[string]string{"OUTBOX_DATABASE_URL": dbURL, "OUTBOX_PREFIX": "app_"}
	status := func() outboxdriver.Status {
		t.Helper()
		var st outboxdriver.Status
		if err := json.Unmarshal([]byte(must(t, 0, env, "status", "--json").stdout), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}

	// Before migrating, the commands say so (and SQLite creates no file).
	if r := must(t, 1, env, "status"); !strings.Contains(r.stderr, "migrate up") {
		t.Fatalf("status before migrate up: %s", r)
	}
	must(t, 2, env, "partitions", "list")
	must(t, 2, with(env, "OUTBOX_SCHEMA", "other"), "status")
	if r := must(t, 0, env, "migrate", "up"); !strings.Contains(r.stdout, "applied 004_priority") {
		t.Fatalf("migrate up: %s", r)
	}
	if r := must(t, 0, env, "migrate", "status"); strings.Count(r.stdout, "yes") != 4 {
		t.Fatalf("migrate status: %s", r)
	}

	// Two messages a stream captures, one to a subject the relay refuses for good, and one
	// to a subject no stream captures, which waits without holding the others back.
	js := testnats.JetStream(t, "")
	stream, prefix := natsStream(t, js)
	db, drv := open(t)
	w, err := outbox.NewWriter(drv, outbox.WriterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	bad := outbox.Message{Topic: "$SYS.REQ.SERVER.PING", Key: "k", Payload: []byte("x")}
	uncaptured := outbox.Message{Topic: "nostream." + prefix + "orders", Key: "other", Payload: []byte("y")}
	err = w.Write(context.Background(), tx,
		outbox.Message{Topic: prefix + "orders", Key: "k", Payload: []byte("1")},
		outbox.Message{Topic: prefix + "orders", Key: "k", Payload: []byte("2")}, bad, uncaptured)
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		t.Fatal(err)
	}
	if st := status(); st.Pending != 4 {
		t.Fatalf("status after writing 4: %+v", st)
	}
	if r := must(t, 0, env, "status"); !strings.Contains(r.stdout, "pending") || strings.Contains(r.stdout, "oldest transaction") {
		t.Fatalf("status in text shows PostgreSQL's oldest transaction, or no pending line: %s", r)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	relayEnv := with(env, "OUTBOX_POLL_INTERVAL", "50ms")
	go func() {
		done <- run(ctx, []string{"relay", "--broker", testnats.URL(), "--route", "{topic}",
			"--nats-create-stream", stream, "--nats-stream-subjects", prefix + ">"},
			func(k string) string { return relayEnv[k] }, &stdout, &stderr)
	}()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relay's stderr:\n%s", stderr.String())
		}
	})
	streamMessages(t, js, stream, 2)
	testenv.Await(t, "status to show 2 published, 1 dead and 1 waiting for its subject", func() (any, bool) {
		st := status()
		return st, st.Published == 2 && st.Dead == 1 && st.Pending == 1 && st.Delayed == 1 && st.Retrying == 0
	})
	if !strings.Contains(stderr.String(), "destination unavailable") || !strings.Contains(stderr.String(), uncaptured.Topic) {
		t.Fatalf("the relay did not log the subject no stream captures:\n%s", stderr.String())
	}
	cancel()
	if code := testenv.AwaitRecv(t, "the relay to stop", done); code != 0 {
		t.Fatalf("relay exited %d\nstderr:\n%s", code, stderr.String())
	}

	r := must(t, 0, env, "dead", "list", "--json")
	var dead []outboxdriver.DeadLetter
	if err := json.Unmarshal([]byte(r.stdout), &dead); err != nil || len(dead) != 1 || dead[0].Topic != bad.Topic {
		t.Fatalf("dead list: %v\n%s", err, r)
	}
	must(t, 0, env, "dead", "replay", "--id", dead[0].ID.String(), "--yes")
	if st := status(); st.Pending != 2 || st.Dead != 0 {
		t.Fatalf("status after the replay: %+v", st)
	}

	if r := must(t, 2, env, "migrate", "down", "--to", "0"); !strings.Contains(r.stderr, "--yes") {
		t.Fatalf("migrate down without --yes: %s", r)
	}
	must(t, 0, env, "migrate", "down", "--to", "0", "--yes")
	if r := must(t, 0, env, "migrate", "status"); strings.Contains(r.stdout, "yes") {
		t.Fatalf("migrate status after down: %s", r)
	}
}
