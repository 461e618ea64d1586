package chaos

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/internal/pgsql/pgxq"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testpg"
	"github.com/outboxkit/outbox/internal/testinfra/torture"
	"github.com/outboxkit/outbox/internal/testinfra/torture/nemesis"
)

// Config is one torture run. The zero value (but for Seed) is a 45-second NATS run with
// one relay and every fault kind.
type Config struct {
	// Broker names the broker kind (see Brokers); default "nats".
	Broker string
	// Relays is the number of relay processes; default 1.
	Relays int
	// Duration is how long the load runs; default 45 s. Ignored when Events is set.
	Duration time.Duration
	// Events, when set, runs the load until this many events were attempted.
	Events int
	// MinFaults keeps the load running until the nemesis has injected each listed kind
	// at least this often. Every run injects every kind it uses at least once.
	MinFaults map[string]int
	// Kinds restricts the fault kinds; default all that the broker and the database
	// support.
	Kinds []string
	// Seed drives the workload and the nemesis; print it, replay with it.
	Seed uint64
	// Writers and Rate shape the workload: concurrent writers (default 8) and
	// transactions per second over all of them (default 300; each writes 1–3 events).
	Writers int
	Rate    float64
	// Keys is the number of aggregates (ordering keys); default 64. A long transaction
	// holds its aggregate's row lock, so few keys slow the writers down.
	Keys int
	// MinGap and MaxGap bound the quiet time between faults (default 0.3–1.5 s).
	MinGap, MaxGap time.Duration
	// DatabaseURL is the PostgreSQL server; default the test database. The run works in
	// a fresh schema, dropped at the end.
	DatabaseURL string
	// PrivatePostgres runs the database on a private PostgreSQL server (package testpg),
	// started for the run and removed after it, instead of DatabaseURL, and adds the
	// pg-restart fault, which the shared server must never suffer. Default false.
	PrivatePostgres bool
	// WAL runs the relays in WAL mode (RelayConfig.WAL): the private server gets
	// wal_level=logical and the outbox a slot ('outbox wal setup'). One relay reads the
	// slot; the others stand by. With one relay, an audit slot checks that the slot is
	// never acknowledged past a message not yet recorded (slotaudit.go). It implies
	// PrivatePostgres.
	WAL bool
	// Artifacts is a directory for nemesis.jsonl, timing.jsonl (each fault's heal to
	// first arrival), each relay incarnation's log (relay-r<slot>.<incarnation>.log) and
	// history.jsonl (without it, the history is kept only on failure, in a temporary
	// directory); default
	// a temporary directory.
	Artifacts string
	// RelayEnv is extra environment for the relay processes.
	RelayEnv []string
	// MaxAttempts is the relays' attempt limit before a dead letter; default 3, or the
	// broker's own (RabbitMQ's returns burn attempts: RabbitMaxAttempts).
	MaxAttempts int
	// MaxInFlight and BatchSize are the relays' RelayConfig.MaxInFlight (default 500)
	// and BatchSize (default the relay's, 1,000). A relay holds up to their sum of
	// fetched messages: small ones leave most of an outage's backlog in the database
	// rather than in the relay's hand.
	MaxInFlight, BatchSize int
	// DrainStall ends the final drain when the number of pending events has not gone
	// down for this long; the events still pending are then reported lost. Default
	// testenv.Stall() (2 minutes, OUTBOX_TEST_STALL): a slow drain that keeps moving is
	// never cut off, however slow the machine.
	DrainStall time.Duration
	// DrainTimeout, when set, also ends the final drain after this long, moving or not:
	// a limit the caller chooses on purpose. Default none.
	DrainTimeout time.Duration
	// Progress, when set, receives a line every ProgressEvery (default 10 s) while the
	// load runs.
	Progress      func(format string, args ...any)
	ProgressEvery time.Duration
	// Outboxes, above 1, runs that many outboxes, served by relays that each run the
	// outbox command with an outboxes list (fleet.go); NATS only, no WAL mode, no poison.
	// Default 1: one outbox, library relays.
	Outboxes int
	// Done, when closed, ends the load early (an interrupted long run): the run still
	// heals, drains, reads back and checks what was written.
	Done <-chan struct{}
}

const (
	leaseTTL    = 3 * time.Second
	maxInFlight = 500
)

