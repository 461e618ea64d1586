// Package outboxpgx is the PostgreSQL driver for pgx v5: it writes messages in a pgx.Tx
// and is the relay's store.
//
//	drv, err := outboxpgx.New(pool, outboxpgx.Config{})
//	w, err := outbox.NewWriter(drv, outbox.WriterConfig{})
//	err = w.Write(ctx, tx, outbox.Message{Topic: "orders", Key: orderID, Payload: body})
package outboxpgx

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/broken"
	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/internal/pgsql/pgxq"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Config names where the outbox lives. The zero value uses the public schema and no
// prefix.
type Config struct {
	// Schema holds the outbox tables. Defaults to "public". Must match [a-z_][a-z0-9_]*.
	Schema string
	// Prefix goes before every table name. Defaults to none. Must match [a-z_][a-z0-9_]*.
	Prefix string
	// RotateRows is how many rows a bucket of the pending ring takes before the next
	// bucket becomes current (schema version 4). Defaults to 2,000. While a snapshot is
	// held open elsewhere in the database, a fetch walks at most about twice this many
	// rows it cannot use; fewer means more frequent rotations.
	RotateRows int
	// MigrateCopyLimit is the most pending messages MigrateUp copies when it makes the
	// pending table a ring (migration 4): the outbox is locked meanwhile, so writers and
	// relays wait about 5 µs a message. Above it MigrateUp refuses and changes nothing.
	// 0 means 100,000; -1 means no limit.
	MigrateCopyLimit int
}

// Driver writes messages in pgx transactions and implements outboxdriver.Store,
// outboxdriver.Listener and outboxdriver.Admin over a pool. It is safe for concurrent
// use.
//
// Status, the dead-letter calls (DeadList, DeadCount, DeadReplay, DeadPurge,
// DeadPurgeAll), SyncLeases and DeletePublished are outboxsql's too: both drivers run the
// same code for them (internal/pgsql), which documents them.
type Driver struct {
	// *shared is embedded so that its methods are the Driver's; the alias keeps the field
	// unexported, out of the API.
	*shared

	pool   *pgxpool.Pool
	names  *pgsql.Names
	stalls *stallWatch  // follows the relay's statements; nil without a pool
	left   leftSessions // listening sessions closed by Listen, which the server may keep

	insertSQL, insertPrioSQL, insertOneSQL, insertFreshSQL, fetchSQL, fetchAfterSQL, fetchPrioSQL, completeSQL string
}

// shared is the logic the Driver shares with outboxsql, over its pool.
type shared = pgsql.DB

var (
	_ outboxdriver.WriteDriver[pgx.Tx] = (*Driver)(nil)
	_ outboxdriver.Store               = (*Driver)(nil)
	_ outboxdriver.Listener            = (*Driver)(nil)
	_ outboxdriver.Admin               = (*Driver)(nil)
)

// Validate checks c as New does: a *outbox.ConfigError names the field at fault.
func (c Config) Validate() error {
	_, err := c.names()
	return err
}

func (c Config) names() (*pgsql.Names, error) {
	return pgsql.NewNames(pgsql.Config{Schema: c.Schema, Prefix: c.Prefix, RotateRows: c.RotateRows, MigrateCopyLimit: c.MigrateCopyLimit})
}

// New returns a driver. pool may be nil when the driver is used only to write in the
// caller's transactions; the relay, migrations and admin calls need it.
func New(pool *pgxpool.Pool, config Config) (*Driver, error) {
	names, err := config.names()
	if err != nil {
		return nil, err
	}
	d := &Driver{
		pool: pool, names: names, left: leftSessions{m: map[uint32]time.Time{}},
		insertSQL:      names.InsertUnnest(false),
		insertPrioSQL:  names.InsertUnnest(true),
		fetchPrioSQL:   names.FetchPriority(),
		insertOneSQL:   names.InsertOne(),
		insertFreshSQL: names.InsertFresh(),
		fetchSQL:       names.Fetch(),
		fetchAfterSQL:  names.FetchAfter(),
		completeSQL:    names.Complete(),
	}
	if pool != nil {
		d.stalls = stallWatchOf(pool)
	}
	d.shared = pgsql.NewDB(names, d.needPool, pgxq.Querier{DB: pool}, d.inTx, d.inSnapshot)
	return d, nil
}

