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
// An audit slot (test_decoding), made before any message is written and consumed as the
// run goes (so that it keeps little WAL: WAL runs cap what a slot may keep, see
// wal-slot-lost), gives each insert into the outbox and the position of its
// transaction's commit; a sampler reads the
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
	drops   int             // slot drops announced (dropped), each ending a generation
	remade  int             // times the audit slot itself was lost and made again
	txns    []auditTxn      // the outbox's transactions, in commit order, as consumed

	consuming sync.Mutex // one consume at a time: a slot has one reader
}

// auditTxn is a transaction that inserted into the outbox: its commit's position and the
// seqs it inserted.
type auditTxn struct {
	commit uint64
	seqs   []int64
}

// slotSample is the relays' slot's confirmed position at a time. gen counts the slots:
// a slot dropped and made anew (wal-slot-drop) starts a new generation, whose first
// position is its creation point, past commits it never covered.
type slotSample struct {
	at  time.Time
	lsn uint64
	gen int
}

// dropped announces that the relays' slot was dropped, or lost (a lost slot is not
// sampled): a sample taken from now on is of a slot made since, if any.
func (a *slotAudit) dropped() {
	if a == nil {
		return
	}
	a.mu.Lock()
	a.drops++
	a.mu.Unlock()
}

// slotAuditEvery is how often the sampler reads the relays' slot; slotAuditConsumeEvery
// how often the audit slot is consumed.
const (
	slotAuditEvery        = 10 * time.Millisecond
	slotAuditConsumeEvery = 200 * time.Millisecond
)

// startSlotAudit makes the audit slot and starts the sampler of the relays' slot; call it
// after 'outbox wal setup' and before the workload.
func startSlotAudit(tb testenv.TB, db *testdb.DB, slot string) *slotAudit {
	tb.Helper()
	ctx := testenv.Context(tb)
	a := &slotAudit{db: db, slot: slot, name: "audit_" + db.Schema, waited: map[string]bool{}}
	if _, err := db.Pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'test_decoding')`, a.name); err != nil {
		tb.Fatalf("slot audit: %v", err)
	}
	tb.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, a.name)
	})
	// The sampler's queries end with the run; a consume is let finish: cut off, its
	// backend can hold the audit slot a while after the session is gone, and check's
	// own consume would find the slot in use.
	sctx, cancel := context.WithCancel(context.Background())
	quit := make(chan struct{})
	done := make(chan struct{}, 2)
	go func() {
		defer func() { done <- struct{}{} }()
		a.sample(sctx)
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		t := time.NewTicker(slotAuditConsumeEvery)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			// A failed consume (the server restarting, a session killed) is tried
			// again at the next tick; check's own must succeed.
			cctx, ccancel := context.WithTimeout(context.Background(), testenv.Stall())
			_ = a.consume(cctx)
			ccancel()
		}
	}()
	a.stop = sync.OnceFunc(func() {
		cancel()
		close(quit)
		<-done
		<-done
	})
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
	var last slotSample
	for {
		// The generation is read before the slot: a drop announced by now was done
		// before the query, which then sees the slot made since, or none.
		a.mu.Lock()
		s := slotSample{gen: a.drops}
		a.mu.Unlock()
		err := a.db.Pool.QueryRow(ctx, `SELECT clock_timestamp(), coalesce((confirmed_flush_lsn - '0/0')::bigint, 0)
