package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/childproc"
	"github.com/outboxkit/outbox/outboxpgx"
)

// A fleet run (Config.Outboxes) measures `outbox relay` processes serving many outboxes
// from one config file, as a team with a schema per tenant runs them: what the
// outboxes cost while idle, how fast one of them drains a backlog next to a relay
// that serves it alone, and whether that drain holds back the outboxes that have a
// trickle of messages meanwhile. The relays are processes of their own, started with
// Config.Command, so that what is counted (statements, sessions, memory) is theirs.

// FleetResult is what a fleet run measured.
type FleetResult struct {
	Outboxes, Processes int
	// IdleQPS is the transactions per second the fleet's database ran while every
	// outbox was idle, per process (the bench runs none meanwhile); IdleConns the relay
	// processes' sessions to it then, and RSSMiB their resident memory, both per process.
	IdleQPS, IdleConns, RSSMiB float64
	// PeakRSSMiB is the largest peak resident memory of one process over the run.
	PeakRSSMiB float64
	// Events is the backlog one outbox drains: at DrainEPS in the fleet, at SoloEPS with
	// the same number of processes serving that outbox alone.
	Events            int
	DrainEPS, SoloEPS float64
	// Trickle outboxes get Rate events a second between them, from the fleet, all
	// along; their COMMIT -> arrival latency without a drain (TrickleP50/P99), during
	// the solo drain (SoloP50/P99: the drain is another process's) and during the
	// fleet's (DrainP50/P99: the fleet's processes drain it).
	Trickle, Rate          int
	TrickleP50, TrickleP99 time.Duration
	SoloP50, SoloP99       time.Duration
	DrainP50, DrainP99     time.Duration
}

// String is the one-line summary, `bench: key=value ...`.
func (r FleetResult) String() string {
	return fmt.Sprintf("bench: outboxes=%d processes=%d idle_qps=%.1f idle_conns=%.0f rss_mib=%.0f peak_rss_mib=%.0f"+
		" events=%d drain_eps=%.0f solo_eps=%.0f drain_x=%.2f"+
		" trickle_outboxes=%d rate=%d trickle_p50_ms=%s trickle_p99_ms=%s solo_trickle_p50_ms=%s solo_trickle_p99_ms=%s"+
		" drain_trickle_p50_ms=%s drain_trickle_p99_ms=%s fair_p99_x=%.2f solo_p99_x=%.2f",
		r.Outboxes, r.Processes, r.IdleQPS, r.IdleConns, r.RSSMiB, r.PeakRSSMiB,
		r.Events, r.DrainEPS, r.SoloEPS, div(r.DrainEPS, r.SoloEPS),
		r.Trickle, r.Rate, msText(r.TrickleP50), msText(r.TrickleP99), msText(r.SoloP50), msText(r.SoloP99),
		msText(r.DrainP50), msText(r.DrainP99), div(float64(r.DrainP99), float64(r.TrickleP99)), div(float64(r.SoloP99), float64(r.TrickleP99)))
}

// fleetStall is how long a fleet run waits for something that makes no progress (a
// message to arrive, the relays to find the outboxes) before it gives up.
const fleetStall = time.Minute