func (d *Driver) needPool() error {
	if d.pool == nil {
		return errors.New("outboxpgx: this call needs a pool: pass one to outboxpgx.New")
	}
	return nil
}

// Insert implements outboxdriver.WriteDriver: one statement for any number of messages.
func (d *Driver) Insert(ctx context.Context, tx pgx.Tx, msgs []outbox.Message) ([]string, error) {
	if tx == nil {
		return nil, errors.New("outboxpgx: nil transaction: Write must run inside the caller's transaction")
	}
	prio := pgsql.HasPriority(msgs)
	if len(msgs) == 1 && !prio {
		return d.insertOne(ctx, tx, &msgs[0])
	}
	n := len(msgs)
	ids := make([][16]byte, n)
	topics, keys, aggs, types, cts, headers, dedups := make([]string, n), make([]string, n), make([]string, n),
		make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	payloads := make([][]byte, n)
	deliver := make([]pgtype.Timestamptz, n)
	for i := range msgs {
		m := &msgs[i]
		ids[i] = m.ID
		topics[i], keys[i], aggs[i], types[i], cts[i], dedups[i] = m.Topic, m.Key, m.AggregateType, m.EventType, m.ContentType, m.DedupKey
		var err error
		if payloads[i], headers[i], deliver[i], err = columns(m); err != nil {
			return nil, err
		}
	}
	args := []any{ids, topics, keys, aggs, types, cts, payloads, headers, dedups, deliver}
	q := d.insertSQL
	if prio {
		prios := make([]int16, n)
		for i := range msgs {
			prios[i] = int16(msgs[i].Priority)
		}
		args, q = append(args, prios), d.insertPrioSQL
	}
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, pgsql.InsertError(err, prio)
	}
	written, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, pgsql.InsertError(err, prio)
	}
	return pgsql.SkippedKeys(msgs, written), nil
}

// Fetch implements outboxdriver.Store.
func (d *Driver) Fetch(ctx context.Context, req outboxdriver.FetchRequest) ([]*outbox.Message, error) {
	if err := d.needPool(); err != nil {
		return nil, err
	}
	sql, args, err := d.fetchStatement(req)
	if err != nil {
		return nil, err
	}
	msgs, err := queryNoJIT(ctx, d, scanMessage, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("fetch: %w", err)
	}
	return msgs, nil
}

// FetchPriority implements outboxdriver.PriorityFetcher (schema version 10).
func (d *Driver) FetchPriority(ctx context.Context, req outboxdriver.FetchRequest) ([]*outbox.Message, error) {
	if err := d.needPool(); err != nil {
		return nil, err
	}
	exclude, limit, held, err := pgsql.PriorityFetchArgs(req)
	if err != nil {
		return nil, err
	}
	msgs, err := queryNoJIT(ctx, d, func(row pgx.CollectableRow) (*outbox.Message, error) {
		m := &outbox.Message{}
		return m, pgsql.ScanMessage(row, m, &m.Priority)
	}, d.fetchPrioSQL, req.RelayID, leasedShards(req.Leases), exclude, limit, held)
	if err != nil {
		return nil, pgsql.PriorityFetchError(err)
	}
	return msgs, nil
}

// queryNoJIT runs one relay query with JIT compilation off, in a single round trip.
//
// The planner cannot know that a fetch stops after Limit rows of a short pending index,
// so on a large backlog, or before the table has statistics, its cost estimate crosses
// jit_above_cost and compiling takes hundreds of milliseconds for a query that runs in a
// few. The setting is local to the batch's implicit transaction: the pool's connections
// are left as they were. A connection that is gone or silent is replaced at once
// (onConn).
func queryNoJIT[T any](ctx context.Context, d *Driver, scan pgx.RowToFunc[T], sql string, args ...any) ([]T, error) {
	return onConn(ctx, d, func(c *pgxpool.Conn) ([]T, error) {
		var out []T
		b := &pgx.Batch{}
		b.Queue("SELECT set_config('jit', 'off', true)")
		b.Queue(sql, args...).Query(func(rows pgx.Rows) error {
			var err error
			out, err = pgx.CollectRows(rows, scan)
			return err
		})
		if err := c.SendBatch(ctx, b).Close(); err != nil {
			return nil, err
		}
		return out, nil
	})
}

