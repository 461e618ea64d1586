package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/internal/testdb"
)

func TestMain(m *testing.M) {
	tortureRelay() // `outbox torture` starts its relays as this executable
	os.Exit(m.Run())
}

func TestTortureUsage(t *testing.T) {
	for _, args := range [][]string{
		{"torture", "--broker", "kafkaesque"},
		{"torture", "--faults", "relay-kill"},
		{"torture", "--faults", "relay-kill=0"},
		{"torture", "--relays", "0"},
	} {
		r := must(t, 2, nil, args...)
		if !strings.Contains(r.stderr, "--") {
			t.Errorf("outbox %s: the error does not name the flag:\n%s", strings.Join(args, " "), r)
		}
	}
}

// TestTortureCommand runs a short torture run end to end: relay processes started as
// this executable, a private NATS server, two fault kinds, the check's summary line.
func TestTortureCommand(t *testing.T) {
	// Not through cli: a context that ends would end the load early (as Ctrl-C does).
	// The run detects its own stalls; -timeout bounds the rest.
	args := []string{"torture", "--duration", "1s", "--kinds", "relay-kill,pg-terminate",
		"--faults", "relay-kill=2", "--database-url", testdb.URL()}
	var stdout, stderr syncBuffer
	code := run(context.Background(), args, func(string) string { return "" }, &stdout, &stderr)
	r := result{code: code, stdout: stdout.String(), stderr: stderr.String()}
	if r.code != 0 {
		t.Fatalf("outbox %s: want exit 0, got %s", strings.Join(args, " "), r)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "chaos nats relays=1 seed=") || !strings.HasSuffix(last, " result=ok") {
		t.Fatalf("the last line is not a passing summary: %q\n%s", last, r)
	}
	if !strings.Contains(r.stderr, "nemesis: relay-kill") {
		t.Errorf("the progress output does not show the faults:\n%s", r.stderr)
	}
}
