package demo

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

// lockedBuffer is a bytes.Buffer that the demo writes while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// lastLine returns the last non-empty line of s.
func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	return s[strings.LastIndexByte(s, '\n')+1:]
}

func run(t *testing.T, cfg Config) Result {
	t.Helper()
	out := &lockedBuffer{}
	cfg.Out = out
	ctx, cancel := context.WithCancel(context.Background())
	var res Result
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		res, err = Run(ctx, cfg)
	}()
	t.Cleanup(func() { cancel(); <-done })
	// The demo prints its counts (written, published, handled) every 500 ms: the same
	// line for testenv.Stall() means it stopped moving.
	testenv.AwaitChan(t, "the demo to handle every committed event", done, func() any { return lastLine(out.String()) })
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	if !res.OK() || res.Committed == 0 || res.RolledBack == 0 || res.Redeliveries == 0 {
		t.Fatalf("demo result %+v\n%s%s", res, out.String(), res.Summary())
	}
	if s := res.Summary(); strings.Contains(s, "FAIL") {
		t.Fatalf("summary reports a failure:\n%s", s)
	}
	return res
}

// The embedded default: SQLite files and an in-process NATS server.
func TestDemoEmbedded(t *testing.T) {
	t.Parallel()
	run(t, Config{Orders: 400, Rollback: 0.2, Crash: 0.2, Dir: t.TempDir()})
}

// PostgreSQL instead of SQLite.
func TestDemoPostgres(t *testing.T) {
	t.Parallel()
	run(t, Config{Orders: 400, Rollback: 0.2, Crash: 0.2, DatabaseURL: testdb.URL(), Dir: t.TempDir()})
}