func scanMessage(row pgx.CollectableRow) (*outbox.Message, error) {
	m := &outbox.Message{}
	return m, pgsql.ScanMessage(row, m)
}

// Complete implements outboxdriver.Store in one statement.
func (d *Driver) Complete(ctx context.Context, c outboxdriver.Completion) ([]int64, error) {
	if err := d.needPool(); err != nil {
		return nil, err
	}
	a := pgsql.NewCompleteArgs(c)
	applied, err := queryNoJIT(ctx, d, pgx.RowTo[int64], d.completeSQL, c.RelayID, a.Tokens, a.Published,
		a.RetrySeqs, a.RetryErrors, a.RetryDelayMillis, a.DeadSeqs, a.DeadErrors, a.RetryCounts)
	if err != nil {
		return nil, pgsql.CompleteError(err)
	}
	return pgsql.Refused(c, applied), nil
}

// ErrNoPartition is wrapped by Complete's error when the published history has no
// partition for the day an outcome is recorded (schema version 3): the messages stay
// pending, nothing is lost, and Maintain (which every relay runs) or `outbox partitions
// create` creates the day.
var ErrNoPartition = pgsql.ErrNoPartition

// ErrCopyLimit is wrapped by MigrateUp's error when making the pending table a ring
// (migration 4) would copy more pending messages than Config.MigrateCopyLimit.
var ErrCopyLimit = pgsql.ErrCopyLimit

// MigrateCopyLimitDefault is Config.MigrateCopyLimit's default.
const MigrateCopyLimitDefault = pgsql.MigrateCopyLimitDefault

// RotateRowsDefault is Config.RotateRows's default.
const RotateRowsDefault = pgsql.RotateRowsDefault

// Maintain implements outboxdriver.Maintainer: the published history's daily partitions are
// created 7 days ahead and dropped whole once older than the retention time, and expired
// dedup keys are deleted in batches of req.Limit. Every relay calls it; one at a time does
// the work (an advisory lock), and DDL gives up after a short lock_timeout and is tried
// again at the next call. Before migration 3 it deletes expired published rows instead.
func (d *Driver) Maintain(ctx context.Context, req outboxdriver.MaintainRequest) (outboxdriver.Maintenance, error) {
	m, err := d.names.Maintain(ctx, d.inTx, req)
	if err != nil {
		return m, fmt.Errorf("maintenance: %w", err)
	}
	return m, nil
}

// Recycle implements outboxdriver.Recycler (schema version 4): retired buckets of the pending
// ring whose rows are nearly all gone are emptied with TRUNCATE, their few pending rows
// moved to the current bucket first with their seq, and the ring moves on once the
// current bucket has taken Config.RotateRows rows. Every relay calls it about every
// second; one at a time does the work. Before migration 4 it does nothing.
func (d *Driver) Recycle(ctx context.Context) (outboxdriver.Recycling, error) {
	r, err := d.names.Recycle(ctx, d.inTx)
	if err != nil {
		return r, fmt.Errorf("recycle: %w", err)
	}
	return r, nil
}

// Served returns the ids of the outbox's live relays other than self, and whether a
// backlog waits: at least backlog messages that have waited longer than waited while
// they could be sent (due, and not behind a message of their key that is not). It is
// for a process serving many outboxes that leaves this one to another process's relay:
// it takes over when none is live, and helps with a backlog.
func (d *Driver) Served(ctx context.Context, self string, waited time.Duration, backlog int) (others []string, waiting bool, err error) {
	if err := d.needPool(); err != nil {
		return nil, false, err
	}
	_, err = onConn(ctx, d, func(c *pgxpool.Conn) (struct{}, error) {
		return struct{}{}, c.QueryRow(ctx, d.names.Served(), self, waited.Milliseconds(), max(backlog, 1)).Scan(&others, &waiting)
	})
	if err != nil {
		return nil, false, fmt.Errorf("served: %w", err)
	}
	return others, waiting, nil
}

// Partitions returns the UTC days of published history that have a partition, oldest
// first (none before migration 3).
func (d *Driver) Partitions(ctx context.Context) ([]time.Time, error) {
	return d.names.ListPartitions(ctx, d.inTx)
}

