package pgserver

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

// envOrphan makes the test binary a process that starts a server, prints its directory
// and postmaster pid, and waits to be killed.
const envOrphan = "OUTBOX_PGSERVER_ORPHAN"

func TestMain(m *testing.M) {
	if os.Getenv(envOrphan) == "1" {
		s, err := Start(Options{})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("%s %d\n", s.root, s.PID())
		select {}
	}
	os.Exit(m.Run())
}

func TestServerStopStart(t *testing.T) {
	t.Parallel()
	s := start(t)
	if !strings.HasPrefix(s.URL(), "postgres://postgres@127.0.0.1:") || s.URL() == testdb.URL() {
		t.Fatalf("URL = %s, want a private port on 127.0.0.1", s.URL())
	}
	query := func(t *testing.T, q string) error {
		ctx := testenv.Context(t)
		conn, err := pgx.Connect(ctx, s.URL())
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, q)
		return err
	}
	count := func(t *testing.T) int {
		ctx := testenv.Context(t)
		conn, err := pgx.Connect(ctx, s.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if err := query(t, `CREATE TABLE t (id int); INSERT INTO t VALUES (1)`); err != nil {
		t.Fatal(err)
	}

	// A session open across an immediate stop loses its connection; what it committed
	// before stays.
	ctx := testenv.Context(t)
	held, err := pgx.Connect(ctx, s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close(ctx)
	if _, err := held.Exec(ctx, `INSERT INTO t VALUES (2)`); err != nil {
		t.Fatal(err)
	}
	must(t, s.Stop(Immediate))
	if err := query(t, `SELECT 1`); err == nil {
		t.Fatal("a query on a stopped server succeeded")
	}
	must(t, s.Stop(Immediate)) // stopping twice is safe
	must(t, s.Start())
	if _, err := held.Exec(ctx, `SELECT 1`); err == nil {
		t.Error("a session from before the immediate stop still works")
	}
	if n := count(t); n != 2 {
		t.Errorf("after an immediate stop: %d rows, want 2", n)
	}

	if err := query(t, `INSERT INTO t VALUES (3)`); err != nil {
		t.Fatal(err)
	}
	must(t, s.Restart(Fast))
	must(t, s.Start()) // starting a running server does nothing
	if n := count(t); n != 3 {
		t.Errorf("after a fast restart: %d rows, want 3", n)
	}
}

// TestServerDiesWithTestProcess kills a process that runs a server without letting it
// clean up, and checks that the server goes down with it and that the next server
// removes the directory left behind.
func TestServerDiesWithTestProcess(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), envOrphan+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the orphaning process printed no server: %v", err)
	}
	dir, pidText, _ := strings.Cut(strings.TrimSpace(line), " ")
	pid, err := strconv.Atoi(pidText)
	if err != nil || !alive(pid) {
		t.Fatalf("the orphaning process printed %q: no live postmaster", line)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })

	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	testenv.AwaitCond(t, fmt.Sprintf("the orphaned postmaster %d to exit", pid), func() bool { return !alive(pid) })
	sweep() // another test process's sweep may have been first

	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("after a sweep, the killed process's server directory: %v, want it removed", err)
	}
}

// TestServerSettings: settings given to StartServer reach the server, and stay across a
// restart.
func TestServerSettings(t *testing.T) {
	t.Parallel()
	s := start(t, "wal_level=logical", "max_replication_slots=3")
	show := func(name string) string {
		t.Helper()
		ctx := testenv.Context(t)
		conn, err := pgx.Connect(ctx, s.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var v string
		if err := conn.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	check := func(when string) {
		t.Helper()
		if got := show("wal_level"); got != "logical" {
			t.Errorf("%s: wal_level = %s, want logical", when, got)
		}
		if got := show("max_replication_slots"); got != "3" {
			t.Errorf("%s: max_replication_slots = %s, want 3", when, got)
		}
		if got := show("fsync"); got != "on" {
			t.Errorf("%s: fsync = %s, want the default on", when, got)
		}
	}
	check("after the start")
	must(t, s.Restart(Fast))
	check("after a restart")
}

// start starts a server for t, closed when t ends.
func start(t *testing.T, settings ...string) *Server {
	t.Helper()
	s, err := Start(Options{Settings: settings, Stall: testenv.Stall()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
