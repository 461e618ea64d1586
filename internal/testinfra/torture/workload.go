package torture

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxpgx"
)

// Names of the business tables the workload keeps next to the outbox, in the same schema.
const (
	// AggregatesTable holds one row per key; its seq column is the key's last sequence
	// number, incremented under the row lock.
	AggregatesTable = "aggregates"
	// LedgerTable holds one row per event written, in the same transaction: the ground
	// truth Resolve reads, which survives the relay's cleanup of published rows.
	LedgerTable = "torture_ledger"
)

// PoisonHeader marks a poison event; the runner makes the broker side refuse it.
const PoisonHeader = "Torture-Poison"

// Defaults for WorkloadConfig.
const (
	WritersDefault        = 4
	KeysDefault           = 64
	MaxEventsPerTxDefault = 3
	RollbackShareDefault  = 0.1
	LongShareDefault      = 0.01
	LongHoldDefault       = 2 * time.Second
	XIDFirstShareDefault  = 0.005
	LargeShareDefault     = 0.005
	LargeSizeDefault      = 256 << 10
	FillerDefault         = 64
	TopicDefault          = "torture"
)

// WorkloadConfig configures a Workload. Shares are probabilities per transaction (per
// event for LargeShare and PoisonShare).
type WorkloadConfig struct {
	// Connect opens one writer's own connection. Required. Writers never share a
	// connection, so a fault can be aimed at one (see Workload.BackendPID).
	Connect func(ctx context.Context) (*pgx.Conn, error)
	// Schema holds the outbox (migrated) and the business tables (see Prepare). Required.
	Schema string
	// Writers is the number of concurrent writers. Defaults to 4.
	Writers int
	// Keys is the number of aggregates. Must match what Prepare created. Defaults to 64.
	Keys int
	// MaxEventsPerTx: each transaction writes 1 to MaxEventsPerTx events of its key.
	// Defaults to 3.
	MaxEventsPerTx int
	// RollbackShare of transactions roll back after writing. Defaults to 0.1; negative
	// means none.
	RollbackShare float64
	// LongShare of transactions are held open for LongHold after writing, before their
	// commit or rollback: the commit-order trap for cursor pollers. Defaults to 0.01;
	// negative means none.
	LongShare float64
	// LongHold is how long a long transaction stays open. Defaults to 2s.
	LongHold time.Duration
	// XIDFirstShare of transactions take their transaction id before waiting for the
	// aggregate's lock, so xid order differs from lock and commit order for the same key
	// (the trap of relays that order by xid). Defaults to 0.005; negative means none.
	XIDFirstShare float64
	// LargeShare of events carry a payload of LargeSize bytes. Defaults to 0.005;
	// negative means none.
	LargeShare float64
	// LargeSize is the size of a large payload. Defaults to 256 KiB.
	LargeSize int
	// PoisonShare of events carry PoisonHeader. Defaults to none.
	PoisonShare float64
	// Filler is the random filler in an ordinary payload, in bytes. Defaults to 64.
	Filler int
	// Rate caps transactions per second across all writers. Zero means no cap.
	Rate float64
	// MaxTxns stops each writer after that many transactions. Zero means no limit.
	MaxTxns int
	// Topic of every event. Defaults to "torture".
	Topic string
	// AggregateType, when set, gives the aggregate type of a key's events (routing rules
	// can send keys to different destinations by it). Default: "torture" for every key.
	AggregateType func(key string) string
	// Seed makes the writers' choices (keys, sizes, rollbacks, long and poison events,
	// filler) replay: writer i draws from PCG(Seed, i). Event ids are fresh UUIDv7s and
	// the interleaving of writers is the scheduler's, so a replay is the same workload,
	// not the same history.
	Seed uint64
}