// CreatePartitions makes sure every UTC day from today to today + ahead has its
// partition, and returns the days it created (with dryRun, would create). It returns
// ErrBusy when another process holds the maintenance lock.
func (d *Driver) CreatePartitions(ctx context.Context, ahead int, dryRun bool) ([]time.Time, error) {
	days, ran, err := d.names.CreatePartitions(ctx, d.inTx, ahead, dryRun)
	if err == nil && !ran {
		err = ErrBusy
	}
	return days, err
}

// DropPartitions drops the days of published history that ended more than retention ago,
// and the history kept from before migration 3 once that migration is older than
// retention (legacy). With dryRun it only says what it would drop. It returns ErrBusy
// when another process holds the maintenance lock.
func (d *Driver) DropPartitions(ctx context.Context, retention time.Duration, dryRun bool) (days []time.Time, legacy bool, err error) {
	days, legacy, ran, err := d.names.DropPartitions(ctx, d.inTx, retention, dryRun)
	if err == nil && !ran {
		err = ErrBusy
	}
	return days, legacy, err
}

// ErrBusy: another process (a relay, most likely) is maintaining the outbox right now;
// try again in a moment.
var ErrBusy = errors.New("another process is maintaining the outbox; try again in a moment")

func (d *Driver) insertOne(ctx context.Context, tx pgx.Tx, m *outbox.Message) ([]string, error) {
	payload, headers, deliver, err := columns(m)
	if err != nil {
		return nil, err
	}
	q := d.insertOneSQL
	if m.DedupKey == "" {
		q = d.insertFreshSQL
	}
	var written string
	err = tx.QueryRow(ctx, q, [16]byte(m.ID), m.Topic, m.Key, m.AggregateType, m.EventType, m.ContentType,
		payload, headers, m.DedupKey, deliver).Scan(&written)
	switch {
	case errors.Is(err, pgx.ErrNoRows): // the dedup key is taken
		return []string{m.DedupKey}, nil
	case err != nil:
		return nil, fmt.Errorf("outbox insert: %w", err)
	}
	return nil, nil
}

// columns encodes the columns of m that the insert does not take as they are: the
// payload (never NULL), the headers as JSON text, and the delivery time (NULL: now).
func columns(m *outbox.Message) (payload []byte, headers string, deliver pgtype.Timestamptz, err error) {
	payload = m.Payload
	if payload == nil {
		payload = []byte{}
	}
	if !m.DeliverAt.IsZero() {
		deliver = pgtype.Timestamptz{Time: m.DeliverAt, Valid: true}
	}
	headers, err = pgsql.EncodeHeaders(m.Headers)
	return payload, headers, deliver, err
}