// RunFleet makes cfg.Outboxes outboxes, one per schema, and one more (solo), in a
// database of their own on the PostgreSQL server of cfg.DatabaseURL (dropped at the
// end), and measures, with cfg.Relays processes each time:
//
//  1. idle: relays serving every outbox but solo (outbox relay --config, with a
//     schemas: rule), once they found them all, with nothing written: IdleQPS,
//     IdleConns, RSSMiB;
//  2. trickle: a tenth of the outboxes get cfg.Rate events a second between them, one
//     per transaction, for cfg.Duration and on through the drains: TrickleP50/P99,
//     COMMIT returned -> the message read from the broker;
//  3. solo drain: relays of its own (outbox relay --schema solo) drain a backlog of
//     cfg.Events committed in one transaction into solo: SoloEPS, the reference, and
//     the trickle's SoloP50/P99 meanwhile;
//  4. fleet drain: the fleet's relays drain the same backlog committed into an outbox
//     that does not trickle: DrainEPS, and the trickle's DrainP50/P99 meanwhile.
//
// The broker must be one the bench can read from (NATS).
func RunFleet(ctx context.Context, cfg Config) (FleetResult, error) {
	cfg = cfg.withDefaults()
	res := FleetResult{Outboxes: cfg.Outboxes, Processes: cfg.Relays, Events: cfg.Events, Rate: cfg.Rate}
	switch {
	case cfg.Outboxes < 2:
		return res, errors.New("bench: a fleet run needs 2 outboxes or more: one drains, the others trickle")
	case cfg.DB != DBPostgres || cfg.Source != SourcePoll:
		return res, errors.New("bench: a fleet run serves the schemas of a PostgreSQL database, polling: use --db postgres --source poll")
	case len(cfg.Command) == 0:
		return res, errors.New("bench: a fleet run needs the command that runs `outbox` (Config.Command)")
	case cfg.Duration <= 0:
		return res, errors.New("bench: a fleet run measures the trickle for --duration: it must be positive")
	}
	res.Trickle = min(max(cfg.Outboxes/10, 1), cfg.Outboxes-1)
	say := func(format string, args ...any) { fmt.Fprintf(cfg.Progress, "bench: "+format+"\n", args...) }
	tag := randomTag()

	target, err := openTarget(ctx, cfg.BrokerURL)
	if err != nil {
		return res, err
	}
	defer target.Close()
	rd, ok := target.(reader)
	if !ok {
		return res, fmt.Errorf("bench: a fleet run reads what the relays publish, which it cannot on %s: use a nats:// broker", cfg.BrokerURL)
	}
	route, topicRoute, dropDest, err := rd.PrepareTopics(ctx, "bench_fleet_"+tag)
	if err != nil {
		return res, err
	}
	defer dropDest()

	fdb, err := createFleetDB(ctx, cmp.Or(cfg.DatabaseURL, localPostgres), "outbox_bench_"+tag, say)
	if err != nil {
		return res, err
	}
	defer fdb.drop(say)
	say("migrating %d outboxes in database %s", cfg.Outboxes+1, fdb.name)
	outboxes, err := fdb.migrate(ctx, cfg, say)
	if err != nil {
		return res, err
	}
	big, solo, trickles := outboxes[0], outboxes[cfg.Outboxes], outboxes[1:1+res.Trickle]

	dir, err := os.MkdirTemp("", "outbox-bench-fleet-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	m := &fleetMeter{cfg: cfg, db: fdb, dir: dir, say: say, arrived: map[outbox.ID]time.Time{}, committed: map[outbox.ID]time.Time{},
		backlog: func(ctx context.Context) (int64, error) { return rd.Count(ctx, topicRoute(topicBacklog)) }}
	stopRead, err := rd.Read(topicRoute(topicTimed), m.got)
	if err != nil {
		return res, err
	}
	defer stopRead()
	payload := make([]byte, cfg.PayloadBytes)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	m.payload = payload
	common := []string{"--database-url", fdb.url, "--broker", cfg.BrokerURL, "--route", route, "--log-format", "json"}
	common = append(common, relayTuning(cfg)...)

	// 1. idle
	config := filepath.Join(dir, "fleet.yaml")
	text := "outboxes:\n  - schemas: " + fleetSchemaPrefix + "*\n"
	switch {
	case cfg.ParkAfter == -1:
		text = "park-after: -1\n" + text
	case cfg.ParkAfter != 0:
		text = "park-after: " + cfg.ParkAfter.String() + "\n" + text
	}
	if err := os.WriteFile(config, []byte(text), 0o600); err != nil {
		return res, err
	}
	say("idle: %d relay process(es) serving the %d outboxes of %s (outbox relay --config)", cfg.Relays, cfg.Outboxes, fleetSchemaPrefix+"*")
	fleet, err := m.start("fleet", append([]string{"relay", "--config", config}, common...)...)
	if err != nil {
		return res, err
	}
	defer m.stop(fleet)
	if err := m.served(ctx, fleet); err != nil {
		return res, err
	}
	if err := m.idle(ctx, fleet, &res); err != nil {
		return res, err
	}

	// 2. trickle
	say("solo: %d relay process(es) serving outbox %s alone", cfg.Relays, solo.schema)
	soloProcs, err := m.start("solo", append([]string{"relay", "--schema", solo.schema}, common...)...)
	if err != nil {
		return res, err
	}
	defer m.stop(soloProcs)
	all := append(append([]*relayProc(nil), fleet...), soloProcs...)
	say("trickle: waking %d outboxes", len(trickles))
	if err := m.oneEach(ctx, all, append([]*fleetOutbox{solo}, trickles...)); err != nil {
		return res, err
	}
	tr := m.trickle(ctx, trickles)
	var alone, soloDrain, fleetDrain window
	alone.from = time.Now()
	say("trickle: %d events/s into %d outboxes for %s", cfg.Rate, len(trickles), cfg.Duration)
	err = sleepCtx(ctx, cfg.Duration)
	alone.to = time.Now()

	// 3. solo drain, then 4. the fleet's, the trickle going on
	if err == nil {
		res.SoloEPS, soloDrain, err = m.drain(ctx, all, solo)
	}
	if err == nil {
		say("solo: drained %d at %.0f/s", cfg.Events, res.SoloEPS)
		m.stop(soloProcs)
		res.DrainEPS, fleetDrain, err = m.drain(ctx, fleet, big)
	}
	if terr := tr.stop(); err == nil {
		err = terr
	}
	if err != nil {
		return res, err
	}
	say("fleet: drained %d at %.0f/s", cfg.Events, res.DrainEPS)
	if err := m.allArrived(ctx, fleet); err != nil {
		return res, err
	}
	for _, w := range []struct {
		window
		p50, p99 *time.Duration
	}{{alone, &res.TrickleP50, &res.TrickleP99}, {soloDrain, &res.SoloP50, &res.SoloP99}, {fleetDrain, &res.DrainP50, &res.DrainP99}} {
		lat := m.latencies(w.window)
		if len(lat) == 0 {
			return res, fmt.Errorf("bench: the trickle committed nothing from %s to %s: too few to measure", w.from.Format(time.StampMilli), w.to.Format(time.StampMilli))
		}
		*w.p50, _, *w.p99 = percentiles(lat)
	}
	for _, p := range fleet {
		res.PeakRSSMiB = max(res.PeakRSSMiB, float64(p.kib("VmHWM"))/1024)
	}
	return res, nil
}

