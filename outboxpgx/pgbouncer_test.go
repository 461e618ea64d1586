package outboxpgx_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxtest"
)

// startPgBouncer runs PgBouncer in transaction pooling mode in front of the test
// database and returns its URL for the relay. It fails the test if pgbouncer is missing.
func startPgBouncer(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin = "/usr/sbin/pgbouncer"
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("this test needs pgbouncer (apt-get install pgbouncer; scripts/test.sh installs it)")
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "outbox-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o755) // PgBouncer refuses to run as root: it runs as postgres below
	users := filepath.Join(dir, "users.txt")
	ini := filepath.Join(dir, "pgbouncer.ini")
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(users, []byte(`"postgres" ""`+"\n"), 0o644))
	must(os.WriteFile(ini, []byte(fmt.Sprintf(`[databases]
test = host=127.0.0.1 port=5432 dbname=test user=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = 10
ignore_startup_parameters = extra_float_digits
`, port, users)), 0o644))
	args := []string{ini}
	if os.Geteuid() == 0 {
		args = append([]string{"-u", "postgres"}, args...)
	}
	cmd := exec.Command(bin, args...)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	must(cmd.Start())
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	err = testenv.Progress(context.Background(), "pgbouncer to accept connections", testenv.Stall(), func() (any, bool) {
		select {
		case <-exited:
			return "exited", true
		default:
		}
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return nil, true
		}
		return err, false
	})
	select {
	case <-exited: // the log is complete, and no longer written, once it exited
		t.Fatalf("pgbouncer exited:\n%s", log.String())
	default:
	}
	if err != nil {
		_ = cmd.Process.Kill()
		<-exited
		t.Fatalf("%v; pgbouncer's log:\n%s", err, log.String())
	}
	// PgBouncer 1.18 cannot keep prepared statements across transactions: pgx must use
	// unnamed ones.
	return fmt.Sprintf("postgres://postgres@%s/test?sslmode=disable&default_query_exec_mode=exec", addr)
}

// TestRelayThroughPgBouncer: behind PgBouncer in transaction pooling mode LISTEN does
// nothing (the listening session is not kept); the relay still publishes everything, by
// polling, and never takes the gate, which would stay with whichever server process took
// it and make every writer notify.
func TestRelayThroughPgBouncer(t *testing.T) {
	t.Parallel()
	db := testdb.Migrated(t)
	url := startPgBouncer(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	drv, err := outboxpgx.New(pool, outboxpgx.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	pub := &outboxtest.Publisher{}
	r, err := outbox.NewRelay(drv, pub, outbox.RelayConfig{PollInterval: 100 * time.Millisecond, Logger: testdb.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(testenv.Context(t)) })
	for i := 0; i < 50; i++ {
		db.Write(t, outbox.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%5), Payload: []byte(`{}`)})
	}
	pub.Await(t, 50)
	b := &testBundle{db}
	b.awaitCount(t, "outbox", "true", 0) // outcomes recorded through PgBouncer
	key := uint64(b.wakeKey(t))
	var held int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1
		AND classid::bigint = $1 AND objid::bigint = $2`, int64(key>>32), int64(uint32(key))).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != 0 {
		t.Fatalf("the gate is held %d times through PgBouncer", held)
	}
}
