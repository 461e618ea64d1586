// Package pgserver runs a private PostgreSQL server: a cluster of its own in a temporary
// directory, on a free port of 127.0.0.1, as a child of this process, which the caller
// may stop (as an operator or a crash would) and start again. `outbox bench --source
// wal` starts one with logical decoding, and the tests' testpg wraps it.
//
// The server keeps PostgreSQL's durability defaults (fsync, synchronous_commit,
// full_page_writes on), trusts every connection from 127.0.0.1 and listens on no Unix
// socket. initdb and postgres refuse to run as root: under root, the server runs as the
// postgres OS user, in a directory that user owns. It shuts down at once if this process
// dies without closing it, and the next Start removes what such a process left behind.
package pgserver

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/internal/childproc"
)

// Database is the database every server has, besides postgres and the templates.
const Database = "test"

// A StopMode is how Stop shuts the server down: pg_ctl's -m.
type StopMode string

const (
	// Fast disconnects the clients, rolls back their transactions and checkpoints.
	Fast StopMode = "fast"
	// Immediate kills every server process at once, without a checkpoint, as a crash
	// would: the next start replays the WAL.
	Immediate StopMode = "immediate"
)

// StallDefault is Options.Stall's default.
const StallDefault = 2 * time.Minute

// dirPrefix names the servers' directories under os.TempDir(), for the sweep.
const dirPrefix = "outbox-pgserver-"

// Options configure Start.
type Options struct {
	// Settings are extra server settings, each "name=value" as postgres -c takes it
	// ("wal_level=logical"); they apply at every start, restarts included.
	Settings []string
	// Stall bounds the waits for the server to come up and to shut down: they fail when
	// nothing changed (the same error from a connection attempt) for this long, however
	// long they take while something does. Defaults to StallDefault.
	Stall time.Duration
}

// Server is a private PostgreSQL server: a postmaster child process that keeps its
// port and data directory across restarts. Its methods are safe for concurrent use.
type Server struct {
	bin  string // the directory of initdb, postgres and pg_ctl
	port int
	root string // owner, server.log and data
	cred *syscall.Credential
	opts Options
	mu   sync.Mutex
	cmd  *exec.Cmd
	done <-chan struct{} // closed when cmd has exited
}

// Start creates a cluster in a temporary directory, starts it on a free port of
// 127.0.0.1, creates the Database and waits until it accepts connections. On an error
// nothing is left behind.
func Start(opts Options) (_ *Server, err error) {
	for _, kv := range opts.Settings {
		if name, _, ok := strings.Cut(kv, "="); !ok || name == "" || strings.ContainsAny(name, " \t\n") {
			return nil, fmt.Errorf("setting %q: want name=value, as postgres -c takes it", kv)
		}
	}
	opts.Settings = slices.Clone(opts.Settings)
	opts.Stall = cmp.Or(opts.Stall, StallDefault)
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	sweep()
	root, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, root: root, cred: cred, opts: opts}
	defer func() {
		if err != nil {
			_ = s.Close()
		}
	}()
	if err := s.makeRoot(); err != nil {
		return nil, fmt.Errorf("prepare %s: %w", root, err)
	}
	if out, err := s.run("initdb", "-D", s.dataDir(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	if s.port, err = freePort(); err != nil {
		return nil, err
	}
	if err := s.Start(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), opts.Stall)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.url("postgres"))
	if err == nil {
		_, err = conn.Exec(ctx, "CREATE DATABASE "+Database)
		_ = conn.Close(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("create database %s: %w", Database, err)
	}
	return s, nil
}

// URL returns the URL of the server's Database.
func (s *Server) URL() string { return s.url(Database) }

// Addr returns the server's host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Dir returns the server's directory (its data directory and log are inside).
func (s *Server) Dir() string { return s.root }

func (s *Server) url(db string) string {
	return "postgres://postgres@" + s.Addr() + "/" + db + "?sslmode=disable"
}

func (s *Server) dataDir() string { return filepath.Join(s.root, "data") }
func (s *Server) logPath() string { return filepath.Join(s.root, "server.log") }