// window is a span of a run: [from, to).
type window struct{ from, to time.Time }

// The topics of a fleet run's messages: the timed ones and the backlogs.
const (
	topicTimed   = "timed"
	topicBacklog = "backlog"
)

// fleetSchemaPrefix starts the name of every schema the fleet serves; the solo outbox's
// does not match it.
const fleetSchemaPrefix = "tenant_"

// relayTuning is the relay settings of cfg.Relay as flags of `outbox relay`.
func relayTuning(cfg Config) []string {
	var args []string
	for flag, v := range map[string]int{"batch-size": cfg.Relay.BatchSize, "max-in-flight": cfg.Relay.MaxInFlight, "publish-batch-size": cfg.Relay.PublishBatchSize} {
		if v > 0 {
			args = append(args, "--"+flag, strconv.Itoa(v))
		}
	}
	if cfg.Relay.LeaseTTL > 0 {
		args = append(args, "--lease-ttl", cfg.Relay.LeaseTTL.String())
	}
	return args
}

// fleetDB is the fleet run's database, made for it and dropped after.
type fleetDB struct {
	admin *pgxpool.Pool // on the database of Config.DatabaseURL
	pool  *pgxpool.Pool // on this one
	name  string
	url   string
}

func createFleetDB(ctx context.Context, base, name string, say func(string, ...any)) (*fleetDB, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, errors.New("bench: a fleet run needs --database-url as a postgres:// URL, in which it replaces the database")
	}
	admin, err := pgxpool.New(ctx, base)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		admin.Close()
		return nil, fmt.Errorf("bench: create the fleet's database (the role needs CREATEDB): %w", err)
	}
	d := &fleetDB{admin: admin, name: name}
	u.Path = "/" + name
	d.url = u.String()
	pc, err := pgxpool.ParseConfig(d.url)
	if err == nil {
		pc.MaxConns = 24
		d.pool, err = pgxpool.NewWithConfig(ctx, pc)
	}
	if err != nil {
		d.drop(say)
		return nil, fmt.Errorf("connect to the fleet's database: %w", err)
	}
	return d, nil
}

func (d *fleetDB) drop(say func(string, ...any)) {
	if d.pool != nil {
		d.pool.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := d.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{d.name}.Sanitize()+" WITH (FORCE)"); err != nil {
		say("could not drop database %s: %v", d.name, err)
	}
	d.admin.Close()
}

// xacts is the transactions the database has run, and the relays' sessions to it.
func (d *fleetDB) xacts(ctx context.Context) (xacts, sessions int64, err error) {
	err = d.admin.QueryRow(ctx, `SELECT (SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1),
		(SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'outbox relay')`, d.name).Scan(&xacts, &sessions)
	return xacts, sessions, err
}