FROM pg_replication_slots WHERE slot_name = $1 AND wal_status IS DISTINCT FROM 'lost'`, a.slot).Scan(&s.at, &s.lsn)
		if err == nil && s.lsn != 0 && (s.lsn != last.lsn || s.gen != last.gen) {
			last = s
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

// consume takes what the audit slot decoded since the last call, which moves the slot
// on: each transaction that inserted into the outbox, with its commit's position. The
// slot decodes whole transactions, each at its commit, so a call never ends inside one.
func (a *slotAudit) consume(ctx context.Context) error {
	if a == nil {
		return nil
	}
	a.consuming.Lock()
	defer a.consuming.Unlock()
	got, err := a.changes(ctx)
	if pgsql.SQLState(err) == "55000" { // the audit slot was lost too (wal-slot-lost)
		return a.remake(ctx)
	}
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.txns = append(a.txns, got...)
	a.mu.Unlock()
	return nil
}

// remake drops the audit slot PostgreSQL invalidated and makes it again: the commits in
// between go unaudited (the sampler's positions stay), and the check says how often.
// Held on: a logical slot's restart position moves only at the server's snapshots of
// running transactions, so a long transaction in the workload can keep the audit slot
// behind a wal-slot-lost's WAL even though it is consumed every 200 ms.
func (a *slotAudit) remake(ctx context.Context) error {
	if _, err := a.db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, a.name); err != nil {
		return fmt.Errorf("drop the lost audit slot: %w", err)
	}
	if _, err := a.db.Pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'test_decoding')`, a.name); err != nil {
		return fmt.Errorf("make the audit slot again: %w", err)
	}
	a.mu.Lock()
	a.remade++
	a.mu.Unlock()
	return nil
}

// changes takes what the audit slot decoded since the last call.
func (a *slotAudit) changes(ctx context.Context) ([]auditTxn, error) {
	rows, err := a.db.Pool.Query(ctx, `SELECT (lsn - '0/0')::bigint, data FROM pg_logical_slot_get_changes($1, NULL, NULL)`, a.name)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var got []auditTxn
	var open []int64
	for rows.Next() {
		var lsn uint64
		var data string
		if err := rows.Scan(&lsn, &data); err != nil {
			return nil, err
		}
		switch {
		case len(data) > 6 && data[:6] == "BEGIN ":
			open = open[:0]
		case len(data) > 7 && data[:7] == "COMMIT ":
			if len(open) > 0 {
				got = append(got, auditTxn{commit: lsn, seqs: append([]int64(nil), open...)})
			}
		default:
			if m := auditInsert.FindStringSubmatch(data); m != nil {
				seq, _ := strconv.ParseInt(m[1], 10, 64)
				open = append(open, seq)
			}
		}
	}
	return got, rows.Err()
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
	remade          int // the audit slot was lost and made again: commits in between unaudited
}

// check stops the sampler and audits the run.
func (a *slotAudit) check(ctx context.Context) (auditResult, error) {
	a.stop()
	// What committed since the last consume. The slot can still be held by the backend
	// of a session a fault ended (a relay's database cut mid-consume): wait for it.
	var last error
	err := testenv.Progress(ctx, "the audit slot's last consume", testenv.Stall(), func() (any, bool) {
		last = a.consume(ctx)
		return last, pgsql.SQLState(last) != "55006"
	})
	if err == nil {
		err = last
	}
	if err != nil {
		return auditResult{}, err
	}
	a.mu.Lock() // the sampler and consumer have stopped: these no longer change
	txns, samples, waited, remade := a.txns, a.samples, a.waited, a.remade
	a.mu.Unlock()
	// When each message was recorded, of the keys that never had a waiting message.
	s := pgx.Identifier{a.db.Schema}.Sanitize()
	recorded := map[int64]time.Time{}
	rows, err := a.db.Pool.Query(ctx, `SELECT p.seq, p.key, p.published_at FROM `+s+`.outbox_published p
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
	res.remade = remade
	// Where each generation's slot began: its first position.
	born := map[int]uint64{}
	for _, sm := range samples {
		if _, ok := born[sm.gen]; !ok {
			born[sm.gen] = sm.lsn
		}
	}
	i := 0
	for _, x := range txns { // commit order: the first sample past each commit only moves forward
		for i < len(samples) && samples[i].lsn <= x.commit {
			i++
		}
		if i == len(samples) {
			break
		}
		passed := samples[i]
		if born[passed.gen] > x.commit {
			continue // a slot made after this commit never covered it: the table does
		}
		res.checked++
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
