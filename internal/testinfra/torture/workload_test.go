package torture

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testproxy"
)

func connect(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, testdb.URL()) }

// setup returns a fresh migrated schema with the business tables and keys aggregates,
// and a connection to it.
func setup(t *testing.T, keys int) (*testdb.DB, *pgx.Conn) {
	t.Helper()
	db := testdb.Migrated(t)
	ctx := context.Background()
	conn, err := connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if err := Prepare(ctx, conn, db.Schema, keys); err != nil {
		t.Fatal(err)
	}
	return db, conn
}

// readOutbox reads the outbox back directly, standing in for a relay and a broker: the
// rows of the pending and published tables, in store order, as deliveries, and the dead
// table as the dead letters.
func readOutbox(t *testing.T, conn *pgx.Conn, schema string) *DeliveryLog {
	t.Helper()
	ctx := context.Background()
	s := pgx.Identifier{schema}.Sanitize()
	rows, err := conn.Query(ctx, fmt.Sprintf(`SELECT id, key, payload, headers FROM (
SELECT seq, id, key, payload, headers FROM %[1]s.outbox
UNION ALL SELECT seq, id, key, payload, headers FROM %[1]s.outbox_published) m ORDER BY seq`, s))
	if err != nil {
		t.Fatal(err)
	}
	log := &DeliveryLog{}
	for rows.Next() {
		var id [16]byte
		var key string
		var body []byte
		var headers map[string]string
		if err := rows.Scan(&id, &key, &body, &headers); err != nil {
			t.Fatal(err)
		}
		if headers == nil {
			headers = map[string]string{}
		}
		headers[outbox.HeaderID], headers[outbox.HeaderKey] = outbox.ID(id).String(), key
		d, err := ParseDelivery(headers, body)
		if err != nil {
			t.Fatal(err)
		}
		log.Add(d)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if err := log.LoadDead(ctx, conn, schema); err != nil {
		t.Fatal(err)
	}
	return log
}

// killPoison dead-letters every pending event carrying PoisonHeader, as a relay does
// once the broker has refused it often enough.
func killPoison(t *testing.T, db *testdb.DB, conn *pgx.Conn) {
	t.Helper()
	rows, err := conn.Query(context.Background(), fmt.Sprintf(`SELECT id FROM %s.outbox WHERE headers ? $1`, pgx.Identifier{db.Schema}.Sanitize()), PoisonHeader)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[[16]byte])
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		db.Kill(t, id, 5, "broker refused: poison", 0)
	}
}

// TestWorkload runs the generator for a few seconds with rollbacks, long transactions,
// large payloads and poison, then checks the history against the outbox tables: every
// committed event there, no rolled-back one, per key seqs in order, consecutive and
// gapless.
func TestWorkload(t *testing.T) {
	const keys = 16
	db, conn := setup(t, keys)
	ctx := context.Background()
	h := &History{}
	w, err := StartWorkload(ctx, WorkloadConfig{
		Connect: connect, Schema: db.Schema, Writers: 4, Keys: keys, Seed: 42, Rate: 300,
		RollbackShare: 0.2, LongShare: 0.05, LongHold: 400 * time.Millisecond,
		LargeShare: 0.02, PoisonShare: 0.02,
	}, h)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // the workload's length: a few seconds of history, whatever the machine's speed
	// ... and at least the kinds of transaction the checks below need, however slow the writers.
	testenv.Await(t, "100 committed transactions with rollbacks, long transactions and large events", func() (any, bool) {
		var committed, rolledBack, long, large int
		for _, tx := range h.Txns() {
			switch tx.Outcome {
			case Committed:
				committed++
			case RolledBack:
				rolledBack++
			}
			if tx.Long {
				long++
			}
			for _, e := range tx.Events {
				if e.Size > LargeSizeDefault {
					large++
				}
			}
		}
		seen := fmt.Sprintf("%d committed, %d rolled back, %d long, %d large events", committed, rolledBack, long, large)
		return seen, committed >= 100 && rolledBack > 0 && long > 0 && large > 0
	})
	if err := w.Stop(testenv.Context(t)); err != nil {
		t.Fatal(err)
	}
	if err := h.Resolve(ctx, conn, db.Schema); err != nil {
		t.Fatal(err)
	}

	var long, large, committedTxns, rolledBackTxns int
	for _, tx := range h.Txns() {
		if tx.Err != "" {
			t.Errorf("writer %d: %s", tx.Writer, tx.Err)
		}
		if tx.Long {
			long++
		}
		for _, e := range tx.Events {
			if e.Size > LargeSizeDefault {
				large++
			}
		}
		switch tx.Outcome {
		case Committed:
			committedTxns++
		case RolledBack:
			rolledBackTxns++
		}
	}
	if committedTxns < 100 || rolledBackTxns == 0 || long == 0 || large == 0 {
		t.Fatalf("workload too thin: %d committed, %d rolled back, %d long transactions, %d large events", committedTxns, rolledBackTxns, long, large)
	}

	killPoison(t, db, conn)
	log := readOutbox(t, conn, db.Schema)
	var jsonl bytes.Buffer
	if err := h.WriteJSONL(&jsonl); err != nil || bytes.Count(jsonl.Bytes(), []byte("\n")) != committedTxns+rolledBackTxns {
		t.Fatalf("history.jsonl: %d lines, %v", bytes.Count(jsonl.Bytes(), []byte("\n")), err)
	}
	r := Check(h, log, Bounds{})
	r.Label, r.Seed = "workload pg-readback", 42
	t.Log(r)
	for _, e := range r.Examples {
		t.Log("  ", e)
	}
	if !r.OK() || r.Dup != 0 || r.Poison == 0 || r.RolledBack == 0 {
		t.Fatalf("history and outbox disagree: %s", r)
	}

	// The same read-back catches a real loss: drop one committed, undelivered row.
	db.Exec(t, `DELETE FROM %[1]s.outbox WHERE seq = (SELECT min(seq) FROM %[1]s.outbox)`)
	if r := Check(h, readOutbox(t, conn, db.Schema), Bounds{}); r.Lost != 1 || r.OK() {
		t.Fatalf("one row deleted: %s", r)
	}

	// Per committed aggregate, the seqs are exactly 1..aggregates.seq, each once.
	seqs := map[string][]int64{}
	for _, tx := range h.Txns() {
		if tx.Outcome == Committed {
			for _, e := range tx.Events {
				seqs[e.Key] = append(seqs[e.Key], e.Seq)
			}
		}
	}
	rows, err := conn.Query(ctx, fmt.Sprintf(`SELECT id, seq FROM %s.%s`, pgx.Identifier{db.Schema}.Sanitize(), AggregatesTable))
	if err != nil {
		t.Fatal(err)
	}
	last, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct {
		id  string
		seq int64
	}, error) {
		var v struct {
			id  string
			seq int64
		}
		return v, row.Scan(&v.id, &v.seq)
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range last {
		got := seqs[a.id]
		slices.Sort(got)
		for i, s := range got {
			if s != int64(i+1) {
				t.Fatalf("key %s: committed seqs %v are not 1..%d without gaps", a.id, got, a.seq)
			}
		}
		if int64(len(got)) != a.seq {
			t.Fatalf("key %s: %d committed events, aggregate at seq %d", a.id, len(got), a.seq)
		}
	}
}