// fleetOutbox is one outbox of the run, and the Writer the bench writes into it with.
type fleetOutbox struct {
	schema string
	w      *outbox.Writer[pgx.Tx]
}

// migrate makes cfg.Outboxes schemas that the fleet's rule matches, and one that it
// does not (the solo outbox, last), four at a time.
func (d *fleetDB) migrate(ctx context.Context, cfg Config, say func(string, ...any)) ([]*fleetOutbox, error) {
	out := make([]*fleetOutbox, cfg.Outboxes+1)
	var next, done atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	start := time.Now()
	for range 4 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(out) || ctx.Err() != nil {
					return
				}
				schema := fmt.Sprintf("%s%05d", fleetSchemaPrefix, i+1)
				if i == cfg.Outboxes {
					schema = "solo"
				}
				drv, err := outboxpgx.New(d.pool, outboxpgx.Config{Schema: schema, RotateRows: cfg.RotateRows})
				if err == nil {
					_, err = drv.MigrateUp(ctx, cfg.SchemaVersion)
				}
				var w *outbox.Writer[pgx.Tx]
				if err == nil {
					w, err = outbox.NewWriter(drv, outbox.WriterConfig{})
				}
				if err != nil {
					errs <- fmt.Errorf("bench: outbox %s: %w", schema, err)
					return
				}
				out[i] = &fleetOutbox{schema: schema, w: w}
				if n := done.Add(1); n%int64(max(len(out)/10, 1)) == 0 {
					say("migrated %d/%d (%.0f/s)", n, len(out), float64(n)/time.Since(start).Seconds())
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	return out, ctx.Err()
}

func (d *fleetDB) write(ctx context.Context, o *fleetOutbox, msgs []outbox.Message) error {
	return pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error { return o.w.Write(ctx, tx, msgs...) })
}

// fleetMeter runs the phases: it starts the relay processes, writes, and times what the
// broker receives. The timed messages (one per transaction) are read as they arrive;
// the backlogs' are counted in the broker.
type fleetMeter struct {
	cfg     Config
	db      *fleetDB
	dir     string
	say     func(string, ...any)
	payload []byte
	backlog func(context.Context) (int64, error) // the backlog messages the broker holds

	mu        sync.Mutex
	arrived   map[outbox.ID]time.Time
	committed map[outbox.ID]time.Time
}

// got is the broker reader's callback.
func (m *fleetMeter) got(payload []byte) {
	now := time.Now()
	if id, ok := trackingID(&outbox.Message{Payload: payload}); ok {
		m.mu.Lock()
		if _, dup := m.arrived[id]; !dup {
			m.arrived[id] = now
		}
		m.mu.Unlock()
	}
}

// writeTracked commits one timed message into o.
func (m *fleetMeter) writeTracked(ctx context.Context, o *fleetOutbox, key string) error {
	id := outbox.NewID()
	msg := outbox.Message{Topic: topicTimed, Key: key, Payload: tracked(m.payload, id), ContentType: "application/octet-stream"}
	if err := m.db.write(ctx, o, []outbox.Message{msg}); err != nil {
		return err
	}
	t := time.Now()
	m.mu.Lock()
	m.committed[id] = t
	m.mu.Unlock()
	return nil
}

// oneEach writes one timed message into each of outboxes and waits until all arrived:
// their relays then run.
func (m *fleetMeter) oneEach(ctx context.Context, procs []*relayProc, outboxes []*fleetOutbox) error {
	for _, o := range outboxes {
		if err := m.writeTracked(ctx, o, "warm-up"); err != nil {
			return err
		}
	}
	return m.allArrived(ctx, procs)
}

// allArrived waits until every timed message committed so far has arrived.
func (m *fleetMeter) allArrived(ctx context.Context, procs []*relayProc) error {
	return waitProgress(ctx, "the timed messages to arrive", procs, func() (bool, string) {
		m.mu.Lock()
		defer m.mu.Unlock()
		missing := 0
		for id := range m.committed {
			if _, ok := m.arrived[id]; !ok {
				missing++
			}
		}
		return missing == 0, fmt.Sprintf("%d of %d not arrived", missing, len(m.committed))
	})
}

// latencies returns COMMIT -> arrival of the timed messages committed in w.
func (m *fleetMeter) latencies(w window) []time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []time.Duration
	for id, c := range m.committed {
		if c.Before(w.from) || !c.Before(w.to) {
			continue
		}
		if a, ok := m.arrived[id]; ok {
			out = append(out, max(a.Sub(c), 0))
		}
	}
	return out
}

