package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/torture/chaos"
)

func TestMain(m *testing.M) {
	if chaos.IsRelay() { // a run starts its relays as this executable
		os.Exit(chaos.RelayMain())
	}
	os.Exit(m.Run())
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--broker", "kafkaesque"},
		{"--faults", "relay-kill"},
		{"--faults", "relay-kill=0"},
		{"--relays", "0"},
		{"--no-such-flag"},
		{"stray"},
	} {
		var stdout, stderr testenv.Buffer
		if code := run(context.Background(), args, &stdout, &stderr); code != 2 {
			t.Errorf("outbox-torture %s: exit %d, want 2\n%s", strings.Join(args, " "), code, stderr.String())
		}
		if !strings.Contains(stderr.String(), "outbox-torture: ") || !strings.Contains(stderr.String(), "--help") {
			t.Errorf("outbox-torture %s: the error does not say what to do:\n%s", strings.Join(args, " "), stderr.String())
		}
	}
	var stdout, stderr testenv.Buffer
	if code := run(context.Background(), []string{"--help"}, &stdout, &stderr); code != 0 || !strings.Contains(stderr.String(), "-relays") {
		t.Errorf("--help: exit %d, want 0 and the flags:\n%s", code, stderr.String())
	}
}

// TestRun runs a short torture run end to end: relay processes started as this
// executable, a private NATS server, two fault kinds, the check's summary line.
func TestRun(t *testing.T) {
	// A context that ends would end the load early (as Ctrl-C does). The run detects its
	// own stalls; -timeout bounds the rest.
	args := []string{"--duration", "1s", "--kinds", "relay-kill,pg-terminate",
		"--faults", "relay-kill=2", "--database-url", testdb.URL()}
	var stdout, stderr testenv.Buffer
	if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("outbox-torture %s: want exit 0, got %d\n%s\n%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "chaos nats relays=1 seed=") || !strings.HasSuffix(last, " result=ok") {
		t.Fatalf("the last line is not a passing summary: %q\n%s", last, stderr.String())
	}
	if !strings.Contains(stderr.String(), "nemesis: relay-kill") {
		t.Errorf("the progress output does not show the faults:\n%s", stderr.String())
	}
}