// freePort returns a TCP port of 127.0.0.1 that nothing listens on at the moment.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// makeRoot makes the server's directory reachable by the server's user, its data
// directory owned by that user, and records this process as the owner, for the sweep.
func (s *Server) makeRoot() error {
	if err := os.WriteFile(filepath.Join(s.root, "owner"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	if err := os.Mkdir(s.dataDir(), 0o700); err != nil {
		return err
	}
	if s.cred == nil {
		return nil
	}
	if err := os.Chmod(s.root, 0o755); err != nil {
		return err
	}
	return os.Chown(s.dataDir(), int(s.cred.Uid), int(s.cred.Gid))
}

// command returns the PostgreSQL program name, to run as the server's user, which dies
// with this process.
func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.root
	cmd.Env = []string{"PATH=" + s.bin + ":/usr/bin:/bin", "LC_ALL=C", "TZ=UTC"}
	// Set after the credential change in the child, so the change does not clear it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGKILL}
	return cmd
}

// run runs a PostgreSQL program to completion and returns its output.
func (s *Server) run(name string, args ...string) ([]byte, error) {
	var out bytes.Buffer
	cmd := s.command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

// Start starts the server again, on the same port and data directory, and waits until
// it accepts connections (after crash recovery, if it was stopped immediately). Starting
// a running server does nothing.
//
// The postmaster is a child of this process rather than a daemon of pg_ctl start's, so
// that it gets SIGQUIT (an immediate shutdown) when this process dies.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	logf, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open server log: %w", err)
	}
	args := []string{"-D", s.dataDir(), "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
		"-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "full_page_writes=on"}
	for _, kv := range s.opts.Settings { // after the defaults: the last -c of a name wins
		args = append(args, "-c", kv)
	}
	cmd := s.command("postgres", args...)
	cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
	// A process group of its own: a Ctrl-C at the terminal (which a long run may turn
	// into an early end) must not shut the server down too.
	cmd.SysProcAttr.Setpgid = true
	cmd.Stdout, cmd.Stderr = logf, logf
	done, err := childproc.Start(cmd, logf)
	if err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	s.cmd, s.done = cmd, done

	if err := childproc.Ready(cmd, done, s.waitReady); err != nil {
		s.cmd, s.done = nil, nil
		return fmt.Errorf("postgres on port %d did not come up: %w\n--- server log ---\n%s", s.port, err, s.LogTail())
	}
	return nil
}

// waitReady polls until a client can connect and run a query. A start, crash recovery
// included, may take as long as it takes on a loaded machine: it fails when the process
// exits, or when the ping's error stays the same for Options.Stall.
func (s *Server) waitReady(exited <-chan struct{}) error {
	poll := time.Millisecond
	var last string
	changed := time.Now()
	for first := true; ; first = false {
		select {
		case <-exited:
			return errors.New("the process exited")
		default:
		}
		err := s.ping()
		if err == nil {
			return nil
		}
		if e := err.Error(); first || e != last {
			last, changed = e, time.Now()
		} else if time.Since(changed) >= s.opts.Stall {
			return fmt.Errorf("no progress for %s; last error: %w", s.opts.Stall, err)
		}
		time.Sleep(poll)
		poll = min(2*poll, 100*time.Millisecond)
	}
}

// ping connects and pings; its context bounds a hang, not how fast the server answers.
func (s *Server) ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.Stall)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.url("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.Ping(ctx)
}

// Stop shuts the server down with pg_ctl stop -m mode and waits for every server
// process to exit; if pg_ctl fails, it kills the postmaster and says so. Stopping a
// stopped server does nothing.
func (s *Server) Stop(mode StopMode) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	out, err := s.run("pg_ctl", "stop", "-D", s.dataDir(), "-m", string(mode), "-w", "-t", strconv.Itoa(int(s.opts.Stall.Seconds())))
	if err != nil {
		_ = s.cmd.Process.Kill()
	}
	<-s.done
	s.cmd, s.done = nil, nil
	if err != nil {
		return fmt.Errorf("pg_ctl stop -m %s: %w (killed the postmaster)\n%s", mode, err, out)
	}
	return nil
}

// Restart stops the server with mode and starts it again.
func (s *Server) Restart(mode StopMode) error {
	if err := s.Stop(mode); err != nil {
		return err
	}
	return s.Start()
}

// Close stops the server, fast, and removes its directory.
func (s *Server) Close() error {
	err := s.Stop(Fast)
	return errors.Join(err, os.RemoveAll(s.root))
}

// LogTail returns the last 8 KiB of the server log, or why it cannot be read.
func (s *Server) LogTail() string {
	b, err := os.ReadFile(s.logPath())
	if err != nil {
		return err.Error()
	}
	if n := 8 << 10; len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// PID returns the postmaster's process id, 0 when stopped: the parent of every server
// process (a benchmark sums their CPU time).
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// binDir returns the bin directory of the newest PostgreSQL under /usr/lib/postgresql
// (Debian's layout), or else the directory of initdb on PATH.
func binDir() (string, error) {
	const base = "/usr/lib/postgresql"
	entries, _ := os.ReadDir(base)
	var versions []float64
	for _, e := range entries {
		v, err := strconv.ParseFloat(e.Name(), 64)
		if err == nil && isFile(filepath.Join(base, e.Name(), "bin", "initdb")) {
			versions = append(versions, v)
		}
	}
	if len(versions) > 0 {
		return filepath.Join(base, strconv.FormatFloat(slices.Max(versions), 'f', -1, 64), "bin"), nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", fmt.Errorf("PostgreSQL's initdb is needed to run a private server and is neither under %s/<version>/bin nor on PATH: install the PostgreSQL server (apt-get install postgresql)", base)
}

func isFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}

// credential returns whom to run the server as: the postgres OS user under root (initdb
// and postgres refuse root), nil (this process's user) otherwise.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, the server must run as the postgres OS user, which is missing (%v): install the PostgreSQL server, which creates it", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := cmp.Or(err1, err2); err != nil {
		return nil, fmt.Errorf("user postgres: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// sweep removes the directories of servers whose process died without cleaning up
// (the server itself went down with it). A directory whose owner or postmaster still
// lives, or that has no owner yet, is left alone.
func sweep() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		owner, err := readPID(filepath.Join(dir, "owner"))
		if err != nil || alive(owner) {
			continue
		}
		if pm, err := readPID(filepath.Join(dir, "data", "postmaster.pid")); err == nil && alive(pm) {
			continue
		}
		_ = os.RemoveAll(dir)
	}
}

// readPID reads the process id on the first line of path.
func readPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(first))
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) == syscall.ESRCH {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// pid (comm) state ...: comm may hold spaces and parentheses, the state follows the last ')'.
	_, rest, _ := strings.Cut(string(stat[bytes.LastIndexByte(stat, ')')+1:]), " ")
	return !strings.HasPrefix(rest, "Z")
}