// TestWorkloadSurvivesTerminate terminates writers' backends at random while the
// workload runs (a small nemesis): writers record the failed transactions, reconnect and
// carry on, Resolve settles the unknown COMMITs, and history and outbox still agree.
func TestWorkloadSurvivesTerminate(t *testing.T) {
	const keys, writers = 8, 4
	db, conn := setup(t, keys)
	ctx := context.Background()
	h := &History{}
	w, err := StartWorkload(ctx, WorkloadConfig{
		Connect: connect, Schema: db.Schema, Writers: writers, Keys: keys, Seed: 7, Rate: 400,
		LongShare: 0.1, LongHold: 200 * time.Millisecond, XIDFirstShare: 0.2,
	}, h)
	if err != nil {
		t.Fatal(err)
	}
	rnd := rand.New(rand.NewPCG(7, 7))
	kills := 0
	for range 10 {
		time.Sleep(200 * time.Millisecond) // paces the kills
		if pid := w.BackendPID(rnd.IntN(writers)); pid != 0 {
			if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
				t.Fatal(err)
			}
			kills++
		}
	}
	killed := time.Now()
	tally := func() (failed, after int) {
		for _, tx := range h.Txns() {
			if tx.Err != "" {
				failed++
			}
			if tx.Outcome == Committed && tx.Start.After(killed) {
				after++
			}
		}
		return failed, after
	}
	// The writers carry on after the kills: a failed transaction and then commits.
	testenv.Await(t, "a failed transaction and a commit after the last kill", func() (any, bool) {
		failed, after := tally()
		return fmt.Sprintf("%d failed, %d committed after the last kill", failed, after), kills == 0 || failed > 0 && after > 0
	})
	if err := w.Stop(testenv.Context(t)); err != nil {
		t.Fatal(err)
	}
	_, _, unknown, _ := h.Counts()
	if err := h.Resolve(ctx, conn, db.Schema); err != nil {
		t.Fatal(err)
	}
	failed, after := tally()
	if kills == 0 || failed == 0 || after == 0 {
		t.Fatalf("%d kills, %d failed transactions, %d committed after the last kill", kills, failed, after)
	}
	r := Check(h, readOutbox(t, conn, db.Schema), Bounds{Faults: kills})
	r.Label, r.Seed = "workload terminate", 7
	t.Logf("%s (%d transactions failed, %d unknown COMMITs resolved)", r, failed, unknown)
	for _, e := range r.Examples {
		t.Log("  ", e)
	}
	if !r.OK() {
		t.Fatalf("history and outbox disagree: %s", r)
	}
}

