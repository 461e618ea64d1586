package bench

import (
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testmysql"
	"github.com/outboxkit/outbox/internal/testinfra/testnats"
)

// TestLineWithPolling: with Source wal the line carries WAL mode's figures under the
// usual keys, polling's as poll_*, and their ratios.
func TestLineWithPolling(t *testing.T) {
	load := func(cpu time.Duration, fetch float64) *ServerLoad {
		return &ServerLoad{CPUPer10k: cpu, WalsenderPer10k: cpu / 4, RelayCPUPer10k: 50 * time.Millisecond, BusyCores: 1.9, IdleQPS: 3, IdleFetchQPS: fetch}
	}
	r := Result{DB: "postgres", Source: SourceWAL, Events: 100, Relays: 1, Rate: 1000,
		Phases: Phases{EPS: 200, P99: 2 * time.Millisecond, Server: load(100*time.Millisecond, 0),
			Extra:   []RateLatency{{Rate: 5000, P50: time.Millisecond, P95: time.Millisecond, P99: 3 * time.Millisecond}},
			Writers: &WritersPhase{Writers: 64, WriterEPS: 3000, P99: 9 * time.Millisecond, CommitP99: 5 * time.Millisecond}}}
	poll := Phases{EPS: 100, P99: 4 * time.Millisecond, Server: load(200*time.Millisecond, 1),
		Writers: &WritersPhase{Writers: 64, WriterEPS: 2000, P99: 7 * time.Millisecond, CommitP99: 6 * time.Millisecond}}
	r.Poll = &poll
	line := r.String()
	for _, want := range []string{" source=wal ", " eps=200 ", " p99_ms=2.00 ", " r5000_p99_ms=3.00 ", " pg_cpu_ms_per_10k=100.00 ",
		" walsender_cpu_ms_per_10k=25.00 ", " idle_fetch_qps=0.0 ", " poll_eps=100 ", " poll_p99_ms=4.00 ", " poll_pg_cpu_ms_per_10k=200.00 ",
		" poll_idle_fetch_qps=1.0 ", " eps_x=2.00 ", " p99_x=0.50 ", " pg_cpu_x=0.50 ", " relay_cpu_ms_per_10k=50.00 ",
		" busy_cores=1.90 ", " poll_relay_cpu_ms_per_10k=50.00 ", " cpu_x=0.60", " writer_eps=3000 ", " poll_writer_eps=2000 ",
		" poll_writers_p99_ms=7.00 ", " poll_writer_commit_p99_ms=6.00 ", " writer_eps_x=1.50 "} {
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

// TestWritersNaiveReference runs a tiny writers phase on PostgreSQL and on MySQL: with our
// writers' rate it measures the naive table's in the same run, and both commit latencies.
// Figures are not judged here; that each was measured, and that writer_x is the ratio of
// the two rates, is.
func TestWritersNaiveReference(t *testing.T) {
	testnats.Conn(t, "") // the shared server the runs publish to; missing, it fails here
	for db, url := range map[string]string{DBPostgres: testdb.URL(), DBMySQL: testmysql.DSN()} {
		t.Run(db, func(t *testing.T) {
			t.Parallel()
			res, err := Run(testenv.Context(t), Config{DB: db, DatabaseURL: url, BrokerURL: testnats.URL(),
				Events: 500, Keys: 50, Duration: -1, Writers: 4, WritersDuration: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			w := res.Writers
			if w == nil {
				t.Fatalf("no writers phase in %+v", res)
			}
			for name, v := range map[string]float64{"WriterEPS": w.WriterEPS, "NaiveEPS": w.NaiveEPS, "X": w.X,
				"NaiveEvents": float64(w.NaiveEvents), "CommitP50": float64(w.CommitP50), "CommitP99": float64(w.CommitP99),
				"NaiveCommitP50": float64(w.NaiveCommitP50), "NaiveCommitP99": float64(w.NaiveCommitP99)} {
				if v <= 0 {
					t.Errorf("%s = %v, want a positive figure: %+v", name, v, w)
				}
			}
			if w.X != w.WriterEPS/w.NaiveEPS {
				t.Errorf("X = %v, want WriterEPS/NaiveEPS = %v", w.X, w.WriterEPS/w.NaiveEPS)
			}
			fields := lineFields(res.String())
			for _, key := range []string{"writer_eps", "naive_writer_eps", "writer_x", "writer_commit_p50_ms", "writer_commit_p99_ms",
				"naive_commit_p50_ms", "naive_commit_p99_ms", "writers_p99_ms"} {
				if v, err := strconv.ParseFloat(fields[key], 64); err != nil || v <= 0 {
					t.Errorf("%s=%q, want a positive figure:\n%s", key, fields[key], res)
				}
			}
			if want := strconv.FormatFloat(w.WriterEPS/w.NaiveEPS, 'f', 2, 64); fields["writer_x"] != want {
				t.Errorf("writer_x=%s, want writer_eps/naive_writer_eps = %s", fields["writer_x"], want)
			}
		})
	}
}

// TestWritersPool: the writers phase's pool writes ours and the naive table's rows, the
// naive one with its id, its id's text as the dedup key and the JSON payload as given.
func TestWritersPool(t *testing.T) {
	for db, url := range map[string]string{DBPostgres: testdb.URL(), DBMySQL: testmysql.DSN()} {
		t.Run(db, func(t *testing.T) {
			t.Parallel()
			ctx := testenv.Context(t)
			d, err := openDatabase(ctx, Config{DB: db, DatabaseURL: url}, randomTag())
			if err != nil {
				t.Fatal(err)
			}
			defer d.drop()
			pool, err := d.writers(ctx, 3)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.close()
			if err := pool.write(ctx, []outbox.Message{{Topic: "orders", Key: "k", Payload: []byte("x")}}); err != nil {
				t.Fatal(err)
			}
			e := naiveEvent{ID: outbox.NewID(), AggregateType: "orders", AggregateID: "writer-0-0", EventType: "order.placed", Payload: jsonPayload(20)}
			if err := pool.naive(ctx, e); err != nil {
				t.Fatal(err)
			}
			var payload, dedup string
			switch d := d.(type) {
			case *postgres:
				err = d.pool.QueryRow(ctx, `SELECT payload::text, dedup_key FROM "`+d.schema+`".`+naiveTable+` WHERE id = $1`, [16]byte(e.ID)).Scan(&payload, &dedup)
			case *sqlDatabase:
				err = d.db.QueryRowContext(ctx, `SELECT payload, dedup_key FROM `+naiveTable+` WHERE id = ?`, e.ID[:]).Scan(&payload, &dedup)
			}
			if err != nil {
				t.Fatalf("read the naive row back: %v", err)
			}
			var got, want any
			if err := json.Unmarshal([]byte(payload), &got); err != nil {
				t.Fatalf("payload %q: %v", payload, err)
			}
			_ = json.Unmarshal([]byte(e.Payload), &want)
			if !reflect.DeepEqual(got, want) || dedup != e.ID.String() {
				t.Errorf("naive row: payload %s, dedup_key %s; want %s, %s", payload, dedup, e.Payload, e.ID)
			}
		})
	}
}

// TestWritersJSONPayload: the naive table's payload is JSON of exactly our payload's size.
func TestWritersJSONPayload(t *testing.T) {
	for n := 1; n <= 140; n++ {
		if p := jsonPayload(n); len(p) != n || !json.Valid([]byte(p)) {
			t.Errorf("jsonPayload(%d) = %q: %d bytes, valid JSON %v", n, p, len(p), json.Valid([]byte(p)))
		}
	}
}

// TestWritersLine: the line carries the naive reference's keys when it was measured, and
// leaves them out when it was not (SQLite); the commit latencies are there either way.
func TestWritersLine(t *testing.T) {
	w := &WritersPhase{Writers: 4, Events: 100, WriterEPS: 50, RelayEPS: 50, CommitP50: time.Millisecond, CommitP99: 3 * time.Millisecond,
		NaiveEPS: 200, X: 0.25, NaiveEvents: 400, NaiveCommitP50: time.Millisecond / 2, NaiveCommitP99: 2 * time.Millisecond}
	r := Result{DB: "postgres", Phases: Phases{Writers: w}}
	line := r.String() + " "
	for _, want := range []string{" writer_eps=50 ", " naive_writer_eps=200 ", " writer_x=0.25 ", " writer_commit_p50_ms=1.00 ",
		" writer_commit_p99_ms=3.00 ", " naive_commit_p50_ms=0.50 ", " naive_commit_p99_ms=2.00 "} {
		if !strings.Contains(line, want) {
			t.Errorf("line lacks %q:\n%s", want, line)
		}
	}
	w.NaiveEPS, w.X, w.NaiveEvents, w.NaiveCommitP50, w.NaiveCommitP99 = 0, 0, 0, 0, 0
	line = r.String() + " "
	if strings.Contains(line, "naive_") || strings.Contains(line, "writer_x=") || !strings.Contains(line, " writer_commit_p99_ms=3.00 ") {
		t.Errorf("without a reference, want no naive_* and no writer_x, with writer_commit_*:\n%s", line)
	}
}

// lineFields splits a `bench: key=value ...` line.
func lineFields(line string) map[string]string {
	fields := map[string]string{}
	for _, kv := range strings.Fields(line) {
		k, v, _ := strings.Cut(kv, "=")
		fields[k] = v
	}
	return fields
}