func (c Config) withDefaults() Config {
	c.Broker = cmp.Or(c.Broker, "nats")
	c.Relays = cmp.Or(c.Relays, 1)
	c.Duration = cmp.Or(c.Duration, 45*time.Second)
	c.Writers = cmp.Or(c.Writers, 8)
	c.Keys = cmp.Or(c.Keys, torture.KeysDefault)
	c.Rate = cmp.Or(c.Rate, 300)
	c.MinGap = cmp.Or(c.MinGap, 300*time.Millisecond)
	c.MaxGap = cmp.Or(c.MaxGap, 1500*time.Millisecond)
	c.DatabaseURL = cmp.Or(c.DatabaseURL, testdb.URL())
	c.ProgressEvery = cmp.Or(c.ProgressEvery, 10*time.Second)
	c.DrainStall = cmp.Or(c.DrainStall, testenv.Stall())
	return c
}

// Run runs one torture run and returns the checker's report; the caller prints its line
// and decides on rep.OK(). Run fails tb when the run is invalid (the broker cannot be
// read back completely, a fault cannot be injected, an outcome cannot be resolved) or a
// relay exits on its own; an anomaly the checker finds is the report's business, not a
// failure of tb, so that canary runs can assert it.
func Run(tb testenv.TB, cfg Config) torture.Report {
	tb.Helper()
	cfg = cfg.withDefaults()
	kind, err := lookup(cfg.Broker)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, kind.maxAttempts, 3)
	tb.Logf("seed=%d (replay with OUTBOX_TORTURE_SEED=%d)", cfg.Seed, cfg.Seed)
	dir := cfg.Artifacts
	if dir == "" {
		dir = tb.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()

	broker := kind.new()
	var router outboxRouter // runs of several outboxes
	if cfg.Outboxes > 1 {
		var ok bool
		if router, ok = broker.(outboxRouter); !ok || cfg.WAL {
			tb.Fatalf("chaos: a run of several outboxes needs a broker that gives each its own destination (nats), and polling relays (no WAL)")
		}
	}
	broker.Start(tb)

	var pg *testpg.Server
	if cfg.WAL {
		cfg.PrivatePostgres = true
	}
	if cfg.PrivatePostgres {
		var settings []string
		if cfg.WAL {
			settings = append(settings, "wal_level=logical", "wal_sender_timeout=10s", "max_slot_wal_keep_size="+walKeepSize)
		}
		pg = testpg.StartServer(tb, settings...)
		cfg.DatabaseURL = pg.URL()
	}

	// Database: a fresh migrated schema per outbox, with the business tables.
	outs := []*runOutbox{{db: testdb.MigratedAt(tb, cfg.DatabaseURL), url: cfg.DatabaseURL}}
	if router != nil {
		outs = fleetOutboxes(tb, cfg.DatabaseURL, cfg.Outboxes)
	}
	db := outs[0].db // the one outbox of most runs; the target of faults on one outbox's tables
	for _, o := range outs {
		o.hist, o.log = &torture.History{}, &torture.DeliveryLog{}
		conn, err := pgx.Connect(ctx, o.url)
		if err != nil {
			tb.Fatal(err)
		}
		err = torture.Prepare(ctx, conn, o.db.Schema, cfg.Keys)
		_ = conn.Close(ctx)
		if err != nil {
			tb.Fatal(err)
		}
		if err := watchLeases(ctx, o.db); err != nil {
			tb.Fatal(err)
		}
	}
	var audit *slotAudit
	var slot string // the relays' replication slot (WAL runs)
	if cfg.WAL {
		slot = walSetup(tb, cfg.DatabaseURL, db.Schema)
		if cfg.Relays == 1 {
			audit = startSlotAudit(tb, db, slot)
		}
	}

	// Relays reach the database through a proxy of their own (the writers do not).
	dbProxy := proxyDatabase(tb, cfg.DatabaseURL)
	for _, o := range outs {
		o.relayURL = viaProxy(tb, dbProxy, o.url)
	}

	var b [4]byte
	_, _ = rand.Read(b[:])
	rcfg := relayConfig{databaseURL: outs[0].relayURL, schema: db.Schema, kind: cfg.Broker, broker: broker.RelayURL(),
		route: broker.Route(), appName: "torture-relay-" + hex.EncodeToString(b[:]), ttl: leaseTTL,
		inFlight: cmp.Or(cfg.MaxInFlight, maxInFlight), batch: cfg.BatchSize, maxAttempts: cfg.MaxAttempts, wal: cfg.WAL, env: cfg.RelayEnv}
	if cfg.Artifacts != "" {
		rcfg.logDir = cfg.Artifacts
	}
	if router != nil {
		rcfg.fleetConfig = writeFleetConfig(tb, dir, rcfg, outs, router)
	}
	rs := make([]*relay, cfg.Relays)
	for i := range rs {
		rs[i] = startRelay(tb, rcfg, i+1)
	}
	stopSampler := sampleRSS(tb, rs)

	// The workload: writers of their own for each outbox.
	for i, o := range outs {
		wcfg := torture.WorkloadConfig{Connect: func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, o.url) },
			Schema: o.db.Schema, Writers: cfg.Writers, Keys: cfg.Keys, Rate: cfg.Rate, PoisonShare: 0.002, Seed: cfg.Seed}
		if router != nil {
			wcfg.Writers, wcfg.Rate = max(2, cfg.Writers/len(outs)), fleetRate(cfg.Rate, i, len(outs))
			wcfg.PoisonShare, wcfg.Seed = 0, cfg.Seed+uint64(i)
		}
		if r, ok := broker.(keyRouter); ok {
			wcfg.AggregateType = r.AggregateType
		}
		if o.wl, err = torture.StartWorkload(ctx, wcfg, o.hist); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = o.wl.Stop(context.Background()) })
	}
	events := func() (n int) {
		for _, o := range outs {
			n += o.hist.Events()
		}
		return n
	}

	// The nemesis.
	nlog, err := os.Create(filepath.Join(dir, "nemesis.jsonl"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = nlog.Close() }) // after the nemesis's own cleanup, which may still log
	faults := relayFaults(rs)
	faults = append(faults, pgTerminate(db, rcfg.appName), pgSnapshot(db))
	faults = append(faults, databaseProxyFaults(tb, dbProxy)...)
	if pg != nil {
		faults = append(faults, pgRestart(pg, db.Pool))
	}
	if cfg.WAL {
		faults = append(faults, walSlotDrop(db, slot, audit), walSlotLost(tb, rs, db, slot, audit))
	}
	faults = append(faults, broker.Faults(tb)...)
	if len(cfg.Kinds) > 0 {
		faults = slices.DeleteFunc(faults, func(f nemesis.Fault) bool { return !slices.Contains(cfg.Kinds, f.Kind) })
		for _, k := range cfg.Kinds {
			if !slices.Contains(kindsOf(faults), k) {
				tb.Fatalf("chaos: fault kind %q is not available with broker %s (pg-restart needs the private PostgreSQL server)", k, cfg.Broker)
			}
		}
	}
	for k := range cfg.MinFaults {
		if !slices.Contains(kindsOf(faults), k) {
			tb.Fatalf("chaos: fault kind %q is not available in this run (available: %v; pg-restart needs the private PostgreSQL server)", k, kindsOf(faults))
		}
	}
	nem := nemesis.Start(nemesis.Config{Seed: cfg.Seed, Faults: faults, MinGap: cfg.MinGap, MaxGap: cfg.MaxGap,
		Log: nlog, Logf: tb.Logf})
	tb.Cleanup(nem.Stop) // heals whatever is in progress, even on failure
	stopChurn := churnHistory(tb, db)

	// Load until the duration or event count, every kind injected at least once and
	// MinFaults met.
	start := time.Now()
	lastProgress := start
	for {
		loaded := time.Since(start) >= cfg.Duration
		if cfg.Events > 0 {
			loaded = events() >= cfg.Events
		}
		if loaded && faultsMet(nem, cfg.MinFaults) {
			break
		}
		if interrupted(cfg.Done) {
			tb.Logf("interrupted: the load ends early; healing, draining and checking what was written")
			break
		}
		if cfg.Progress != nil && time.Since(lastProgress) >= cfg.ProgressEvery {
			lastProgress = time.Now()
			cfg.Progress("torture: %s events=%d faults=%d %v", time.Since(start).Round(time.Second), events(), nem.Count(), nem.Kinds())
		}
		time.Sleep(100 * time.Millisecond)
	}
	nem.Stop()
	for _, r := range rs { // a relay that exited on its own (it should not) comes back for the drain
		if r.exited() {
			tb.Errorf("relay %s exited on its own:\n%s", r.id(), tail(r.stderr.String(), 20))
			if err := r.start(); err != nil {
				tb.Fatal(err)
			}
		}
	}
	// The writers finish their transactions in flight (long ones hold 1-3 s). Past this
	// bound their COMMITs are cancelled and become unknown outcomes, which Resolve
	// settles from the database: no verdict depends on the machine keeping up with it.
	stopCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	for _, o := range outs {
		if err := o.wl.Stop(stopCtx); err != nil {
			tb.Logf("workload %s: %v", o.name, err)
		}
	}
	cancel()
	churned := stopChurn()
	writing := time.Since(start)
	for _, rec := range nem.Records() {
		if rec.Err != "" {
			tb.Errorf("fault %s on %s at %s failed: %s", rec.Kind, rec.Target, rec.Start.UTC().Format("15:04:05.000"), rec.Err)
		}
	}

	// Drain: until nothing is pending, for as long as the pending count keeps going
	// down. A drain that stalls (or outlasts DrainTimeout, if set) ends: its events
	// still pending are the checker's to report as lost, not a reason to skip the check.
	drainStart := time.Now()
	dctx := ctx
	if cfg.DrainTimeout > 0 {
		var cancel context.CancelFunc
		dctx, cancel = context.WithTimeout(ctx, cfg.DrainTimeout)
		defer cancel()
	}
	pending, least := 0, -1
	drainErr := testenv.Progress(dctx, "the relays to drain the outbox", cfg.DrainStall, func() (any, bool) {
		pending = 0
		for _, o := range outs {
			var n int
			if err := o.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{o.db.Schema}.Sanitize()+`.outbox`).Scan(&n); err != nil {
				tb.Fatal(err)
			}
			pending += n
		}
		if least < 0 || pending < least {
			least = pending // progress is a new low: a count that only wavers is a stall
		}
		return fmt.Sprintf("lowest pending count %d", least), pending == 0
	})
	drained := time.Now()
	recovery := drained.Sub(nem.LastHealed()).Seconds()
	if drainErr != nil {
		tb.Logf("%d events still pending %s after everything healed and the workload stopped: the relays did not drain (%v)",
			pending, drained.Sub(drainStart).Round(time.Millisecond), drainErr)
		recovery = -1
	}
	stopSampler()

	// Complete read-back, each copy to its outbox's log, then every outbox checked
	// against its own history.
	all := &torture.DeliveryLog{}
	broker.ReadBack(tb, all)
	var crossed torture.Report
	if router != nil {
		splitDeliveries(all, outs, router, &crossed)
	} else {
		outs[0].log = all
	}
	if r, ok := broker.(keyRouter); ok {
		checkRouted(all, r, &crossed)
	}
	h := &torture.History{} // every outbox's, for the timing figures and the artifacts
	var rep torture.Report
	for i, o := range outs {
		if err := o.log.LoadDead(ctx, o.db.Pool, o.db.Schema); err != nil {
			tb.Fatal(err)
		}
		if err := o.hist.Resolve(ctx, o.db.Pool, o.db.Schema); err != nil {
			tb.Fatal(err)
		}
		for _, t := range o.hist.Txns() {
			h.Record(t)
		}
		r := torture.Check(o.hist, o.log, torture.Bounds{InFlight: cfg.Relays * maxInFlight, Faults: nem.Count()})
		if r.LeaseSteals, err = leaseSteals(ctx, o.db, &r); err != nil {
			tb.Fatal(err)
		}
		if i == 0 {
			rep = r
		} else {
			rep.Add(r)
		}
	}
	rep.Add(crossed)
	rep.Destinations = crossed.Destinations
	var peak int64
	for _, r := range rs {
		peak = max(peak, r.peakKiB())
	}
	rep.Label = fmt.Sprintf("chaos %s relays=%d", cfg.Broker, cfg.Relays)
	rep.Seed = cfg.Seed
	rep.Outboxes = len(outs)
	rep.RecoverySeconds = recovery
	rep.RSSMiB = float64(peak) / 1024
	if audit != nil {
		res, err := audit.check(ctx)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Logf("slot audit: %d commits checked against %d confirmed positions, %d passed ahead of a record (audit slot made again %d times)", res.checked, res.passed, res.ahead, res.remade)
		rep.SlotAhead = res.ahead
		if res.example != "" {
			rep.Examples = append(rep.Examples, res.example)
		}
	}
	spans := faultSpans(nem.Records())
	rep.Timing = torture.Measure(h, all, spans)
	if router != nil {
		for _, o := range outs {
			tm := torture.Measure(o.hist, o.log, spans)
			ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
			line := fmt.Sprintf("outbox %s: %d events, commit-to-arrival p50 %s, p99 %s; committed with no fault in progress p50 %s, p99 %s; heal to first arrival p99 %s",
				o.name, o.hist.Events(), ms(tm.Latency.P50), ms(tm.Latency.P99), ms(tm.Quiet.P50), ms(tm.Quiet.P99), ms(tm.Heal.P99))
			if k := slowestHeal(tm.Kinds); k != nil {
				line += fmt.Sprintf(" (slowest kind %s, %s)", k.Kind, ms(k.Dist.Max))
			}
			tb.Logf("%s", line)
		}
	}
	writeJSONL(tb, filepath.Join(dir, "timing.jsonl"), rep.Timing.Faults)
	tb.Logf("writing %s, drain %s, copies %d, faults %v", writing.Round(time.Millisecond), drained.Sub(drainStart).Round(time.Millisecond), rep.Copies, nem.Kinds())
	storageChurn(tb, db, churned)
	if !rep.OK() {
		for _, ex := range rep.Examples {
			tb.Logf("%s", ex)
		}
	}
	if !rep.OK() || cfg.Artifacts != "" { // a directory asked for: keep the history too
		if f, err := os.Create(filepath.Join(dir, "history.jsonl")); err == nil {
			_ = h.WriteJSONL(f)
			_ = f.Close()
		}
		tb.Logf("artifacts in %s", dir)
	}
	if rep.Delivered == 0 {
		tb.Errorf("nothing was delivered: the run proves nothing")
	}
	return rep
}

