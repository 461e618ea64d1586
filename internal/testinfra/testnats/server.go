package testnats

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox/internal/childproc"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

// Server is a private nats-server child process with JetStream, for tests that stop or
// kill their broker. It keeps its port and store directory across restarts, so a
// restarted server has the streams and messages it had stored. It is stopped when the
// test ends. Its methods are safe for concurrent use.
type Server struct {
	t       testenv.TB
	bin     string
	port    int
	dir     string // store directory (-sd)
	logPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done <-chan struct{} // closed when cmd has exited
}

// StartServer starts a private nats-server on a free port of 127.0.0.1 with JetStream
// storing under a temporary directory, and waits until it serves JetStream requests. It
// fails the test if the nats-server binary is missing or the server does not come up.
func StartServer(t testenv.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		bin = "/usr/sbin/nats-server"
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("testnats: the nats-server binary is needed for this test and is neither on PATH nor at %s: install it (apt-get install nats-server, or go install github.com/nats-io/nats-server/v2@latest)", bin)
		}
	}
	s := &Server{t: t, bin: bin, port: testenv.FreePort(t), dir: t.TempDir()}
	s.logPath = filepath.Join(t.TempDir(), "nats-server.log")
	// Registered after the TempDir cleanups, so it runs before them.
	t.Cleanup(s.Stop)
	s.Start()
	return s
}

// URL returns the server's client URL.
func (s *Server) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(s.port) }

// Start starts the server again, on the same port and store directory, and waits until
// it serves JetStream requests. Starting a running server does nothing.
func (s *Server) Start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return
	}
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.t.Fatalf("testnats: open server log: %v", err)
	}
	cmd := exec.Command(s.bin, "-a", "127.0.0.1", "-p", strconv.Itoa(s.port), "-js", "-sd", s.dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	done, err := childproc.Start(cmd, logf)
	if err != nil {
		s.t.Fatalf("testnats: start %s: %v", s.bin, err)
	}
	s.cmd, s.done = cmd, done

	if err := childproc.Ready(cmd, done, s.waitReady); err != nil {
		s.cmd, s.done = nil, nil
		s.t.Fatalf("testnats: nats-server on port %d did not come up: %v\n--- server log ---\n%s", s.port, err, s.log())
	}
}

// waitReady polls until a client can connect and get JetStream account info. It gives up
// when the process exits, or when the answer (the last error) has not changed for
// testenv.Stall(): a boot that is slow on a loaded machine is waited for.
func (s *Server) waitReady(exited <-chan struct{}) error {
	return testenv.WaitReady(exited, "the server to serve JetStream requests", s.ping, nil)
}

// ping makes one attempt. Its timeouts are per attempt, and generous: a slow attempt is
// not a failure, and a server that does not listen yet refuses at once.
func (s *Server) ping() error {
	nc, err := nats.Connect(s.URL(), nats.Timeout(10*time.Second), nats.MaxReconnects(0))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

func (s *Server) log() string { return testenv.LogTail(s.logPath, 8<<10) }

// Stop shuts the server down gracefully (SIGTERM) and waits for it to exit, killing it
// if it has not after testenv.Stall() (a hang: a loaded machine must not turn a graceful
// stop into a kill). Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.stop(syscall.SIGTERM, testenv.Stall())
}

// Kill kills the server (SIGKILL), as a crash or a power cut would, and waits for it to
// exit. Killing a stopped server does nothing.
func (s *Server) Kill() {
	s.stop(syscall.SIGKILL, 0)
}

func (s *Server) stop(sig syscall.Signal, grace time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	if childproc.Stop(s.cmd, s.done, sig, grace) {
		s.t.Logf("testnats: nats-server on port %d ignored %v for %v; killed it", s.port, sig, grace)
	}
	s.cmd, s.done = nil, nil
}
