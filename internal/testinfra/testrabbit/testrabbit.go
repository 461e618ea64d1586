// Package testrabbit gives tests a private RabbitMQ node (StartServer): a rabbitmq-server
// child process with its own node name, ports and data directory, which a test may stop
// and start again. Tests that cause broker outages use a private node, never the shared
// server on port 5672: other packages' tests run against it concurrently. A missing
// rabbitmq-server fails the test, never skips it.
package testrabbit

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox/internal/childproc"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

// URL returns the shared test server's URL: $OUTBOX_TEST_AMQP_URL or the local server on
// port 5672. Tests that stop the broker use StartServer instead.
func URL() string {
	return cmp.Or(os.Getenv("OUTBOX_TEST_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")
}

// Where to find the rabbitmq-server start script itself. Debian's /usr/sbin/rabbitmq-server
// is a wrapper that switches to the rabbitmq user, whose files would then be out of reach
// of the test, so the script it calls comes first.
var scripts = []string{
	"/usr/lib/rabbitmq/bin/rabbitmq-server",
	"/usr/local/lib/rabbitmq/bin/rabbitmq-server",
}

// Server is a private RabbitMQ node, a rabbitmq-server child process without plugins. It
// keeps its node name, ports and data directory across restarts, so a restarted node has
// the durable exchanges, queues and bindings, and the persistent messages, that it had
// stored (a durable queue's persistent message is on disk once its publisher confirm
// came). The node is killed when the test ends, and by the kernel if the test binary
// dies first. Its methods are safe for concurrent use.
type Server struct {
	t          testenv.TB
	script     string
	node       string // Erlang node name, unique
	port       int    // AMQP
	distPort   int    // Erlang distribution
	dir        string // RABBITMQ_MNESIA_BASE, RABBITMQ_LOG_BASE, the config files and HOME
	consoleLog string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done <-chan struct{} // closed when cmd has exited
}

// StartServer starts a private RabbitMQ node listening on a free port of 127.0.0.1, with
// its data under a temporary directory, and waits until it accepts AMQP connections
// (guest/guest). It fails the test if rabbitmq-server is missing or the node does not
// come up.
func StartServer(t testenv.TB) *Server {
	t.Helper()
	script := ""
	for _, s := range scripts {
		if _, err := os.Stat(s); err == nil {
			script = s
			break
		}
	}
	if script == "" {
		t.Fatalf("testrabbit: a RabbitMQ installation is needed for this test and its start script is not at %s: install it (apt-get install rabbitmq-server)", strings.Join(scripts, " or "))
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	s := &Server{t: t, script: script, node: "outbox_test_" + hex.EncodeToString(b[:]) + "@localhost",
		port: testenv.FreePort(t), distPort: testenv.FreePort(t), dir: t.TempDir()}
	s.consoleLog = filepath.Join(s.dir, "log", "console.log")
	for name, text := range map[string]string{
		"enabled_plugins":   "[].\n", // no management plugin, nor any other
		"rabbitmq.conf":     "",      // not /etc/rabbitmq's, which listens on 5672
		"rabbitmq-env.conf": "",      // not /etc/rabbitmq's, which names the shared node
	} {
		if err := os.WriteFile(filepath.Join(s.dir, name), []byte(text), 0o644); err != nil {
			t.Fatalf("testrabbit: %v", err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(s.consoleLog), 0o755); err != nil {
		t.Fatalf("testrabbit: %v", err)
	}
	// Registered after the TempDir cleanup, so it runs before it.
	t.Cleanup(s.kill)
	s.Start()
	return s
}

// URL returns the node's AMQP URL, with the guest user.
func (s *Server) URL() string { return "amqp://guest:guest@" + s.Addr() + "/" }

// Addr returns the node's AMQP "host:port".
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Node returns the node's Erlang name (for rabbitmqctl -n).
func (s *Server) Node() string { return s.node }

// env is the node's environment: this process's, without RabbitMQ and Erlang settings,
// plus the node's own.
func (s *Server) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RABBITMQ_") && !strings.HasPrefix(kv, "ERL_") && !strings.HasPrefix(kv, "HOME=") &&
			!strings.HasPrefix(kv, "NOTIFY_SOCKET=") {
			env = append(env, kv)
		}
	}
	return append(env,
		"HOME="+s.dir, // the Erlang cookie goes there
		"RABBITMQ_NODENAME="+s.node,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(s.port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(s.distPort),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(s.dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(s.dir, "log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(s.dir, "enabled_plugins"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(s.dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(s.dir, "advanced.config"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(s.dir, "rabbitmq-env.conf"),
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
		"ERL_EPMD_ADDRESS=127.0.0.1",
		// With input allowed, the script execs the Erlang VM instead of running it in
		// the background of a shell, so the VM is the child that Pdeathsig applies to.
		"RABBITMQ_ALLOW_INPUT=1",
	)
}

// Start starts the node again, with the same name, ports and data, and waits until it
// accepts AMQP connections. Starting a running node does nothing.
func (s *Server) Start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return
	}
	logf, err := os.OpenFile(s.consoleLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.t.Fatalf("testrabbit: open the console log: %v", err)
	}
	cmd := exec.Command(s.script)
	cmd.Dir = s.dir
	cmd.Env = s.env()
	cmd.Stdout, cmd.Stderr = logf, logf
	// The node dies with this process even when the cleanups never run (a test binary
	// killed by -timeout's panic).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// The node's Erlang shell reads its input: a pipe, never written, held open by cmd
	// until the node exits.
	if _, err := cmd.StdinPipe(); err != nil {
		_ = logf.Close()
		s.t.Fatalf("testrabbit: %v", err)
	}
	done, err := childproc.Start(cmd, logf)
	if err != nil {
		s.t.Fatalf("testrabbit: start %s: %v", s.script, err)
	}
	s.cmd, s.done = cmd, done

	if err := childproc.Ready(cmd, done, s.waitReady); err != nil {
		s.cmd, s.done = nil, nil
		s.t.Fatalf("testrabbit: node %s on port %d did not come up: %v\n--- node log ---\n%s", s.node, s.port, err, s.log())
	}
}

// waitReady polls until a client can connect and open a channel. A boot (about 6 s on
// the 2-core test machines, a first one creating its database the slowest) writes its
// log as it goes: waitReady gives up when the process exits, or when neither the log nor
// the answer (the last error) has changed for testenv.Stall(), so a boot that is slow on
// a loaded machine is waited for.
func (s *Server) waitReady(exited <-chan struct{}) error {
	return testenv.WaitReady(exited, "the node to accept AMQP connections", s.ping,
		func() any { return fmt.Sprintf("node log: %d bytes", s.logSize()) })
}

// logSize is the size of the node's log and console output, which grow while it boots.
func (s *Server) logSize() int64 {
	var n int64
	for _, p := range []string{filepath.Join(s.dir, "log", s.node+".log"), s.consoleLog} {
		if fi, err := os.Stat(p); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// ping makes one attempt. Its timeout is per attempt, and generous: a slow attempt is not
// a failure, and a node that does not listen yet refuses at once.
func (s *Server) ping() error {
	conn, err := amqp.DialConfig(s.URL(), amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	return ch.Close()
}

// log returns the tail of the node's log and console output.
func (s *Server) log() string {
	var out strings.Builder
	for _, p := range []string{filepath.Join(s.dir, "log", s.node+".log"), s.consoleLog} {
		fmt.Fprintf(&out, "%s:\n%s\n", filepath.Base(p), testenv.LogTail(p, 6<<10))
	}
	return out.String()
}

// Stop shuts the node down gracefully (SIGTERM: RabbitMQ closes its connections and
// stops its queues, as on a service stop) and waits for it to exit (about 3 s on the test
// machines), killing it if it has not after testenv.Stall() (a hang: a loaded machine
// must not turn a graceful stop into a kill). Stopping a stopped node does nothing.
func (s *Server) Stop() { s.stop(syscall.SIGTERM, testenv.Stall()) }

// kill kills the node at the end of the test; its data is not kept.
func (s *Server) kill() { s.stop(syscall.SIGKILL, 0) }

func (s *Server) stop(sig syscall.Signal, grace time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	if childproc.Stop(s.cmd, s.done, sig, grace) {
		s.t.Logf("testrabbit: node %s ignored %v for %v; killed it", s.node, sig, grace)
	}
	s.cmd, s.done = nil, nil
}