// Listen implements outboxdriver.Listener with LISTEN on a connection of its own, which
// also holds the outbox's gate while the relay waits (schema version 7), so that the
// gate goes with the session that receives the notifications. Neither works through
// PgBouncer in transaction pooling mode (the session is not kept): the gate is never
// taken there, asks go unanswered, and the relay polls.
func (d *Driver) Listen(ctx context.Context, wake func(outboxdriver.Wake, int64), gate outboxdriver.Gate) error {
	if err := d.needPool(); err != nil {
		return err
	}
	pc, err := d.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := pc.Hijack() // a listening session must not go back to the pool
	defer conn.Close(context.WithoutCancel(ctx))
	// Each statement on the session is followed by the stall watch, and the session is
	// checked after every verdict: a silent listening session would otherwise only miss
	// notifications.
	watched := func(f func() error) error { return d.stalls.follow(conn.PgConn(), f) }
	exec := func(sql string, args ...any) error {
		return watched(func() error { _, err := conn.Exec(ctx, sql, args...); return err })
	}
	queryRow := func(sql string, args []any, dest ...any) error {
		return watched(func() error { return conn.QueryRow(ctx, sql, args...).Scan(dest...) })
	}
	if err := exec("LISTEN " + d.names.ChannelIdent); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	var version int
	var started time.Time // the session's, which with its process ID names it
	if err := queryRow(`SELECT (`+d.names.SchemaVersion()+`), (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid())`,
		nil, &version, &started); err != nil {
		return fmt.Errorf("listen: read the schema version: %w", err)
	}
	pid := conn.PgConn().PID()
	defer d.left.add(pid, started)   // before the close: the next Listen may ask at once
	answer := outboxdriver.GateArmed // what an ask gets without asking the database; GateArmed: ask it
	if version < pgsql.GateVersion {
		answer = outboxdriver.GateAlways
	}
	// The session can hold the gate only if it is kept from one statement to the next,
	// which its own notification coming back proves: through PgBouncer in transaction
	// pooling mode it never does (LISTEN is lost), and the gate, taken by whichever
	// server process ran the statement, would stay with that process. Asks wait for it.
	probe, verified := pgsql.NotifyProbe(), answer != outboxdriver.GateArmed
	if !verified {
		if err := exec("SELECT pg_notify($1, $2)", d.names.Channel, probe); err != nil {
			return fmt.Errorf("listen: %w", err)
		}
	}
	held, deferred := false, false
	w := &waiter{conn: conn}
	fctx, stop := context.WithCancel(ctx)
	defer stop() // the next Listen takes the asks
	go w.forward(fctx, gate.Asks, d.stalls)
	wake(outboxdriver.WakeWritten, 0) // anything written before LISTEN took effect
	for {
		n, ev, err := w.next(ctx)
		asked := ev == waitAsked
		if err == nil && ev == waitNotified && n.Payload == probe {
			verified, asked = true, deferred
		}
		switch {
		case err != nil:
			return err
		case ev == waitCheck:
			if err := exec("SELECT 1"); err != nil {
				return fmt.Errorf("listen: %w", err)
			}
		case asked && !verified:
			deferred = true
		case asked && (held || answer != outboxdriver.GateArmed):
			gate.Answer(answer)
		case asked:
			state, err := d.takeGate(queryRow, pid)
			if err != nil {
				return fmt.Errorf("listen: %w", err)
			}
			switch state {
			case outboxdriver.GateArmed:
				held = true
			case outboxdriver.GateUnavailable:
				answer = state
			}
			gate.Answer(state)
		case pgsql.IsNotifyProbe(n.Payload): // ours, answered above, or another relay's
		case n.Payload == pgsql.NotifyLeases:
			wake(outboxdriver.WakeLeases, 0)
		default:
			wake(outboxdriver.WakeWritten, pgsql.NotifiedFrom(n.Payload))
			if !held {
				continue
			}
			// The relay is busy again: writers stop notifying.
			var ok bool
			if err := queryRow(d.names.GateRelease(), []any{pid}, &ok); err != nil {
				return fmt.Errorf("listen: let go of the gate: %w", err)
			}
			if !ok {
				return errors.New("listen: the listening session moved to another server process (PgBouncer in transaction pooling mode?); " +
					"the gate stays with the process that took it until that process ends, and writers notify meanwhile: " +
					"give the relay a direct connection or a session-mode pool")
			}
			held = false
		}
	}
}

// takeGate asks for the outbox's gate on the listening session of pid, and says what a
// relay's ask gets: GateArmed (the session holds it now), GateCovered (another relay's
// session holds it), GateBusy (writers are between their insert and their commit, or a
// session this driver's listener closed held it and was ended: ask again shortly) or
// GateUnavailable (the statement ran in another server process than the session's).
func (d *Driver) takeGate(queryRow func(sql string, args []any, dest ...any) error, pid uint32) (outboxdriver.GateState, error) {
	var state string
	if err := queryRow(d.names.GateArm(), []any{pid}, &state); err != nil {
		return 0, fmt.Errorf("take the gate: %w", err)
	}
	var answer outboxdriver.GateState
	switch state {
	case "armed":
		answer = outboxdriver.GateArmed
	case "covered":
		// A session this driver's listener closed may still hold the gate, if the
		// server has not heard of the close (the network was silent), or has not ended
		// the session yet. It will not let go at a notification: end it, and have the
		// relay ask again shortly.
		ended, err := d.left.endHolder(queryRow, d.names.WakeKey)
		if err != nil {
			return 0, err
		}
		if ended {
			return outboxdriver.GateBusy, nil
		}
		answer = outboxdriver.GateCovered
	case "busy":
		answer = outboxdriver.GateBusy
	default: // "moved"
		answer = outboxdriver.GateUnavailable
	}
	d.left.clear() // none of them holds the gate
	return answer, nil
}