// backlogMsgs is a backlog of cfg.Events messages over cfg.Keys keys, untimed.
func (m *fleetMeter) backlogMsgs() []outbox.Message {
	msgs := make([]outbox.Message, m.cfg.Events)
	for i := range msgs {
		msgs[i] = backlogMessage(topicBacklog, i, m.cfg.Keys, m.payload)
	}
	return msgs
}

// drain commits a backlog into o in one transaction and returns the rate at which it
// arrived, and the window from the COMMIT to the last message.
func (m *fleetMeter) drain(ctx context.Context, procs []*relayProc, o *fleetOutbox) (float64, window, error) {
	msgs := m.backlogMsgs()
	before, err := m.backlog(ctx)
	if err != nil {
		return 0, window{}, fmt.Errorf("bench: count the backlog's messages in the broker: %w", err)
	}
	m.say("drain: writing %d events into %s in one transaction", len(msgs), o.schema)
	if err := m.db.write(ctx, o, msgs); err != nil {
		return 0, window{}, err
	}
	w := window{from: time.Now()}
	n := int64(len(msgs))
	var first time.Duration
	err = waitProgress(ctx, "the backlog to arrive", procs, func() (bool, string) {
		got, err := m.backlog(ctx)
		if err != nil {
			return false, fmt.Sprintf("counting them: %v", err)
		}
		w.to = time.Now()
		if got > before && first == 0 {
			first = w.to.Sub(w.from)
		}
		return got-before >= n, fmt.Sprintf("%d of %d arrived", got-before, n)
	})
	if err != nil {
		return 0, w, err
	}
	m.say("drain: the first messages arrived %s after the COMMIT, the last %s after", first.Round(time.Millisecond), w.to.Sub(w.from).Round(time.Millisecond))
	return float64(n) / w.to.Sub(w.from).Seconds(), w, nil
}

// served waits until every process serves every outbox of the fleet.
func (m *fleetMeter) served(ctx context.Context, procs []*relayProc) error {
	return waitProgress(ctx, "the relays to find the outboxes", procs, func() (bool, string) {
		least := m.cfg.Outboxes
		for _, p := range procs {
			least = min(least, p.logLines(`"msg":"serving outbox"`))
		}
		return least >= m.cfg.Outboxes, fmt.Sprintf("%d of %d outboxes served by every process", least, m.cfg.Outboxes)
	})
}

// idle counts the database's transactions with nothing written, over windows of
// cfg.Idle until the rate settles (it changes by at most a fifth, or one a second, from
// one window to the next; at most twelve windows): right after they found the outboxes
// the relays still check each one, and several processes settle who holds what, which
// is not what an idle fleet costs. It reports the last window.
func (m *fleetMeter) idle(ctx context.Context, procs []*relayProc, res *FleetResult) error {
	n := float64(len(procs))
	prev := -1.0
	for range 12 {
		x0, _, err := m.db.xacts(ctx)
		if err != nil {
			return err
		}
		start := time.Now()
		if err := sleepCtx(ctx, m.cfg.Idle); err != nil {
			return err
		}
		x1, sessions, err := m.db.xacts(ctx)
		if err != nil {
			return err
		}
		res.IdleQPS = float64(x1-x0) / time.Since(start).Seconds() / n
		res.IdleConns = float64(sessions) / n
		m.say("idle: %.1f transactions/s per process over %s", res.IdleQPS, m.cfg.Idle)
		if prev >= 0 && math.Abs(res.IdleQPS-prev) <= max(0.2*prev, 1) {
			break
		}
		prev = res.IdleQPS
	}
	res.RSSMiB = 0
	for _, p := range procs {
		if p.exited() {
			return fmt.Errorf("bench: relay process %s exited while idle:\n%s", p.name, p.tail())
		}
		res.RSSMiB += float64(p.kib("VmRSS")) / 1024
	}
	res.RSSMiB /= n
	m.say("idle: %.1f transactions/s, %.0f sessions and %.0f MiB per process", res.IdleQPS, res.IdleConns, res.RSSMiB)
	return nil
}

// fleetTrickle is the trickle writer: it runs until stop.
type fleetTrickle struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	err    error // the first write that failed
}