// TestResolveKilledCommit kills a writer's connection while its COMMIT runs (a deferred
// trigger makes COMMIT wait for an advisory lock the test holds, so the kill lands inside
// COMMIT however slow the machine) and checks that the writer records Unknown and Resolve
// settles it from the database: rolled back when the backend is terminated mid-COMMIT,
// committed when only the client goes away and the backend finishes the COMMIT.
func TestResolveKilledCommit(t *testing.T) {
	for _, tc := range []struct {
		name string
		kill func(t *testing.T, conn *pgx.Conn, pid uint32, cancel context.CancelFunc, proxy *testproxy.Proxy)
		want Outcome
	}{
		{"pg_terminate_backend", func(t *testing.T, conn *pgx.Conn, pid uint32, _ context.CancelFunc, _ *testproxy.Proxy) {
			if _, err := conn.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid); err != nil {
				t.Error(err)
			}
		}, RolledBack},
		// pgx closes a connection whose context ends by sending a CancelRequest first:
		// the server cancels the COMMIT in progress.
		{"context cancelled", func(_ *testing.T, _ *pgx.Conn, _ uint32, cancel context.CancelFunc, _ *testproxy.Proxy) {
			cancel()
		}, RolledBack},
		// The network dies: the client's socket is reset and its CancelRequest cannot
		// get through, so the backend finishes the COMMIT nobody hears about.
		{"connection cut", func(_ *testing.T, _ *pgx.Conn, _ uint32, _ context.CancelFunc, proxy *testproxy.Proxy) {
			proxy.Cut()
		}, Committed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, conn := setup(t, 1)
			ctx := context.Background()
			s := pgx.Identifier{db.Schema}.Sanitize()
			// COMMIT runs the trigger, which waits for the lock keyed by the schema's name
			// until the test lets go of it.
			if _, err := conn.Exec(ctx, fmt.Sprintf(`CREATE FUNCTION %[1]s.slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_advisory_xact_lock(hashtext(TG_TABLE_SCHEMA)); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON %[1]s.%[2]s DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION %[1]s.slow_commit()`, s, LedgerTable)); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtext($1))`, db.Schema); err != nil {
				t.Fatal(err)
			}
			h := &History{}
			w, err := newWorkload(ctx, WorkloadConfig{Connect: connect, Schema: db.Schema, Keys: 1, MaxEventsPerTx: 1,
				RollbackShare: -1, LongShare: -1, LargeShare: -1}, h)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := pgx.ParseConfig(testdb.URL())
			if err != nil {
				t.Fatal(err)
			}
			proxy := testproxy.New(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
			host, port, _ := net.SplitHostPort(proxy.Addr())
			p, _ := strconv.Atoi(port)
			cfg.Host, cfg.Port = host, uint16(p)
			wconn, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer wconn.Close(ctx)
			pid := wconn.PgConn().PID()
			txCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			done := make(chan Txn, 1)
			go func() { done <- w.txn(txCtx, wconn, 0, w.plan(rand.New(rand.NewPCG(1, 0)))) }()

			const waiting = "wait_event_type = 'Lock' AND wait_event = 'advisory'"
			waitBackend(t, conn, pid, waiting, 1) // inside COMMIT
			tc.kill(t, conn, pid, cancel, proxy)
			var rec Txn
			testenv.AwaitCond(t, "the writer to record its transaction", func() bool {
				select {
				case rec = <-done:
					return true
				default:
					return false
				}
			})
			if rec.Outcome != Unknown {
				t.Fatalf("writer recorded %s (%s), want unknown", rec.Outcome, rec.Err)
			}
			if tc.want == RolledBack {
				waitBackend(t, conn, pid, waiting, 0) // the kill reached the backend before the lock is free
			}
			if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock(hashtext($1))`, db.Schema); err != nil {
				t.Fatal(err)
			}
			waitBackend(t, conn, pid, "state = 'active'", 0) // the COMMIT has finished either way
			h.Record(rec)
			if err := h.Resolve(ctx, conn, db.Schema); err != nil {
				t.Fatal(err)
			}
			got := h.Txns()[0]
			if got.Outcome != tc.want || !got.Resolved {
				t.Fatalf("resolved to %s (resolved %t), want %s", got.Outcome, got.Resolved, tc.want)
			}
			if n := db.CountAll(t, "true"); (n == 1) != (tc.want == Committed) {
				t.Fatalf("%d outbox rows for a %s transaction", n, tc.want)
			}
		})
	}
}

// waitBackend waits until `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND
// where` returns want.
func waitBackend(t *testing.T, conn *pgx.Conn, pid uint32, where string, want int) {
	t.Helper()
	testenv.Await(t, fmt.Sprintf("backend %d: %d rows of pg_stat_activity where %s", pid, want, where), func() (any, bool) {
		var n int
		if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND `+where, pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n, n == want
	})
}
