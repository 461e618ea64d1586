package chaos

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

// slotAudit checks WAL mode's slot rule from outside the relays (docs/design-wal.md, §2):
// the slot's confirmed position passes a transaction only once each of its messages was
// recorded, or shown to be the polling path's (not due, behind a waiting message of its
// key, in a shard the reader does not hold).
//
// An audit slot (test_decoding), made before any message is written, gives each insert
// into the outbox and the position of its transaction's commit; a sampler reads the
// relays' slot's confirmed position every few milliseconds, with the database's clock;
// outbox_published says when each message was recorded (published_at: the start of the
// recording transaction, so before its commit). A sample that had passed a commit while
// one of its messages was recorded after the sample is an acknowledgement that ran ahead.
// Nothing a correct relay does can produce one: it acknowledges after the record
// commits, and the sample reads the acknowledgement after that.
//
// Only messages whose key never had a waiting message count: a rejected or deferred
// message (its destination unavailable: no attempt counted) is settled by the record of
// its failure, and it and the rest of its key wait, handed to polling, while the slot
// moves on. Waiting keys are read at every sample, and rejected and dead-lettered ones
// at the end. And only runs with one relay count (with several, a new reader hands the
// shards it does not hold yet to their holders).
type slotAudit struct {
	db         *testdb.DB
	slot, name string // the relays' slot, the audit slot
	stop       func()

	mu      sync.Mutex
	samples []slotSample    // in time order, one per change of position
	waited  map[string]bool // keys seen with a waiting message
}

type slotSample struct {
	at  time.Time
	lsn uint64
}

// slotAuditEvery is how often the sampler reads the relays' slot.
const slotAuditEvery = 10 * time.Millisecond

// startSlotAudit makes the audit slot and starts the sampler; call it after 'outbox wal
// setup' and before the workload.
func startSlotAudit(tb testenv.TB, db *testdb.DB) *slotAudit {
	tb.Helper()
	ctx := testenv.Context(tb)
	names, err := pgsql.NewNames(pgsql.Config{Schema: db.Schema})
	if err != nil {
		tb.Fatal(err)
	}
	a := &slotAudit{db: db, name: "audit_" + db.Schema, waited: map[string]bool{}}
	a.slot, _ = names.WALDefaults()
	if _, err := db.Pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'test_decoding')`, a.name); err != nil {
		tb.Fatalf("slot audit: %v", err)
	}
	tb.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, a.name)
	})
	sctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.sample(sctx)
	}()
	a.stop = func() { cancel(); <-done }
	tb.Cleanup(a.stop) // a run that fails before its check; stopping twice is harmless
	return a
}

// sample records the relays' slot's confirmed position when it changes. A failed read
// (the server restarting, a session killed) is skipped: a gap in the samples can hide an
// acknowledgement that ran ahead, never invent one.
func (a *slotAudit) sample(ctx context.Context) {
	t := time.NewTicker(slotAuditEvery)
	defer t.Stop()
	waiting := `SELECT DISTINCT key FROM ` + pgx.Identifier{a.db.Schema}.Sanitize() + `.outbox WHERE next_attempt_at > created_at`
	var last uint64
	for {
		var s slotSample
		err := a.db.Pool.QueryRow(ctx, `SELECT clock_timestamp(), coalesce((confirmed_flush_lsn - '0/0')::bigint, 0)
FROM pg_replication_slots WHERE slot_name = $1`, a.slot).Scan(&s.at, &s.lsn)
		if err == nil && s.lsn != last {
			last = s.lsn
			a.mu.Lock()
			a.samples = append(a.samples, s)
			a.mu.Unlock()
		}
		if keys, err := a.db.Pool.Query(ctx, waiting); err == nil {
			var k string
			_, _ = pgx.ForEachRow(keys, []any{&k}, func() error {
				a.mu.Lock()
				a.waited[k] = true
				a.mu.Unlock()
				return nil
			})
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// auditInsert matches test_decoding's line for an insert into a bucket of the pending
// ring, and takes its seq.
var auditInsert = regexp.MustCompile(`^table \S*\.\"?outbox_b\d+\"?: INSERT: seq\[bigint\]:(\d+) `)

// auditResult is what the audit found: how many transactions the slot was acknowledged
// past while one of their messages was not recorded, with an example, out of how many
// transactions checked against how many positions.
type auditResult struct {
	ahead           int
	example         string
	checked, passed int
}

// check stops the sampler and audits the run.
func (a *slotAudit) check(ctx context.Context) (auditResult, error) {
	a.stop()
	// Each outbox insert and its commit's position, in commit order.
	type txn struct {
		commit uint64
		seqs   []int64
	}
	var txns []txn
	var open []int64
	rows, err := a.db.Pool.Query(ctx, `SELECT (lsn - '0/0')::bigint, data FROM pg_logical_slot_peek_changes($1, NULL, NULL)`, a.name)
	if err != nil {
		return auditResult{}, err
	}
	for rows.Next() {
		var lsn uint64
		var data string
		if err := rows.Scan(&lsn, &data); err != nil {
			rows.Close()
			return auditResult{}, err
		}
		switch {
		case len(data) > 6 && data[:6] == "BEGIN ":
			open = open[:0]
		case len(data) > 7 && data[:7] == "COMMIT ":
			if len(open) > 0 {
				txns = append(txns, txn{commit: lsn, seqs: append([]int64(nil), open...)})
			}
		default:
			if m := auditInsert.FindStringSubmatch(data); m != nil {
				seq, _ := strconv.ParseInt(m[1], 10, 64)
				open = append(open, seq)
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return auditResult{}, err
	}
	// When each message was recorded, of the keys that never had a waiting message.
	s := pgx.Identifier{a.db.Schema}.Sanitize()
	a.mu.Lock()
	samples, waited := a.samples, a.waited
	a.mu.Unlock()
	recorded := map[int64]time.Time{}
	rows, err = a.db.Pool.Query(ctx, `SELECT p.seq, p.key, p.published_at FROM `+s+`.outbox_published p
WHERE NOT EXISTS (SELECT 1 FROM `+s+`.outbox_published r WHERE r.key = p.key AND r.attempts > 0)
  AND NOT EXISTS (SELECT 1 FROM `+s+`.outbox_dead d WHERE d.key = p.key)`)
	if err != nil {
		return auditResult{}, err
	}
	for rows.Next() {
		var seq int64
		var key string
		var at time.Time
		if err := rows.Scan(&seq, &key, &at); err != nil {
			rows.Close()
			return auditResult{}, err
		}
		if !waited[key] {
			recorded[seq] = at
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return auditResult{}, err
	}
	var res auditResult
	res.passed = len(samples)
	i := 0
	for _, x := range txns { // commit order: the first sample past each commit only moves forward
		for i < len(samples) && samples[i].lsn <= x.commit {
			i++
		}
		if i == len(samples) {
			break
		}
		res.checked++
		passed := samples[i]
		for _, seq := range x.seqs {
			if at, ok := recorded[seq]; ok && at.After(passed.at) {
				res.ahead++
				if res.example == "" {
					res.example = fmt.Sprintf("slot: confirmed %X at %s, past the commit at %X of seq %d, recorded at %s",
						passed.lsn, passed.at.Format("15:04:05.000000"), x.commit, seq, at.Format("15:04:05.000000"))
				}
				break
			}
		}
	}
	return res, nil
}