func (c WorkloadConfig) withDefaults() WorkloadConfig {
	c.Writers = cmp.Or(c.Writers, WritersDefault)
	c.Keys = cmp.Or(c.Keys, KeysDefault)
	c.MaxEventsPerTx = cmp.Or(c.MaxEventsPerTx, MaxEventsPerTxDefault)
	c.RollbackShare = cmp.Or(c.RollbackShare, RollbackShareDefault)
	c.LongShare = cmp.Or(c.LongShare, LongShareDefault)
	c.LongHold = cmp.Or(c.LongHold, LongHoldDefault)
	c.XIDFirstShare = cmp.Or(c.XIDFirstShare, XIDFirstShareDefault)
	c.LargeShare = cmp.Or(c.LargeShare, LargeShareDefault)
	c.LargeSize = cmp.Or(c.LargeSize, LargeSizeDefault)
	c.Filler = cmp.Or(c.Filler, FillerDefault)
	c.Topic = cmp.Or(c.Topic, TopicDefault)
	return c
}

// KeyName is the aggregate id of key number i.
func KeyName(i int) string { return fmt.Sprintf("agg-%05d", i) }

// Prepare creates the business tables in schema (which must exist) and one aggregate row
// per key, at seq 0.
func Prepare(ctx context.Context, conn *pgx.Conn, schema string, keys int) error {
	s := pgx.Identifier{schema}.Sanitize()
	keys = cmp.Or(keys, KeysDefault)
	names := make([]string, keys)
	for i := range names {
		names[i] = KeyName(i)
	}
	q := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %[1]s.%[2]s (id text PRIMARY KEY, seq bigint NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS %[1]s.%[3]s (event_id uuid PRIMARY KEY, key text NOT NULL, seq bigint NOT NULL, checksum bytea NOT NULL)`,
		s, AggregatesTable, LedgerTable)
	if _, err := conn.Exec(ctx, q); err != nil {
		return fmt.Errorf("torture: create business tables: %w", err)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.%s (id) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING`, s, AggregatesTable), names); err != nil {
		return fmt.Errorf("torture: insert aggregates: %w", err)
	}
	return nil
}

// Workload runs writers against PostgreSQL and records every transaction in a History.
// Start it with StartWorkload; its methods are safe for concurrent use.
type Workload struct {
	cfg     WorkloadConfig
	h       *History
	writer  *outbox.Writer[pgx.Tx]
	ctx     context.Context
	cancel  context.CancelFunc // hard stop: in-flight statements fail
	stop    chan struct{}      // soft stop: no new transactions
	stopped chan struct{}
	once    sync.Once
	pids    []atomic.Uint32

	rateMu sync.Mutex
	next   time.Time

	errMu sync.Mutex
	errs  []error
}

// StartWorkload starts cfg.Writers writers recording into h and returns at once. The
// writers run until Stop, or until each has run MaxTxns transactions; ctx's values reach
// them but not its cancellation (use Stop).
func StartWorkload(ctx context.Context, cfg WorkloadConfig, h *History) (*Workload, error) {
	w, err := newWorkload(ctx, cfg, h)
	if err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	for i := range w.cfg.Writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(w.ctx, i)
		}()
	}
	go func() {
		wg.Wait()
		close(w.stopped)
	}()
	return w, nil
}

// newWorkload returns a workload whose writers are not started.
func newWorkload(ctx context.Context, cfg WorkloadConfig, h *History) (*Workload, error) {
	if cfg.Connect == nil {
		return nil, errors.New("torture: WorkloadConfig.Connect is required")
	}
	if cfg.Schema == "" {
		return nil, errors.New("torture: WorkloadConfig.Schema is required")
	}
	if h == nil {
		return nil, errors.New("torture: nil History")
	}
	cfg = cfg.withDefaults()
	drv, err := outboxpgx.New(nil, outboxpgx.Config{Schema: cfg.Schema})
	if err != nil {
		return nil, err
	}
	ow, err := outbox.NewWriter(drv, outbox.WriterConfig{})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	return &Workload{cfg: cfg, h: h, writer: ow, ctx: ctx, cancel: cancel, stop: make(chan struct{}), stopped: make(chan struct{}),
		pids: make([]atomic.Uint32, cfg.Writers)}, nil
}

