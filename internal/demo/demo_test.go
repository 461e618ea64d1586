package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testdb"
)

func run(t *testing.T, cfg Config) Result {
	t.Helper()
	var out bytes.Buffer
	cfg.Out = &out
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg)
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
