// Package nodechild runs an emulator from the npm registry (fauxqs, kinesalite) as a
// Node.js child process on a free port of 127.0.0.1, for tests: it reports its port on
// standard output and exits when its standard input closes, which happens when the test
// process ends however it ends, so no emulator outlives it.
package nodechild

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

// Spec says how to run one emulator.
type Spec struct {
	Name    string // for messages: "fauxqs"
	Module  string // the file the launcher loads, passed to it as process.argv[1]
	Install string // the command that installs it, named when Module is missing
	// Launcher is the JavaScript that starts the emulator on 127.0.0.1, port 0, prints
	// "<Name> port <n>" on a line, and exits when standard input ends. ESM marks it an ES
	// module (import) rather than CommonJS (require).
	Launcher string
	ESM      bool
	// Healthy, when set, is called with the emulator's host:port until it returns nil,
	// or until its answer has not changed for testenv.Stall().
	Healthy func(ctx context.Context, addr string) (seen any, ok bool)
	// ExitHint, when set, is appended to the error of an emulator that exited at start,
	// given its standard error.
	ExitHint func(stderr string) string
}

// Server is an emulator child process.
type Server struct {
	port int

	mu    sync.Mutex
	cmd   *exec.Cmd
	stdin io.Closer
	done  chan struct{}   // closed when cmd has exited
	log   *testenv.Buffer // stderr, for failure messages
}

// Start starts the emulator of spec and waits until it reports its port and is healthy.
// Node.js may take long to start on a loaded machine: what bounds each wait is
// testenv.Stall() without progress, not a guess at how fast it starts.
func Start(spec Spec) (*Server, error) {
	if _, err := os.Stat(spec.Module); err != nil {
		return nil, fmt.Errorf("%s, the emulator these tests need, is not installed (%s): install it with\n\t%s", spec.Name, spec.Module, spec.Install)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("%s needs Node.js, and node is not on PATH (apt-get install nodejs)", spec.Name)
	}
	inputType := "--input-type=commonjs"
	if spec.ESM {
		inputType = "--input-type=module"
	}
	cmd := exec.Command(node, inputType, "-e", spec.Launcher, spec.Module)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	log := &testenv.Buffer{}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", node, err)
	}
	s := &Server{cmd: cmd, stdin: stdin, done: make(chan struct{}), log: log}
	portc := make(chan int, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if p, ok := strings.CutPrefix(sc.Text(), spec.Name+" port "); ok {
				n, _ := strconv.Atoi(p)
				portc <- n
			}
		}
		_ = cmd.Wait()
		close(s.done)
	}()
	exited := false
	err = testenv.Progress(context.Background(), spec.Name+" to report its port", testenv.Stall(), func() (any, bool) {
		select {
		case s.port = <-portc:
			return nil, true
		case <-s.done:
			exited = true
			return nil, true
		default:
			return fmt.Sprintf("%d bytes on stderr", len(s.Stderr())), false
		}
	})
	switch {
	case exited:
		hint := ""
		if spec.ExitHint != nil {
			hint = spec.ExitHint(s.Stderr())
		}
		return nil, fmt.Errorf("%s exited at start%s:\n%s", spec.Name, hint, s.Stderr())
	case err != nil:
		s.Stop()
		return nil, fmt.Errorf("%w\n%s", err, s.Stderr())
	}
	if spec.Healthy != nil {
		err := testenv.Progress(context.Background(), spec.Name+" to answer", testenv.Stall(), func() (any, bool) {
			ctx, cancel := testenv.CallContext()
			defer cancel()
			return spec.Healthy(ctx, s.Addr())
		})
		if err != nil {
			s.Stop()
			return nil, fmt.Errorf("%s on port %d is not healthy: %w\n%s", spec.Name, s.port, err, s.Stderr())
		}
	}
	return s, nil
}

// Addr returns the server's "host:port", for a proxy in front of it.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Endpoint returns the server's base URL, for a client's endpoint.
func (s *Server) Endpoint() string { return "http://" + s.Addr() }

// Stop stops the server and waits for it to exit. Stopping twice is safe.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.stdin.Close()
	select {
	case <-s.done:
	case <-time.After(5 * time.Second): // a grace period, not a check: then it is killed
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
}

// Exited reports whether the server's process has exited (Stop, or a crash).
func (s *Server) Exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Stderr returns what the server wrote on its standard error so far.
func (s *Server) Stderr() string { return s.log.String() }
