package outboxcli

import (
	"strconv"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/internal/testinfra/testnats"
)

// TestBenchSourceWAL runs `outbox bench --source wal` small, end to end: it starts its own
// PostgreSQL with logical decoding, measures polling and then WAL mode on it, and prints
// both with the server's CPU time and the idle statements. Figures are not judged here
// (docs/benchmarks.md records them); that each one was measured is.
func TestBenchSourceWAL(t *testing.T) {
	t.Parallel()
	nats := testnats.StartServer(t)
	r := must(t, 0, nil, "bench", "--source", "wal", "--broker", nats.URL(), "--events", "3000", "--keys", "50",
		"--rate", "200", "--extra-rates", "400", "--duration", "1s", "--idle", "1s")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	fields := map[string]string{}
	for _, kv := range strings.Fields(lines[len(lines)-1]) {
		k, v, _ := strings.Cut(kv, "=")
		fields[k] = v
	}
	positive := func(key string) {
		t.Helper()
		if v, err := strconv.ParseFloat(fields[key], 64); err != nil || v <= 0 {
			t.Errorf("%s=%q, want a positive figure\n%s", key, fields[key], r)
		}
	}
	if fields["source"] != "wal" {
		t.Fatalf("no source=wal in the line:\n%s", r)
	}
	for _, key := range []string{"eps", "p99_ms", "r400_p99_ms", "pg_cpu_ms_per_10k", "walsender_cpu_ms_per_10k", "idle_qps",
		"poll_eps", "poll_p99_ms", "poll_r400_p99_ms", "poll_pg_cpu_ms_per_10k", "poll_idle_qps", "eps_x", "p99_x", "pg_cpu_x"} {
		positive(key)
	}
	for _, key := range []string{"idle_fetch_qps", "relay_cpu_ms_per_10k", "busy_cores", "poll_busy_cores", "cpu_x"} {
		if _, ok := fields[key]; !ok {
			t.Errorf("no %s in the line:\n%s", key, r)
		}
	}
	if fields["poll_walsender_cpu_ms_per_10k"] != "0.00" {
		t.Errorf("polling used a walsender: poll_walsender_cpu_ms_per_10k=%s", fields["poll_walsender_cpu_ms_per_10k"])
	}
}

// TestBenchWritersHelp: the help names the writers phase's reference and its keys.
func TestBenchWritersHelp(t *testing.T) {
	t.Parallel()
	r := must(t, 0, nil, "bench", "--help")
	for _, key := range []string{"naive_writer_eps", "writer_x", "writer_commit_p50/p99_ms", "naive_commit_p50/p99_ms", "outbox_events"} {
		if !strings.Contains(r.stdout, key) {
			t.Errorf("bench --help does not mention %s:\n%s", key, r.stdout)
		}
	}
}