// Stop asks the writers to start no new transaction and waits for the ones in flight
// to finish (drain). If ctx ends first, in-flight statements are cancelled (their COMMITs
// may become Unknown) and Stop waits for the writers to record them. It returns the
// writers' connection errors, if any were fatal. Stopping twice is safe.
func (w *Workload) Stop(ctx context.Context) error {
	w.once.Do(func() { close(w.stop) })
	select {
	case <-w.stopped:
	case <-ctx.Done():
		w.cancel()
		<-w.stopped
	}
	w.cancel()
	w.errMu.Lock()
	defer w.errMu.Unlock()
	return errors.Join(w.errs...)
}

// Stopped is closed once every writer has returned.
func (w *Workload) Stopped() <-chan struct{} { return w.stopped }

// BackendPID returns the PostgreSQL backend pid of writer i's current connection (0
// between connections), to aim pg_terminate_backend at it.
func (w *Workload) BackendPID(i int) uint32 { return w.pids[i].Load() }

func (w *Workload) fail(err error) {
	w.errMu.Lock()
	w.errs = append(w.errs, err)
	w.errMu.Unlock()
}

// wait blocks until the shared rate limit allows one more transaction. It returns false
// when the workload stops meanwhile.
func (w *Workload) wait() bool {
	if w.cfg.Rate <= 0 {
		select {
		case <-w.stop:
			return false
		default:
			return true
		}
	}
	w.rateMu.Lock()
	now := time.Now()
	at := w.next
	if at.Before(now) {
		at = now
	}
	w.next = at.Add(time.Duration(float64(time.Second) / w.cfg.Rate))
	w.rateMu.Unlock()
	t := time.NewTimer(time.Until(at))
	defer t.Stop()
	select {
	case <-w.stop:
		return false
	case <-t.C:
		return true
	}
}

// run is writer i's loop: connect, write transactions, reconnect after a lost connection.
func (w *Workload) run(ctx context.Context, i int) {
	rnd := rand.New(rand.NewPCG(w.cfg.Seed, uint64(i)))
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			// Bounds a hang of the close only: nothing is recorded after it.
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = conn.Close(closeCtx)
			cancel()
		}
	}()
	backoff := 10 * time.Millisecond
	for n := 0; w.cfg.MaxTxns == 0 || n < w.cfg.MaxTxns; n++ {
		if !w.wait() {
			return
		}
		if conn == nil || conn.IsClosed() {
			w.pids[i].Store(0)
			c, err := w.cfg.Connect(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				select { // the database may be down on purpose: retry, do not record
				case <-w.stop:
					w.fail(fmt.Errorf("writer %d: connect: %w", i, err))
					return
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, time.Second)
				n--
				continue
			}
			conn, backoff = c, 10*time.Millisecond
			w.pids[i].Store(c.PgConn().PID())
		}
		plan := w.plan(rnd)
		w.h.Record(w.txn(ctx, conn, i, plan))
		if ctx.Err() != nil {
			return
		}
	}
}

// txnPlan is one transaction's random choices, drawn before it starts.
type txnPlan struct {
	key      string
	n        int
	rollback bool
	long     bool
	xidFirst bool
	hold     time.Duration
	large    []bool
	poison   []bool
	filler   [][]byte
}

func (w *Workload) plan(rnd *rand.Rand) txnPlan {
	c := w.cfg
	p := txnPlan{key: KeyName(rnd.IntN(c.Keys)), n: 1 + rnd.IntN(c.MaxEventsPerTx)}
	p.rollback = rnd.Float64() < c.RollbackShare
	p.long = rnd.Float64() < c.LongShare
	p.xidFirst = rnd.Float64() < c.XIDFirstShare
	if p.long {
		p.hold = c.LongHold/2 + time.Duration(rnd.Int64N(int64(c.LongHold)))
	}
	for range p.n {
		large := rnd.Float64() < c.LargeShare
		size := c.Filler
		if large {
			size = c.LargeSize
		}
		p.large = append(p.large, large)
		p.poison = append(p.poison, rnd.Float64() < c.PoisonShare)
		p.filler = append(p.filler, filler(rnd, size))
	}
	return p
}

const fillerAlphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

func filler(rnd *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = fillerAlphabet[rnd.IntN(len(fillerAlphabet))]
	}
	return b
}

// errPlannedRollback ends a transaction the plan rolls back.
var errPlannedRollback = errors.New("planned rollback")

// txn runs one planned transaction on conn and returns its record. The outcome is
// Committed only when COMMIT succeeded, RolledBack when COMMIT was never sent (planned
// rollback, or an earlier statement failed) or the server answered it with ROLLBACK, and
// Unknown when the COMMIT call itself failed.
func (w *Workload) txn(ctx context.Context, conn *pgx.Conn, writer int, p txnPlan) Txn {
	t := Txn{Writer: writer, Long: p.long, Start: time.Now()}
	done := func(o Outcome, err error) Txn {
		t.Outcome, t.End = o, time.Now()
		if err != nil && !errors.Is(err, errPlannedRollback) {
			t.Err = err.Error()
		}
		return t
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return done(RolledBack, err)
	}
	abort := func(err error) Txn {
		// Bounds a hang only: a rollback cut short closes the connection, and the server
		// rolls back all the same, so the outcome recorded holds either way.
		rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = tx.Rollback(rbCtx)
		cancel()
		return done(RolledBack, err)
	}
	s := pgx.Identifier{w.cfg.Schema}.Sanitize()
	if p.xidFirst {
		if _, err := tx.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
			return abort(fmt.Errorf("take xid: %w", err))
		}
	}
	var last int64
	// The per-key sequence comes from the aggregate row, under its lock: this is the
	// order consumers must see.
	if err := tx.QueryRow(ctx, fmt.Sprintf(`UPDATE %s.%s SET seq = seq + $2 WHERE id = $1 RETURNING seq`, s, AggregatesTable),
		p.key, p.n).Scan(&last); err != nil {
		return abort(fmt.Errorf("lock aggregate %s: %w", p.key, err))
	}
	msgs := make([]outbox.Message, p.n)
	ids := make([][16]byte, p.n)
	seqs := make([]int64, p.n)
	sums := make([][]byte, p.n)
	for j := range p.n {
		seq := last - int64(p.n) + int64(j) + 1
		id := outbox.NewID()
		body, err := json.Marshal(payload{ID: id.String(), Key: p.key, Seq: seq, Filler: string(p.filler[j])})
		if err != nil {
			return abort(err)
		}
		m := outbox.Message{ID: id, Topic: w.cfg.Topic, Key: p.key, AggregateType: "torture", EventType: "torture.event",
			Payload: body, ContentType: outbox.ContentTypeJSON}
		if w.cfg.AggregateType != nil {
			m.AggregateType = w.cfg.AggregateType(p.key)
		}
		if p.poison[j] {
			m.Headers = map[string]string{PoisonHeader: "1"}
		}
		sum := Checksum(body)
		msgs[j] = m
		ids[j], seqs[j], sums[j] = id, seq, sum[:]
		t.Events = append(t.Events, Event{ID: id, Key: p.key, Seq: seq, Sum: sum, Poison: p.poison[j], Size: len(body)})
	}
	if err := w.writer.Write(ctx, tx, msgs...); err != nil {
		return abort(fmt.Errorf("write events: %w", err))
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.%s (event_id, key, seq, checksum) SELECT unnest($1::uuid[]), $2, unnest($3::bigint[]), unnest($4::bytea[])`, s, LedgerTable),
		ids, p.key, seqs, sums); err != nil {
		return abort(fmt.Errorf("write ledger: %w", err))
	}
	if p.long {
		select {
		case <-time.After(p.hold):
		case <-ctx.Done():
		}
	}
	if p.rollback {
		return abort(errPlannedRollback)
	}
	err = tx.Commit(ctx)
	switch {
	case err == nil:
		return done(Committed, nil)
	case errors.Is(err, pgx.ErrTxCommitRollback):
		return done(RolledBack, err)
	default:
		return done(Unknown, fmt.Errorf("commit: %w", err))
	}
}
