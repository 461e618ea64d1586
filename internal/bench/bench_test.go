package bench

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/pgsql"
)

// TestLineWithPolling: with Source wal the line carries WAL mode's figures under the
// usual keys, polling's as poll_*, and their ratios.
func TestLineWithPolling(t *testing.T) {
	load := func(cpu time.Duration, fetch float64) *ServerLoad {
		return &ServerLoad{CPUPer10k: cpu, WalsenderPer10k: cpu / 4, RelayCPUPer10k: 50 * time.Millisecond, BusyCores: 1.9, IdleQPS: 3, IdleFetchQPS: fetch}
	}
	r := Result{DB: "postgres", Source: SourceWAL, Events: 100, Relays: 1, Rate: 1000,
		Phases: Phases{EPS: 200, P99: 2 * time.Millisecond, Server: load(100*time.Millisecond, 0),
			Extra: []RateLatency{{Rate: 5000, P50: time.Millisecond, P95: time.Millisecond, P99: 3 * time.Millisecond}}}}
	poll := Phases{EPS: 100, P99: 4 * time.Millisecond, Server: load(200*time.Millisecond, 1)}
	r.Poll = &poll
	line := r.String()
	for _, want := range []string{" source=wal ", " eps=200 ", " p99_ms=2.00 ", " r5000_p99_ms=3.00 ", " pg_cpu_ms_per_10k=100.00 ",
		" walsender_cpu_ms_per_10k=25.00 ", " idle_fetch_qps=0.0 ", " poll_eps=100 ", " poll_p99_ms=4.00 ", " poll_pg_cpu_ms_per_10k=200.00 ",
		" poll_idle_fetch_qps=1.0 ", " eps_x=2.00 ", " p99_x=0.50 ", " pg_cpu_x=0.50 ", " relay_cpu_ms_per_10k=50.00 ",
		" busy_cores=1.90 ", " poll_relay_cpu_ms_per_10k=50.00 ", " cpu_x=0.60"} {
		if !strings.Contains(line+" ", want) {
			t.Errorf("line lacks %q:\n%s", want, line)
		}
	}
}

// TestReadStat reads this process's parent and CPU time from /proc.
func TestReadStat(t *testing.T) {
	ppid, cpu, ok := readStat(os.Getpid())
	if !ok || ppid != os.Getppid() || cpu < 0 {
		t.Fatalf("readStat(self) = %d, %s, %v; want the parent %d", ppid, cpu, ok, os.Getppid())
	}
}

// TestSampleHost reads this process's CPU time and the machine's busy time, which only
// grow.
func TestSampleHost(t *testing.T) {
	before, err := sampleHost()
	if err != nil {
		t.Fatal(err)
	}
	for x := 0; time.Since(before.at) < 20*time.Millisecond; x++ {
		_ = x * x // busy: the process's CPU time advances
	}
	after, err := sampleHost()
	if err != nil {
		t.Fatal(err)
	}
	if after.self < before.self || after.busy < before.busy || after.busyCores(before) < 0 {
		t.Fatalf("host CPU went back: %+v then %+v", before, after)
	}
}

// TestCPUSince: a process alive throughout counts its difference, one started since
// counts from zero, one that ended is lost, the walsender's part is apart.
func TestCPUSince(t *testing.T) {
	before := cpuTimes{1: {cpu: time.Second}, 2: {cpu: time.Second}, 3: {cpu: 5 * time.Second}}
	now := cpuTimes{1: {cpu: 3 * time.Second}, 3: {cpu: time.Second, walsender: true}, 4: {cpu: time.Second, walsender: true}}
	all, ws := now.since(before)
	if all != 4*time.Second || ws != 2*time.Second {
		t.Fatalf("since = %s, walsender %s; want 4s, 2s", all, ws)
	}
}

// TestFetchStatementCounted: the idle phase tells the relay's fetches from its other
// statements by their text, as pg_stat_statements keeps it.
func TestFetchStatementCounted(t *testing.T) {
	n, err := pgsql.NewNames(pgsql.Config{Schema: "s"})
	if err != nil {
		t.Fatal(err)
	}
	fetch := regexp.MustCompile(`(?s)ORDER BY o\.seq.*LIMIT`) // statementCounts' LIKE pattern
	for name, sql := range map[string]string{"Fetch": n.Fetch(), "FetchAfter": n.FetchAfter()} {
		if !fetch.MatchString(sql) {
			t.Errorf("%s does not match the idle phase's pattern:\n%s", name, sql)
		}
	}
	for name, sql := range map[string]string{"Complete": n.Complete(), "LeaseHeartbeat": n.LeaseHeartbeat(), "NextDue": n.NextDue()} {
		if fetch.MatchString(sql) {
			t.Errorf("%s would count as a fetch:\n%s", name, sql)
		}
	}
}