// cannotBlock are the fault kinds that slow publishing at most: added latency on a
// proxy (every request still gets through), and a snapshot held open by a session that
// touches none of the outbox's tables (vacuum waits, the relays do not). Their
// heal-to-first-arrival is listed but not counted in heal_p99_ms.
var cannotBlock = []string{KindBrokerLatency, KindDBLatency, KindPGSnapshot}

// faultSpans turns the nemesis' records of the faults injected without error into the
// spans torture.Measure matches arrivals against: the heal is the record's end (the
// process restarted, the signal sent, the server serving again, the proxy restored; for
// pg-terminate and kafka-leader-move, which heal themselves, the moment the injection
// returned).
func faultSpans(recs []nemesis.Record) []torture.FaultSpan {
	var spans []torture.FaultSpan
	for _, r := range recs {
		if r.Err == "" {
			spans = append(spans, torture.FaultSpan{Kind: r.Kind, Start: r.Start, Heal: r.End, CannotBlock: slices.Contains(cannotBlock, r.Kind)})
		}
	}
	return spans
}

func interrupted(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// faultsMet reports whether the nemesis finished a round of every kind and injected each
// kind of min at least that often.
func faultsMet(nem *nemesis.Nemesis, min map[string]int) bool {
	select {
	case <-nem.RoundDone():
	default:
		return false
	}
	kinds := nem.Kinds()
	for k, n := range min {
		if kinds[k] < n {
			return false
		}
	}
	return true
}

// relayFaults are SIGKILL (and a restart), SIGSTOP past the lease (then SIGCONT) and a
// graceful restart (SIGTERM: the relay drains and hands its leases back; one step of a
// rolling restart) of a relay picked by the nemesis.
func relayFaults(rs []*relay) []nemesis.Fault {
	pick := func(rnd *mrand.Rand) *relay { return rs[rnd.IntN(len(rs))] }
	return []nemesis.Fault{
		{Kind: KindRelayKill, MinHold: 200 * time.Millisecond, MaxHold: time.Second,
			Inject: func(rnd *mrand.Rand) (string, func() error, error) {
				r := pick(rnd)
				id := r.sigkill()
				return id, r.start, nil
			}},
		{Kind: KindRelayStop, MinHold: leaseTTL + time.Second, MaxHold: 2 * leaseTTL,
			Inject: func(rnd *mrand.Rand) (string, func() error, error) {
				r := pick(rnd)
				id, err := r.signal(syscall.SIGSTOP)
				return id, func() error { _, err := r.signal(syscall.SIGCONT); return err }, err
			}},
		{Kind: KindRelayRestart, MinHold: 100 * time.Millisecond, MaxHold: 500 * time.Millisecond,
			Inject: func(rnd *mrand.Rand) (string, func() error, error) {
				r := pick(rnd)
				return r.stop(), r.start, nil
			}},
	}
}

// pgTerminate is pg_terminate_backend on every database session of the relays.
func pgTerminate(db *testdb.DB, appName string) nemesis.Fault {
	return nemesis.Fault{Kind: KindPGTerminate,
		Inject: func(*mrand.Rand) (string, func() error, error) {
			var n int
			err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()) k`, appName).Scan(&n)
			return fmt.Sprintf("%s sessions=%d", appName, n), nil, err
		}}
}

// sampleRSS samples every relay incarnation's peak RSS while it lives, until the
// returned function is called.
func sampleRSS(tb testenv.TB, rs []*relay) (stop func()) {
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tk := time.NewTicker(250 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tk.C:
				for _, r := range rs {
					r.sample()
				}
			}
		}
	}()
	var once bool
	stop = func() {
		if once {
			return
		}
		once = true
		close(quit)
		<-done
		for _, r := range rs {
			r.sample()
		}
	}
	tb.Cleanup(stop)
	return stop
}

// RandomSeed returns a random seed.
func RandomSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) >> 1
}

// watchLeases records every lease that changes owner while its owner's heartbeat had
// not expired in database time: a relay took a live relay's shard. Releases (owner NULL)
// and takeovers from relays whose heartbeat expired are what correct relays do. The
// trigger's now() is the transaction's, the same instant the lease statement judged
// expiry by.
func watchLeases(ctx context.Context, db *testdb.DB) error {
	s := pgx.Identifier{db.Schema}.Sanitize()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE `+s+`.torture_lease_steals (
    shard smallint, old_owner text, new_owner text, left_ms float8, at timestamptz DEFAULT now());
CREATE FUNCTION `+s+`.torture_lease_steal() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF OLD.owner IS NOT NULL AND NEW.owner IS NOT NULL AND NEW.owner <> OLD.owner THEN
        INSERT INTO `+s+`.torture_lease_steals (shard, old_owner, new_owner, left_ms)
        SELECT OLD.shard, OLD.owner, NEW.owner, extract(epoch FROM r.expires_at - now()) * 1000
        FROM `+s+`.outbox_relays r WHERE r.id = OLD.owner AND r.expires_at > now();
    END IF;
    RETURN NEW;
END
$fn$;
CREATE TRIGGER torture_lease_steal BEFORE UPDATE ON `+s+`.outbox_leases
    FOR EACH ROW EXECUTE FUNCTION `+s+`.torture_lease_steal();`)
	return err
}

// leaseSteals counts what watchLeases recorded, with an example for the report.
func leaseSteals(ctx context.Context, db *testdb.DB, rep *torture.Report) (int, error) {
	s := pgx.Identifier{db.Schema}.Sanitize()
	var n int
	var ex string
	err := db.Pool.QueryRow(ctx, `SELECT count(*), coalesce(min(format('lease: shard %s taken from %s by %s %s ms before it expired', shard, old_owner, new_owner, round(left_ms::numeric))), '') FROM `+s+`.torture_lease_steals`).Scan(&n, &ex)
	if n > 0 {
		rep.Examples = append(rep.Examples, ex)
	}
	return n, err
}

// writeJSONL writes rows to path, one JSON object a line; a failure is logged, not fatal
// (the file is for a closer look, not for the verdict).
func writeJSONL[T any](tb testenv.TB, path string, rows []T) {
	f, err := os.Create(path)
	if err == nil {
		enc := json.NewEncoder(f)
		for _, r := range rows {
			if err = enc.Encode(r); err != nil {
				break
			}
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		tb.Logf("write %s: %v", path, err)
	}
}

// walSetup does what 'outbox wal setup' does for the run's outbox: a publication and a
// logical slot, named by default; it returns the slot's name.
func walSetup(tb testenv.TB, url, schema string) (slot string) {
	tb.Helper()
	ctx := testenv.Context(tb)
	names, err := pgsql.NewNames(pgsql.Config{Schema: schema})
	if err != nil {
		tb.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	inTx := func(ctx context.Context, fn func(pgsql.Querier) error) error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return fn(pgxq.Querier{DB: tx}) })
	}
	slot, pub := names.WALDefaults()
	if _, err := names.WALSetup(ctx, inTx, pgsql.WALSetupOptions{Slot: slot, Publication: pub, SlotTimeout: testenv.Stall()}); err != nil {
		tb.Fatalf("wal setup: %v", err)
	}
	return slot
}

// slowestHeal returns the blocking fault kind whose heal-to-first-arrival was the longest,
// or nil when none had one.
func slowestHeal(kinds []torture.KindTiming) *torture.KindTiming {
	var worst *torture.KindTiming
	for i, k := range kinds {
		if !k.CannotBlock && k.Dist.N > 0 && (worst == nil || k.Dist.Max > worst.Dist.Max) {
			worst = &kinds[i]
		}
	}
	return worst
}