// trickle writes cfg.Rate timed messages a second into outboxes, round robin, each in
// its own transaction, up to 16 at once.
func (m *fleetMeter) trickle(ctx context.Context, outboxes []*fleetOutbox) *fleetTrickle {
	ctx, cancel := context.WithCancel(ctx)
	t := &fleetTrickle{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(t.done)
		var wg sync.WaitGroup
		defer wg.Wait()
		sem := make(chan struct{}, 16)
		start := time.Now()
		for i := 0; ; i++ {
			due := start.Add(time.Duration(i) * time.Second / time.Duration(m.cfg.Rate))
			if sleepCtx(ctx, time.Until(due)) != nil {
				return
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Go(func() {
				defer func() { <-sem }()
				o := outboxes[i%len(outboxes)]
				if err := m.writeTracked(ctx, o, "trickle-"+strconv.Itoa(i/len(outboxes)%m.cfg.Keys)); err != nil && ctx.Err() == nil {
					t.mu.Lock()
					t.err = cmp.Or(t.err, err)
					t.mu.Unlock()
				}
			})
		}
	}()
	return t
}

func (t *fleetTrickle) stop() error {
	t.cancel()
	<-t.done
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.err; err != nil {
		return fmt.Errorf("bench: trickle: %w", err)
	}
	return nil
}

// start starts cfg.Relays processes running `outbox args...`, their output in the
// run's directory.
func (m *fleetMeter) start(name string, args ...string) ([]*relayProc, error) {
	var procs []*relayProc
	for i := range m.cfg.Relays {
		p, err := startRelayProc(m.cfg.Command, filepath.Join(m.dir, fmt.Sprintf("%s-%d.log", name, i+1)), args)
		if err != nil {
			m.stop(procs)
			return nil, fmt.Errorf("bench: start %s: %w", strings.Join(m.cfg.Command, " "), err)
		}
		p.name = fmt.Sprintf("%s-%d", name, i+1)
		procs = append(procs, p)
	}
	return procs, nil
}

// stop stops procs with SIGTERM, as an operator would, and reports one that had to be
// killed or did not exit cleanly.
func (m *fleetMeter) stop(procs []*relayProc) {
	for _, p := range procs {
		if p.stopped {
			continue
		}
		p.stopped = true
		if killed := childproc.Stop(p.cmd, p.done, syscall.SIGTERM, time.Minute); killed {
			m.say("relay process %s did not stop within a minute of SIGTERM: killed", p.name)
		} else if code := p.cmd.ProcessState.ExitCode(); code != 0 {
			m.say("relay process %s exited with %d:\n%s", p.name, code, p.tail())
		}
	}
}

// relayProc is one relay process of a fleet run.
type relayProc struct {
	name    string
	cmd     *exec.Cmd
	log     string
	done    <-chan struct{}
	stopped bool
}

func startRelayProc(command []string, log string, args []string) (*relayProc, error) {
	f, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(command[0], append(append([]string(nil), command[1:]...), args...)...)
	cmd.Env = relayEnv()
	cmd.Stdout, cmd.Stderr = f, f
	// The relay dies with the bench even when the bench is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	done, err := childproc.Start(cmd, f)
	if err != nil {
		return nil, err
	}
	return &relayProc{cmd: cmd, log: log, done: done}, nil
}

// relayEnv is the bench's environment without the OUTBOX_ variables: every setting of
// the relays is on their command line or in their config file.
func relayEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOX_") {
			env = append(env, kv)
		}
	}
	return env
}

func (p *relayProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *relayProc) kib(field string) int64 {
	return procStatusKiB(strconv.Itoa(p.cmd.Process.Pid), field)
}

// logLines counts the lines of the process's output that hold s.
func (p *relayProc) logLines(s string) int {
	b, _ := os.ReadFile(p.log)
	return bytes.Count(b, []byte(s))
}

// tail is the last lines of the process's output.
func (p *relayProc) tail() string {
	b, _ := os.ReadFile(p.log)
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return strings.Join(lines[max(len(lines)-20, 0):], "\n")
}

// waitProgress polls check until it reports done. It fails when what check reports
// has not changed for fleetStall, or a relay process exited, saying what was last seen.
func waitProgress(ctx context.Context, what string, procs []*relayProc, check func() (done bool, seen string)) error {
	last, since := "", time.Now()
	for {
		done, seen := check()
		if done {
			return nil
		}
		for _, p := range procs {
			if p.exited() {
				return fmt.Errorf("bench: waiting for %s (%s), relay process %s exited:\n%s", what, seen, p.name, p.tail())
			}
		}
		if seen != last {
			last, since = seen, time.Now()
		} else if time.Since(since) > fleetStall {
			return fmt.Errorf("bench: waiting for %s: no progress for %s (%s)", what, fleetStall, seen)
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