// leftSessions are the listening sessions Listen has closed, by process ID, with the
// time each started (which tells it from a later session given the same process ID). A
// server keeps a session whose close it did not hear of (the network was silent) until
// TCP keepalive ends it, hours later, and ends one that it did hear of a moment after
// Listen returns. If such a session holds the gate, the next Listen would be told the
// gate is covered, and the session would never let go at a notification, or would end
// without one: writers would notify until then, and the relay not be woken after.
type leftSessions struct {
	mu sync.Mutex
	m  map[uint32]time.Time
}

// maxLeftSessions bounds the sessions remembered: Listen forgets them at every answer
// that shows none of them holds the gate, so only a listener closed again and again
// with no ask in between adds up.
const maxLeftSessions = 64

func (s *leftSessions) add(pid uint32, started time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.m) >= maxLeftSessions {
		for p := range s.m {
			delete(s.m, p)
			break
		}
	}
	s.m[pid] = started
}

func (s *leftSessions) clear() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.m)
}

// endHolder ends the session that holds the gate (advisory lock key), if it is one
// Listen closed, and says whether the caller should ask for the gate again: it ended
// that session, or the gate was let go of since the caller found it held (a session
// ended before, and still ending then, has gone meanwhile).
func (s *leftSessions) endHolder(queryRow func(sql string, args []any, dest ...any) error, key int64) (ended bool, err error) {
	s.mu.Lock()
	empty := len(s.m) == 0
	s.mu.Unlock()
	if empty {
		return false, nil
	}
	var pid int32
	var started time.Time
	// A bigint advisory key is shown as its high and low halves.
	err = queryRow(`SELECT l.pid, a.backend_start FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.classid::bigint = $1 AND l.objid::bigint = $2 AND l.objsubid = 1
		AND l.mode = 'ExclusiveLock' AND l.granted AND a.backend_start IS NOT NULL`,
		[]any{int64(uint32(key >> 32)), int64(uint32(key))}, &pid, &started)
	if errors.Is(err, pgx.ErrNoRows) { // it let go meanwhile
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("look the gate's holder up: %w", err)
	}
	s.mu.Lock()
	at, ok := s.m[uint32(pid)]
	s.mu.Unlock()
	if !ok || !at.Equal(started) || broken.Has(broken.GateKeepsLeft) {
		return false, nil
	}
	var signalled bool
	if err := queryRow("SELECT pg_terminate_backend($1)", []any{pid}, &signalled); err != nil {
		return false, fmt.Errorf("end a session closed before: %w", err)
	}
	return true, nil
}

// waiter waits on a listening connection for a notification, the relay's ask or a
// check after a stall verdict, whichever comes first: an ask or a check interrupts the
// wait, and the connection stays usable.
type waiter struct {
	conn   *pgx.Conn
	mu     sync.Mutex
	asked  bool               // an ask not yet answered
	check  bool               // a check not yet made
	cancel context.CancelFunc // interrupts the wait in progress
}

// waitEvent is what ended a wait.
type waitEvent int

const (
	waitNotified waitEvent = iota
	waitAsked
	waitCheck
)

// forward takes the relay's asks (none when asks is nil) and the stall watch's verdicts
// until ctx ends.
func (w *waiter) forward(ctx context.Context, asks <-chan struct{}, stalls *stallWatch) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-asks:
			w.interrupt(&w.asked)
		case <-stalls.stalls():
			w.interrupt(&w.check)
		}
	}
}

func (w *waiter) interrupt(flag *bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	*flag = true
	if w.cancel != nil {
		w.cancel()
	}
}

// next returns the next notification, or what interrupted the wait first. A
// notification received along with an interruption comes first; the interruption
// stays for the next call.
func (w *waiter) next(ctx context.Context) (*pgconn.Notification, waitEvent, error) {
	w.mu.Lock()
	if ev := w.takeLocked(); ev != waitNotified {
		w.mu.Unlock()
		return nil, ev, nil
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w.cancel = cancel
	w.mu.Unlock()
	n, err := w.conn.WaitForNotification(wctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cancel = nil
	if err == nil || ctx.Err() != nil {
		return n, waitNotified, err
	}
	if ev := w.takeLocked(); ev != waitNotified {
		return nil, ev, nil
	}
	return n, waitNotified, err
}

// takeLocked takes a pending interruption, checks first.
func (w *waiter) takeLocked() waitEvent {
	switch {
	case w.check:
		w.check = false
		return waitCheck
	case w.asked:
		w.asked = false
		return waitAsked
	}
	return waitNotified
}
