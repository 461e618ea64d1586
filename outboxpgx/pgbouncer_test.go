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
	"github.com/outboxkit/outbox/internal/testdb"
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
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for i := 0; ; i++ {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if i > 100 {
			_ = cmd.Process.Kill()
			_ = cmd.Wait() // the log is complete, and no longer written, after Wait
			t.Fatalf("pgbouncer did not come up:\n%s", log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// PgBouncer 1.18 cannot keep prepared statements across transactions: pgx must use
	// unnamed ones.
	return fmt.Sprintf("postgres://postgres@%s/test?sslmode=disable&default_query_exec_mode=exec", addr)
}

// TestRelayThroughPgBouncer: behind PgBouncer in transaction pooling mode LISTEN does
// nothing (the listening session is not kept); the relay still publishes everything, by
// polling.
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
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = r.Stop(sctx)
	})
	for i := 0; i < 50; i++ {
		db.Write(t, outbox.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%5), Payload: []byte(`{}`)})
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	got, err := pub.WaitFor(wctx, 50)
	if err != nil {
		t.Fatalf("published %d of 50 through PgBouncer: %v", len(got), err)
	}
	waitFor := time.Now().Add(10 * time.Second)
	for db.CountIn(t, "outbox", "true") != 0 {
		if time.Now().After(waitFor) {
			t.Fatal("outcomes not recorded through PgBouncer")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
