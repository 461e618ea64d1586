package outboxcli

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/internal/testinfra/testdb"
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

// TestBenchOutboxes runs `outbox bench --outboxes` small, end to end: relay processes
// (this test binary, run as `outbox`) serve a fleet of outboxes in a database the bench
// makes and drops. Figures are not judged here (docs/benchmarks.md records them); that
// each one was measured is.
func TestBenchOutboxes(t *testing.T) {
	t.Parallel()
	nats := testnats.StartServer(t)
	r := must(t, 0, nil, "bench", "--outboxes", "4", "--broker", nats.URL(), "--database-url", testdb.URL(),
		"--events", "2000", "--keys", "20", "--rate", "50", "--duration", "1s", "--idle", "1s")
	fields := benchFields(r.stdout)
	if fields["outboxes"] != "4" || fields["trickle_outboxes"] != "1" {
		t.Fatalf("want outboxes=4 trickle_outboxes=1 in the line:\n%s", r)
	}
	for _, key := range []string{"idle_conns", "rss_mib", "drain_eps", "solo_eps", "drain_x", "trickle_p99_ms", "solo_trickle_p99_ms",
		"drain_trickle_p99_ms", "fair_p99_x", "solo_p99_x"} {
		if v, err := strconv.ParseFloat(fields[key], 64); err != nil || v <= 0 {
			t.Errorf("%s=%q, want a positive figure\n%s", key, fields[key], r)
		}
	}
	if _, err := strconv.ParseFloat(fields["idle_qps"], 64); err != nil {
		t.Errorf("idle_qps=%q, want a figure\n%s", fields["idle_qps"], r)
	}
	if db := regexp.MustCompile(`database (outbox_bench_\w+)`).FindStringSubmatch(r.stderr); db == nil {
		t.Errorf("the progress does not name the fleet's database:\n%s", r.stderr)
	} else {
		var n int
		if err := testdb.Pool(t).QueryRow(t.Context(), `SELECT count(*) FROM pg_database WHERE datname = $1`, db[1]).Scan(&n); err != nil || n != 0 {
			t.Errorf("database %s is still there after the run (%d, %v)", db[1], n, err)
		}
	}
}

// TestBenchOutboxesErrors: what a fleet run cannot measure is refused before anything
// is made.
func TestBenchOutboxesErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--outboxes", "1"}, "--outboxes: want 2 or more"},
		{[]string{"--outboxes", "3", "--db", "sqlite"}, "--db postgres --source poll"},
		{[]string{"--outboxes", "3", "--duration", "-1s"}, "--duration, which must be positive"},
		{[]string{"--outboxes", "3", "--park-after", "-2s"}, "--park-after"},
	} {
		r := must(t, 2, nil, append([]string{"bench"}, tc.args...)...)
		if !strings.Contains(r.stderr, tc.want) {
			t.Errorf("bench %v: want %q in:\n%s", tc.args, tc.want, r.stderr)
		}
	}
}

// benchFields reads the last line of a bench's output as key=value pairs.
func benchFields(stdout string) map[string]string {
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	fields := map[string]string{}
	for _, kv := range strings.Fields(lines[len(lines)-1]) {
		k, v, _ := strings.Cut(kv, "=")
		fields[k] = v
	}
	return fields
}
