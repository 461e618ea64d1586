// Package bench measures the relay end to end, PostgreSQL to a broker, against a
// reference measured in the same run: the raw publish rate of the same broker client
// library with the same messages and no database. `outbox bench` runs it. Each broker of
// internal/brokers has a Target (target_*.go), chosen by the scheme of Config.BrokerURL;
// the relays' publishers are opened through internal/brokers, as `outbox relay` opens
// its own.
package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/pgserver"
)

// Config sizes a run. Zero values take the defaults.
type Config struct {
	DB           string        // postgres, sqlite or mysql. Defaults to postgres.
	DatabaseURL  string        // PostgreSQL URL or MySQL DSN. Defaults to the local server; unused for sqlite.
	BrokerURL    string        // Its scheme picks the Target. Defaults to nats://127.0.0.1:4222.
	Events       int           // Backlog drained by the relays. Defaults to 200,000.
	Keys         int           // Distinct ordering keys. Defaults to 1,000.
	PayloadBytes int           // Defaults to 130.
	Relays       int           // Relays draining the backlog. Defaults to 1.
	Rate         int           // Events per second in the latency phase. Defaults to 1,000.
	Runs         int           // Raw + drain measurements; the result is their median. Defaults to 1.
	Duration     time.Duration // Length of the latency phase. Defaults to 10s; -1 skips it.
	// Writers, when positive, adds the writers phase: that many goroutines commit one
	// event per transaction as fast as they can for WritersDuration while the relays
	// publish, as an application's writers and its relay share a database. It measures
	// the writers' rate, the relays' rate over the same events and commit-to-confirm
	// latency together: on SQLite, whether the relay gets its turns at the write lock.
	// Except on SQLite, the same writers also commit into a naive outbox table, for
	// half of WritersDuration before and half after, the reference WritersPhase.X
	// compares the writers' rate with.
	Writers int
	// WritersDuration is the length of the writers phase (the reference takes as long
	// again). Defaults to 10s.
	WritersDuration time.Duration
	// Replay, when positive, adds the replay phase (PostgreSQL): that many messages are
	// seeded into the published history, and the live latency at Rate is measured for
	// Duration right before outbox.Replay publishes them again and while it does.
	Replay int
	// ReplayRate is the replay's ReplayConfig.Rate (0: outbox.Replay's default).
	ReplayRate float64
	// Critical, when positive, adds the critical phase: a backlog of Events in which
	// that fraction of the messages, spread through it, are of topic "payments" on keys
	// of their own, drained once as it is and once with those messages given a priority.
	Critical float64
	// Broker2URL, when set, adds the destinations phase: the same backlog drained to a
	// destination on BrokerURL alone, to one on Broker2URL alone, and to both through an
	// outbox.Router, half the events to each.
	Broker2URL string
	// PinXmin, when set, measures the drain and latency phases a second time with a
	// snapshot held open in the bench's database for their whole length (PostgreSQL: a
	// REPEATABLE READ transaction, which pins the xmin horizon so vacuum removes nothing;
	// MySQL: a consistent snapshot, which holds back purge; SQLite: a read transaction,
	// which holds back checkpoints). The result gets the Pinned figures.
	PinXmin bool
	// SchemaVersion migrates the outbox up to this version only (PostgreSQL 3: the pending
	// table without the ring; MySQL 3: without the priority index), to compare layouts.
	// Defaults to the latest.
	SchemaVersion int
	// RotateRows is the PostgreSQL store's RotateRows (the pending ring's bucket size);
	// 0 means its default.
	RotateRows int
	// Source is how the relays learn of new messages: SourcePoll (LISTEN/NOTIFY and
	// polling, the default) or SourceWAL (PostgreSQL logical replication). With
	// SourceWAL the phases run twice on one server, polling first, then in WAL mode
	// after 'outbox wal setup': the result is WAL mode's, and Poll polling's. Without a
	// DatabaseURL the bench starts a private server with wal_level=logical (and
	// pg_stat_statements), and then also measures the server's CPU time during the
	// drain and the statements it runs while the outbox is idle.
	Source string
	// ExtraRates are more latency-phase rates, measured after Rate's (SourceWAL
	// defaults to 5,000 events/s).
	ExtraRates []int
	// Idle is how long the idle phase (SourceWAL on the private server) counts the
	// statements of relays with nothing to do. Defaults to 10s.
	Idle time.Duration
	// Outboxes is the number of outboxes of a fleet run (RunFleet); Run ignores it.
	Outboxes int
	// Command runs `outbox` (the executable and any arguments before the command's):
	// a fleet run starts its relay processes with it.
	Command []string
	// ParkAfter is a fleet run's --park-after; 0 means the relay's default.
	ParkAfter time.Duration
	Relay     outbox.RelayConfig
	Progress  io.Writer // Progress lines; nil for none.
}

// Result is what a run measured.
type Result struct {
	DB             string
	Events, Relays int
	Runs           int
	Rate           int
	Phases
	// Pinned holds the same figures measured with a snapshot held open (Config.PinXmin),
	// nil without it.
	Pinned *Phases
	// Source is Config.Source; Poll holds polling's figures measured in the same run
	// when it is SourceWAL (the others are WAL mode's), nil otherwise.
	Source string
	Poll   *Phases
}

// Sources of Config.Source.
const (
	SourcePoll = "poll"
	SourceWAL  = "wal"
)

// Phases is what the drain and latency phases measured.
type Phases struct {
	EPS, RawEPS   float64
	Ratio         float64 // median of the runs' eps/raw_eps
	DrainSeconds  float64
	P50, P95, P99 time.Duration
	LatencyEvents int
	RSSMiB        float64 // peak resident memory while the relays drained
	Writers       *WritersPhase
	Replay        *ReplayPhase
	Destinations  *DestinationsPhase
	Critical      *CriticalPhase
	// Extra are the latency phases at Config.ExtraRates.
	Extra []RateLatency
	// Server is what the relays cost the PostgreSQL server, when the bench can see its
	// processes and statements (Config.Source "wal" on its private server); nil
	// otherwise.
	Server *ServerLoad
	// LogShare is, in WAL mode, the part of the latency phases' events the relays took
	// from the stream with no fetch (RelayStats.FromLog over RelayStats.Published).
	LogShare float64
}

// RateLatency is a latency phase's figures at one rate.
type RateLatency struct {
	Rate          int
	Events        int
	P50, P95, P99 time.Duration
}

// ServerLoad is what the relays cost the PostgreSQL server and the machine.
type ServerLoad struct {
	// CPUPer10k is the CPU time of every server process (backends, walsender, background
	// workers) per 10,000 events drained, from the relays' start to the last confirm
	// (the backlog was written before); WalsenderPer10k is the walsender's part.
	CPUPer10k, WalsenderPer10k time.Duration
	// RelayCPUPer10k is the bench process's CPU time per 10,000 events over the same
	// span: the relays run in it. BusyCores is how many of the machine's CPUs were busy
	// on average meanwhile (every process: the server, the relays, the broker): near the
	// machine's count, the drain's rate is set by the CPU time each event costs.
	RelayCPUPer10k time.Duration
	BusyCores      float64
	// IdleQPS is statements per second while the relays run with nothing to publish
	// (their lease rounds included); IdleFetchQPS the fetches among them.
	IdleQPS, IdleFetchQPS float64
}

// WritersPhase is what the writers phase measured (Config.Writers).
type WritersPhase struct {
	Writers int
	Events  int
	// WriterEPS is events committed per second while the writers ran; RelayEPS is the
	// same events published per second, from the writers' start to the last confirm.
	WriterEPS, RelayEPS float64
	// LogShare is, in WAL mode, the part of the events published while the writers ran
	// that the relays took from the stream with no fetch.
	LogShare float64
	// CatchUp is how long after the last commit the last event was confirmed.
	CatchUp       time.Duration
	P50, P95, P99 time.Duration // COMMIT returned -> broker confirmed
	// CommitP50 and CommitP99 are how long one whole write transaction took, from its
	// BEGIN to its COMMIT returned.
	CommitP50, CommitP99 time.Duration
	// NaiveEPS is the reference measured in the same run: the same writers committing
	// the same one-event transactions as one plain INSERT each into a naive outbox table
	// (naiveTable) that no relay reads, on the same pool, for half of WritersDuration
	// right before the writers and half right after (events of both halves over their
	// time). X is WriterEPS / NaiveEPS. Both are 0, and NaiveEvents and the naive
	// latencies too, on SQLite, which has no reference: it takes one writer at a time.
	NaiveEPS, X                    float64
	NaiveEvents                    int
	NaiveCommitP50, NaiveCommitP99 time.Duration // BEGIN -> COMMIT returned, both halves pooled
}

// String is the one-line summary, `bench: key=value ...`.
func (r Result) String() string {
	ratio := r.Ratio
	if ratio == 0 && r.RawEPS > 0 {
		ratio = r.EPS / r.RawEPS
	}
	ms := msText
	source := ""
	if r.Source == SourceWAL {
		source = " source=wal"
	}
	line := fmt.Sprintf("bench: db=%s%s events=%d relays=%d runs=%d eps=%.0f raw_eps=%.0f ratio=%.2f drain_s=%.2f rate=%d latency_events=%d p50_ms=%s p95_ms=%s p99_ms=%s rss_mib=%.0f",
		r.DB, source, r.Events, r.Relays, max(r.Runs, 1), r.EPS, r.RawEPS, ratio, r.DrainSeconds, r.Rate, r.LatencyEvents, ms(r.P50), ms(r.P95), ms(r.P99), r.RSSMiB)
	line += r.Phases.extraKeys("")
	if r.Source == SourceWAL && r.LatencyEvents > 0 {
		line += fmt.Sprintf(" log_share=%.2f", r.LogShare)
	}
	if w := r.Writers; w != nil {
		line += fmt.Sprintf(" writers=%d writers_events=%d writer_eps=%.0f relay_eps=%.0f relay_writer_ratio=%.2f catch_up_ms=%s writers_p50_ms=%s writers_p95_ms=%s writers_p99_ms=%s",
			w.Writers, w.Events, w.WriterEPS, w.RelayEPS, w.RelayEPS/max(w.WriterEPS, 1e-9), ms(w.CatchUp), ms(w.P50), ms(w.P95), ms(w.P99))
		if w.NaiveEPS > 0 {
			line += fmt.Sprintf(" naive_writer_eps=%.0f writer_x=%.2f", w.NaiveEPS, w.X)
		}
		line += fmt.Sprintf(" writer_commit_p50_ms=%s writer_commit_p99_ms=%s", ms(w.CommitP50), ms(w.CommitP99))
		if r.Source == SourceWAL {
			line += fmt.Sprintf(" writers_log_share=%.2f", w.LogShare)
		}
		if w.NaiveEPS > 0 {
			line += fmt.Sprintf(" naive_commit_p50_ms=%s naive_commit_p99_ms=%s", ms(w.NaiveCommitP50), ms(w.NaiveCommitP99))
		}
	}
	if d := r.Destinations; d != nil {
		line += fmt.Sprintf(" dest1_eps=%.0f dest2_eps=%.0f dests_eps=%.0f dests_x=%.2f", d.EPS1, d.EPS2, d.EPS, d.X())
	}
	if c := r.Critical; c != nil {
		line += fmt.Sprintf(" critical=%g critical_msgs=%d critical_x=%.3f critical_base_x=%.3f critical_eps=%.0f critical_base_eps=%.0f critical_eps_x=%.2f",
			c.Fraction, c.Messages, c.X, c.BaseX, c.EPS, c.BaseEPS, c.EPSX())
	}
	if rp := r.Replay; rp != nil {
		line += fmt.Sprintf(" replay=%d replay_eps=%.0f replay_s=%.1f replay_paused=%t replay_base_p50_ms=%s replay_base_p99_ms=%s replay_p50_ms=%s replay_p99_ms=%s replay_p99_x=%.2f",
			rp.History, rp.ReplayEPS, rp.ReplaySeconds, rp.Paused, ms(rp.BaseP50), ms(rp.BaseP99), ms(rp.P50), ms(rp.P99), rp.X())
	}
	if p := r.Pinned; p != nil {
		line += fmt.Sprintf(" pinned_eps=%.0f pinned_raw_eps=%.0f pinned_ratio=%.2f pinned_p50_ms=%s pinned_p95_ms=%s pinned_p99_ms=%s pinned_eps_x=%.2f pinned_p99_x=%.2f",
			p.EPS, p.RawEPS, p.Ratio, ms(p.P50), ms(p.P95), ms(p.P99), div(p.EPS, r.EPS), div(float64(p.P99), float64(r.P99)))
	}
	if p := r.Poll; p != nil {
		line += fmt.Sprintf(" poll_eps=%.0f poll_raw_eps=%.0f poll_ratio=%.2f poll_p50_ms=%s poll_p95_ms=%s poll_p99_ms=%s",
			p.EPS, p.RawEPS, p.Ratio, ms(p.P50), ms(p.P95), ms(p.P99))
		line += p.extraKeys("poll_")
		if w, pw := r.Writers, p.Writers; w != nil && pw != nil {
			line += fmt.Sprintf(" poll_writer_eps=%.0f poll_writers_p99_ms=%s poll_writer_commit_p99_ms=%s writer_eps_x=%.2f",
				pw.WriterEPS, ms(pw.P99), ms(pw.CommitP99), div(w.WriterEPS, pw.WriterEPS))
		}
		line += fmt.Sprintf(" eps_x=%.2f p99_x=%.2f", div(r.EPS, p.EPS), div(float64(r.P99), float64(p.P99)))
		if r.Server != nil && p.Server != nil {
			line += fmt.Sprintf(" pg_cpu_x=%.2f cpu_x=%.2f", div(float64(r.Server.CPUPer10k), float64(p.Server.CPUPer10k)),
				div(float64(r.Server.CPUPer10k+r.Server.RelayCPUPer10k), float64(p.Server.CPUPer10k+p.Server.RelayCPUPer10k)))
		}
	}
	return line
}

// div is a / b, and 0 when b is: a ratio of the line whose reference was not measured.
func div(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// msText writes d in milliseconds with two decimals, as the line's *_ms keys are.
func msText(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64)
}

// extraKeys are the line's keys for the extra rates' latencies and the server's load,
// each prefixed.
func (ph Phases) extraKeys(prefix string) string {
	var b strings.Builder
	for _, x := range ph.Extra {
		fmt.Fprintf(&b, " %sr%d_p50_ms=%s %sr%d_p95_ms=%s %sr%d_p99_ms=%s", prefix, x.Rate, msText(x.P50), prefix, x.Rate, msText(x.P95), prefix, x.Rate, msText(x.P99))
	}
	if l := ph.Server; l != nil {
		fmt.Fprintf(&b, " %spg_cpu_ms_per_10k=%s %swalsender_cpu_ms_per_10k=%s %srelay_cpu_ms_per_10k=%s %sbusy_cores=%.2f %sidle_qps=%.1f %sidle_fetch_qps=%.1f",
			prefix, msText(l.CPUPer10k), prefix, msText(l.WalsenderPer10k), prefix, msText(l.RelayCPUPer10k), prefix, l.BusyCores,
			prefix, l.IdleQPS, prefix, l.IdleFetchQPS)
	}
	return b.String()
}

func (c Config) withDefaults() Config {
	c.DB = cmp.Or(c.DB, DBPostgres)
	if c.DB != DBPostgres && c.Relay.PollInterval == 0 {
		c.Relay.PollInterval = 50 * time.Millisecond // no LISTEN/NOTIFY: poll
	}
	c.BrokerURL = cmp.Or(c.BrokerURL, "nats://127.0.0.1:4222")
	c.Events = cmp.Or(c.Events, 200_000)
	c.Keys = cmp.Or(c.Keys, 1_000)
	c.PayloadBytes = cmp.Or(c.PayloadBytes, 130)
	c.Relays = cmp.Or(c.Relays, 1)
	c.Rate = cmp.Or(c.Rate, 1_000)
	c.Runs = cmp.Or(c.Runs, 1)
	c.Duration = cmp.Or(c.Duration, 10*time.Second)
	c.WritersDuration = cmp.Or(c.WritersDuration, 10*time.Second)
	c.Source = cmp.Or(c.Source, SourcePoll)
	if c.Source == SourceWAL && c.ExtraRates == nil {
		c.ExtraRates = []int{5_000}
	}
	c.Idle = cmp.Or(c.Idle, 10*time.Second)
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.Relay.Logger == nil {
		c.Relay.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// Run performs the three phases: raw reference, backlog drain, steady-rate latency.
func Run(ctx context.Context, cfg Config) (Result, error) {
	cfg = cfg.withDefaults()
	if cfg.Events < 1 || cfg.Keys < 1 || cfg.PayloadBytes < 1 || cfg.Relays < 1 || cfg.Rate < 1 || cfg.Runs < 1 {
		return Result{}, errors.New("bench: events, keys, payload bytes, relays, rate and runs must be positive")
	}
	for _, r := range cfg.ExtraRates {
		if r < 1 {
			return Result{}, errors.New("bench: extra rates must be positive")
		}
	}
	switch {
	case cfg.Critical < 0 || cfg.Critical >= 1:
		return Result{}, errors.New("bench: the critical fraction must lie between 0 and 1")
	case cfg.Source != SourcePoll && cfg.Source != SourceWAL:
		return Result{}, fmt.Errorf("bench: unknown source %q: want %s or %s", cfg.Source, SourcePoll, SourceWAL)
	case cfg.Source == SourceWAL && cfg.DB != DBPostgres:
		return Result{}, errors.New("bench: WAL mode reads PostgreSQL's logical replication: --source wal needs --db postgres")
	case cfg.Source == SourceWAL && cfg.PinXmin:
		return Result{}, errors.New("bench: --pin-xmin and --source wal measure different things: run them apart")
	case cfg.Source != SourceWAL || cfg.DatabaseURL != "":
		return run(ctx, cfg, 0)
	}
	// A private server with logical decoding, whose processes and statements the bench
	// can see.
	fmt.Fprintf(cfg.Progress, "bench: starting a private PostgreSQL server (wal_level=logical, pg_stat_statements)\n")
	srv, err := pgserver.Start(pgserver.Options{Settings: []string{"wal_level=logical",
		"shared_preload_libraries=pg_stat_statements", "max_wal_senders=20", "max_replication_slots=20"}})
	if err != nil {
		return Result{}, fmt.Errorf("bench: a private PostgreSQL server: %w", err)
	}
	defer srv.Close()
	c := cfg
	c.DatabaseURL = srv.URL()
	return run(ctx, c, srv.PID())
}

// run is Run on cfg's database; postmaster, when not 0, is the PostgreSQL server's
// process, whose CPU time the phases then measure.
func run(ctx context.Context, cfg Config, postmaster int) (Result, error) {
	res := Result{DB: cfg.DB, Events: cfg.Events, Relays: cfg.Relays, Rate: cfg.Rate, Source: cfg.Source}
	tag := randomTag()
	say := func(format string, args ...any) { fmt.Fprintf(cfg.Progress, "bench: "+format+"\n", args...) }

	target, err := openTarget(ctx, cfg.BrokerURL)
	if err != nil {
		return res, err
	}
	defer target.Close()
	payload := make([]byte, cfg.PayloadBytes)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}

	db, err := openDatabase(ctx, cfg, tag)
	if err != nil {
		return res, err
	}
	defer db.drop()
	rawDest, dropRaw, err := target.Prepare(ctx, "bench_raw_"+tag)
	if err != nil {
		return res, err
	}
	defer dropRaw()
	dest, drop, err := target.Prepare(ctx, "bench_"+tag)
	if err != nil {
		return res, err
	}
	defer drop()
	if path := os.Getenv("OUTBOX_BENCH_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return res, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return res, err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}

	rss := &rssSampler{}
	rss.start()
	defer rss.stop()
	m := &measurer{cfg: cfg, target: target, db: db, payload: payload, rawDest: rawDest, dest: dest, tag: tag,
		rss: rss, confirmed: &confirmLog{}, say: say}
	pg, _ := db.(*postgres) // nil on the other stores; Run allows postmaster and SourceWAL only on PostgreSQL
	if postmaster != 0 {
		m.cpu = &pgCPU{postmaster: postmaster}
		if err := pg.statementsOn(ctx); err != nil {
			return res, fmt.Errorf("bench: pg_stat_statements: %w", err)
		}
	}
	if cfg.Source == SourceWAL {
		// Polling first, on the same server, then WAL mode: setup turns the NOTIFY
		// trigger off, which polling's wake-ups need. Each mode starts on a vacuumed,
		// checkpointed database.
		if err := pg.quiesce(ctx); err != nil {
			return res, err
		}
		poll, err := m.phases(ctx, "poll ")
		if err != nil {
			return res, err
		}
		res.Poll = &poll
		say("WAL mode: setting up the slot and publication")
		if err := pg.walSetup(ctx); err != nil {
			return res, err
		}
		if err := pg.quiesce(ctx); err != nil {
			return res, err
		}
		m.cfg.Relay.WAL = &outbox.WALConfig{}
	}
	if res.Phases, err = m.phases(ctx, ""); err != nil {
		return res, err
	}
	res.Runs = cfg.Runs
	if cfg.PinXmin {
		say("pinning: a snapshot is held open in the bench's database from here to the end")
		release, err := db.pin(ctx)
		if err != nil {
			return res, fmt.Errorf("hold a snapshot open: %w", err)
		}
		pinned, err := m.phases(ctx, "pinned ")
		release()
		if err != nil {
			return res, err
		}
		res.Pinned = &pinned
	}
	return res, nil
}

// measurer runs the raw, drain and latency phases on one database and broker.
type measurer struct {
	cfg                Config
	target             Target
	db                 database
	payload            []byte
	rawDest, dest, tag string
	rss                *rssSampler
	confirmed          *confirmLog
	say                func(format string, args ...any)
	pass               int
	cpu                *pgCPU // nil: the server's processes are not this machine's to see
}

// phases measures cfg.Runs times the reference and then the relays draining a fresh
// backlog, so every ratio compares two rates taken minutes apart at most, and then the
// latency phase; label prefixes the progress lines.
func (m *measurer) phases(ctx context.Context, label string) (Phases, error) {
	cfg, say := m.cfg, m.say
	m.pass++
	var ph Phases
	var eps, raws, ratios, drains []float64
	var running *relaySet
	defer func() {
		if running != nil {
			running.stop(ctx)
		}
	}()
	for run := 1; run <= cfg.Runs; run++ {
		if running != nil { // the last run's relays stay up for the latency phase
			running.stop(ctx)
			running = nil
		}
		// Phase 1: the reference. Same client, same messages, same stream settings, no
		// database.
		say("%srun %d/%d: raw publish of %d messages", label, run, cfg.Runs, cfg.Events)
		raw, err := rawPublish(ctx, m.target, m.rawDest, m.payload, cfg.Events, cfg.Keys)
		if err != nil {
			return ph, fmt.Errorf("raw publish: %w", err)
		}
		say("%sraw: %.0f msgs/s", label, raw)

		// Phase 2: drain a backlog with the relays.
		say("%swriting a backlog of %d events over %d keys", label, cfg.Events, cfg.Keys)
		if err := writeBacklog(ctx, m.db, cfg, m.payload, nil, say); err != nil {
			return ph, err
		}
		if err := m.db.settle(ctx); err != nil {
			return ph, err
		}
		// rss_mib is the relays' memory while draining: give back what the raw phase and
		// the backlog writers used, and measure from here.
		debug.FreeOSMemory()
		m.rss.reset()
		var cpuBefore cpuTimes
		var hostBefore hostCPU
		if m.cpu != nil {
			if cpuBefore, err = m.cpu.sample(); err != nil {
				return ph, err
			}
			if hostBefore, err = sampleHost(); err != nil {
				return ph, err
			}
		}
		running, err = startRelays(ctx, cfg, m.target, m.db, m.dest, fmt.Sprintf("%s-%d-%d", m.tag, m.pass, run), m.confirmed)
		if err != nil {
			return ph, err
		}
		d, err := running.waitPublished(ctx, int64(cfg.Events), func(n int64, elapsed time.Duration) {
			say("%sdrained %d/%d (%.0f/s), rss %.0f MiB", label, n, cfg.Events, float64(n)/elapsed.Seconds(), m.rss.peakMiB())
		})
		if err != nil {
			return ph, err
		}
		if m.cpu != nil {
			after, err := m.cpu.sample()
			if err != nil {
				return ph, err
			}
			host, err := sampleHost()
			if err != nil {
				return ph, err
			}
			all, walsender := after.since(cpuBefore)
			per := func(d time.Duration) time.Duration { return d * 10_000 / time.Duration(cfg.Events) }
			ph.Server = &ServerLoad{CPUPer10k: per(all), WalsenderPer10k: per(walsender),
				RelayCPUPer10k: per(host.self - hostBefore.self), BusyCores: host.busyCores(hostBefore)}
			say("%sCPU per 10,000 events: PostgreSQL %.0f ms (walsender %.0f ms), relays %.0f ms; %.2f cores busy", label,
				float64(ph.Server.CPUPer10k)/float64(time.Millisecond), float64(ph.Server.WalsenderPer10k)/float64(time.Millisecond),
				float64(ph.Server.RelayCPUPer10k)/float64(time.Millisecond), ph.Server.BusyCores)
		}
		e := float64(cfg.Events) / d.Seconds()
		say("%sdrain: %.0f events/s (%.2f of raw), peak rss %.0f MiB", label, e, e/raw, m.rss.peakMiB())
		ph.RSSMiB = max(ph.RSSMiB, m.rss.peakMiB())
		if err := m.emptyDestinations(ctx); err != nil {
			return ph, err
		}
		eps, raws, ratios, drains = append(eps, e), append(raws, raw), append(ratios, e/raw), append(drains, d.Seconds())
	}
	ph.EPS, ph.RawEPS, ph.Ratio, ph.DrainSeconds = median(eps), median(raws), median(ratios), median(drains)

	// Phase 3: commit-to-confirm latency at a fixed rate, woken by LISTEN/NOTIFY (or the
	// WAL stream), then at each extra rate.
	if cfg.Duration > 0 {
		before := running.counts()
		for i, rate := range append([]int{cfg.Rate}, cfg.ExtraRates...) {
			say("%slatency: %d events/s for %s", label, rate, cfg.Duration)
			c := cfg
			c.Rate = rate
			lat, err := steadyLatency(ctx, m.db, c, m.payload, m.confirmed, func(format string, args ...any) { say(label+format, args...) })
			if err != nil {
				return ph, err
			}
			r := RateLatency{Rate: rate, Events: len(lat)}
			if len(lat) > 0 {
				r.P50, r.P95, r.P99 = percentiles(lat)
			}
			if i == 0 {
				ph.LatencyEvents, ph.P50, ph.P95, ph.P99 = r.Events, r.P50, r.P95, r.P99
			} else {
				ph.Extra = append(ph.Extra, r)
			}
		}
		ph.LogShare = running.counts().logShare(before)
	}

	// Phase 3a: live traffic beside a replay of the history.
	if cfg.Replay > 0 {
		pg, ok := m.db.(*postgres)
		if !ok {
			return ph, errors.New("bench: --replay reads PostgreSQL's published history: it needs --db postgres")
		}
		rp, err := m.replayPhase(ctx, pg)
		if err != nil {
			return ph, err
		}
		ph.Replay = rp
	}

	// Phase 3b: the statements of relays with nothing to publish.
	if ph.Server != nil && running != nil {
		pg, ok := m.db.(*postgres)
		if ok {
			if err := m.idlePhase(ctx, pg, &ph, label); err != nil {
				return ph, err
			}
		}
	}

	// Phase 4: writers at full speed while the relays publish.
	if cfg.Writers > 0 {
		say("%swriters: %d writers at full speed for %s, one event per transaction, while the relays publish", label, cfg.Writers, cfg.WritersDuration)
		before := running.counts()
		w, err := writersPhase(ctx, m.db, cfg, m.payload, m.confirmed, func(format string, args ...any) { say(label+format, args...) })
		if err != nil {
			return ph, err
		}
		w.LogShare = running.counts().logShare(before)
		naive := ""
		if w.NaiveEPS > 0 {
			naive = fmt.Sprintf("; naive table %.0f/s (writer_x %.2f), its commits p50 %s ms, p99 %s ms", w.NaiveEPS, w.X, msText(w.NaiveCommitP50), msText(w.NaiveCommitP99))
		}
		say("%swriters: %d events, writers %.0f/s, relays %.0f/s (%.2f of the writers), caught up %.0f ms after the last commit, p99 %.2f ms; commits p50 %s ms, p99 %s ms%s",
			label, w.Events, w.WriterEPS, w.RelayEPS, w.RelayEPS/max(w.WriterEPS, 1e-9), float64(w.CatchUp)/float64(time.Millisecond), float64(w.P99)/float64(time.Millisecond),
			msText(w.CommitP50), msText(w.CommitP99), naive)
		ph.Writers = w
	}

	// Phase 5: two destinations, with relays of its own (the drain's would take a share
	// of the shards and publish to the drain's destination).
	if cfg.Broker2URL != "" {
		if running != nil {
			running.stop(ctx)
			running = nil
		}
		dp, err := m.destinationsPhase(ctx)
		if err != nil {
			return ph, err
		}
		ph.Destinations = dp
	}

	// Phase 6: a backlog with critical messages in it, with relays of its own.
	if cfg.Critical > 0 {
		if running != nil {
			running.stop(ctx)
			running = nil
		}
		cp, err := m.criticalPhase(ctx)
		if err != nil {
			return ph, err
		}
		ph.Critical = cp
	}
	return ph, nil
}

// emptyDestinations empties the raw and the relays' destinations if the broker needs it
// (emptier), after a drain filled them.
func (m *measurer) emptyDestinations(ctx context.Context) error {
	e, ok := m.target.(emptier)
	if !ok {
		return nil
	}
	for _, route := range []string{m.rawDest, m.dest} {
		if err := e.Empty(ctx, route); err != nil {
			return fmt.Errorf("bench: empty the destination after the drain: %w", err)
		}
	}
	return nil
}

// idlePhase counts the statements the running relays make while nothing is written, for
// cfg.Idle, after a second for what was in flight to settle.
func (m *measurer) idlePhase(ctx context.Context, pg *postgres, ph *Phases, label string) error {
	m.say("%sidle: counting statements for %s with nothing to publish", label, m.cfg.Idle)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Second):
	}
	all0, fetch0, err := statementCounts(ctx, pg.pool)
	if err != nil {
		return fmt.Errorf("count statements (pg_stat_statements): %w", err)
	}
	start := time.Now()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(m.cfg.Idle):
	}
	all1, fetch1, err := statementCounts(ctx, pg.pool)
	if err != nil {
		return fmt.Errorf("count statements (pg_stat_statements): %w", err)
	}
	secs := time.Since(start).Seconds()
	ph.Server.IdleQPS, ph.Server.IdleFetchQPS = float64(all1-all0)/secs, float64(fetch1-fetch0)/secs
	m.say("%sidle: %.1f statements/s, %.1f of them fetches", label, ph.Server.IdleQPS, ph.Server.IdleFetchQPS)
	return nil
}

// writersPhase runs cfg.Writers goroutines that each commit one event per transaction,
// beginning the next as soon as the last committed, for cfg.WritersDuration, while the
// relays (already running) publish; then it waits until every event is confirmed.
//
// Around it runs the reference, where the database has one: the same writers on the same
// pool commit the same events as one plain INSERT each into the naive table, for half of
// cfg.WritersDuration right before ours and half right after, and the halves count as
// one run, so that drift on a shared machine (other load, the database's checkpoints and
// caches) falls on both sides alike. The relays stay up meanwhile, as they have since the
// drain, but idle: the first half begins after everything written before was confirmed,
// the second after all of ours were, and no relay reads the naive table: on PostgreSQL
// they wait on LISTEN, which its INSERTs do not notify (in WAL mode the walsender decodes
// its rows and drops them, as it would beside an application's tables), elsewhere they
// poll, the same few queries a second during both halves as during ours. Stopping them
// for the reference would leave their restart inside our phase.
func writersPhase(ctx context.Context, db database, cfg Config, payload []byte, confirmed *confirmLog, say func(string, ...any)) (*WritersPhase, error) {
	pool, err := db.writers(ctx, cfg.Writers)
	if err != nil {
		return nil, fmt.Errorf("writers: %w", err)
	}
	defer pool.close()
	keyOf := func(g, i int) string {
		return "writer-" + strconv.Itoa(g) + "-" + strconv.Itoa(i%(cfg.Keys/cfg.Writers+1))
	}
	var naive []commitRun
	naiveHalf := func(which string) error {
		if pool.naive == nil {
			return nil
		}
		say("writers: naive reference, %s half: %d writers for %s, one plain INSERT per transaction into %s, no relay",
			which, cfg.Writers, cfg.WritersDuration/2, naiveTable)
		body := jsonPayload(len(payload))
		r, err := commitLoop(ctx, cfg.Writers, cfg.WritersDuration/2, func(g, i int) (outbox.ID, error) {
			e := naiveEvent{ID: outbox.NewID(), AggregateType: "orders", AggregateID: keyOf(g, i), EventType: "order.placed", Payload: body}
			return e.ID, pool.naive(ctx, e)
		})
		if err != nil {
			return fmt.Errorf("writers: naive reference: %w", err)
		}
		naive = append(naive, r)
		return nil
	}

	if err := naiveHalf("first"); err != nil {
		return nil, err
	}
	confirmed.begin()
	ours, err := commitLoop(ctx, cfg.Writers, cfg.WritersDuration, func(g, i int) (outbox.ID, error) {
		id := outbox.NewID()
		m := outbox.Message{Topic: "orders", Key: keyOf(g, i), Payload: tracked(payload, id), ContentType: "application/octet-stream"}
		return id, pool.write(ctx, []outbox.Message{m})
	})
	if err != nil {
		return nil, fmt.Errorf("writers: %w", err)
	}
	all := ours.commits
	w := &WritersPhase{Writers: cfg.Writers, Events: len(all)}
	if len(all) == 0 {
		return w, nil
	}
	var lastCommit, lastConfirm time.Time
	lat := make([]time.Duration, 0, len(all))
	waitUntil := time.Now().Add(60 * time.Second)
	for _, c := range all {
		for {
			if t, ok := confirmed.get(c.id); ok {
				lat = append(lat, max(t.Sub(c.at), 0))
				if t.After(lastConfirm) {
					lastConfirm = t
				}
				break
			}
			if time.Now().After(waitUntil) {
				return nil, fmt.Errorf("writers: event %s committed but not confirmed within 60s of the writers' end", c.id)
			}
			time.Sleep(time.Millisecond)
		}
		if c.at.After(lastCommit) {
			lastCommit = c.at
		}
	}
	if err := naiveHalf("second"); err != nil {
		return nil, err
	}

	w.WriterEPS = float64(len(all)) / ours.seconds()
	w.RelayEPS = float64(len(all)) / lastConfirm.Sub(ours.start).Seconds()
	w.CatchUp = max(lastConfirm.Sub(lastCommit), 0)
	w.P50, w.P95, w.P99 = percentiles(lat)
	w.CommitP50, _, w.CommitP99 = percentiles(ours.durations())
	var secs float64
	var naiveLat []time.Duration
	for _, r := range naive {
		w.NaiveEvents += len(r.commits)
		secs += r.seconds()
		naiveLat = append(naiveLat, r.durations()...)
	}
	if w.NaiveEvents > 0 && secs > 0 {
		w.NaiveEPS = float64(w.NaiveEvents) / secs
		w.X = w.WriterEPS / w.NaiveEPS
		w.NaiveCommitP50, _, w.NaiveCommitP99 = percentiles(naiveLat)
	}
	return w, nil
}

// commitRun is what commitLoop measured: when it started, and each transaction.
type commitRun struct {
	start   time.Time
	commits []commit
}

// commit is one transaction of a commitLoop: its event's id, when it began (before
// BEGIN) and when its COMMIT returned.
type commit struct {
	id        outbox.ID
	began, at time.Time
}

// seconds is the run's length: from its start to its last commit; 0 without commits.
func (r commitRun) seconds() float64 {
	var last time.Time
	for _, c := range r.commits {
		if c.at.After(last) {
			last = c.at
		}
	}
	if last.IsZero() {
		return 0
	}
	return last.Sub(r.start).Seconds()
}

// durations are how long each transaction took, BEGIN to COMMIT returned.
func (r commitRun) durations() []time.Duration {
	d := make([]time.Duration, len(r.commits))
	for i, c := range r.commits {
		d[i] = c.at.Sub(c.began)
	}
	return d
}

// commitLoop runs n goroutines that each commit one event per transaction with write (g
// is the goroutine, i its transaction; write returns the event's id once its commit
// returned), beginning the next as soon as the last committed, for d.
func commitLoop(ctx context.Context, n int, d time.Duration, write func(g, i int) (outbox.ID, error)) (commitRun, error) {
	per := make([][]commit, n)
	errs := make([]error, n)
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				began := time.Now()
				id, err := write(g, i)
				if err != nil {
					errs[g] = err
					return
				}
				per[g] = append(per[g], commit{id: id, began: began, at: time.Now()})
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return commitRun{}, err
	}
	r := commitRun{start: start}
	for _, c := range per {
		r.commits = append(r.commits, c...)
	}
	return r, nil
}

// jsonPayload returns a JSON value of n bytes, the naive table's payload for our payload
// of n bytes: {"d":"abc..."}, or below 8 bytes a number of n digits.
func jsonPayload(n int) string {
	const wrap = len(`{"d":""}`)
	if n < wrap {
		return strings.Repeat("1", n)
	}
	b := make([]byte, n-wrap)
	for i := range b {
		b[i] = 'a' + byte(i%26)
	}
	return `{"d":"` + string(b) + `"}`
}

// percentiles returns the 50th, 95th and 99th percentiles of lat, which it sorts.
func percentiles(lat []time.Duration) (p50, p95, p99 time.Duration) {
	slices.Sort(lat)
	return lat[len(lat)*50/100], lat[len(lat)*95/100], lat[len(lat)*99/100]
}

// relaySet is the relays of one drain run, each with its own pool and NATS connection.
type relaySet struct {
	relays  []*outbox.Relay
	closers []func()
}

func startRelays(ctx context.Context, cfg Config, target Target, db database, dest, tag string, confirmed *confirmLog) (*relaySet, error) {
	return startRelaysWith(ctx, cfg, db, tag, confirmed, func() (outbox.Publisher, func(), error) { return openPublisher(ctx, target, dest) })
}

// startRelaysWith starts cfg.Relays relays, each with a publisher of its own from open.
func startRelaysWith(ctx context.Context, cfg Config, db database, tag string, confirmed *confirmLog, open func() (outbox.Publisher, func(), error)) (*relaySet, error) {
	rs := &relaySet{}
	for i := 0; i < cfg.Relays; i++ {
		pub, closePub, err := open()
		if err != nil {
			rs.stop(ctx)
			return nil, err
		}
		rs.closers = append(rs.closers, closePub)
		// Each relay gets a pool of its own, as separate processes would.
		rdrv, closeStore, err := db.store(ctx)
		if err != nil {
			rs.stop(ctx)
			return nil, err
		}
		rs.closers = append(rs.closers, closeStore)
		rc := cfg.Relay
		rc.ID = fmt.Sprintf("bench-%s-%d", tag, i)
		r, err := outbox.NewRelay(rdrv, &timedPublisher{Publisher: pub, log: confirmed}, rc)
		if err == nil {
			err = r.Start(ctx)
		}
		if err != nil {
			rs.stop(ctx)
			return nil, err
		}
		rs.relays = append(rs.relays, r)
	}
	return rs, nil
}

// relayCounts are the relays' published messages, and of them those from the log.
type relayCounts struct{ published, fromLog int64 }

// counts sums the relays' counts; none for no relays.
func (rs *relaySet) counts() relayCounts {
	var c relayCounts
	if rs == nil {
		return c
	}
	for _, r := range rs.relays {
		st := r.Stats()
		c.published += st.Published
		c.fromLog += st.FromLog
	}
	return c
}

// logShare is the part of the messages published since before that came from the log.
func (c relayCounts) logShare(before relayCounts) float64 {
	return div(float64(c.fromLog-before.fromLog), float64(c.published-before.published))
}

// waitPublished waits until the relays have published n messages and returns how long
// that took from their start.
func (rs *relaySet) waitPublished(ctx context.Context, n int64, progress func(int64, time.Duration)) (time.Duration, error) {
	start := time.Now()
	last := start
	for {
		var published int64
		for _, r := range rs.relays {
			published += r.Stats().Published
		}
		if published >= n {
			return time.Since(start), nil
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if time.Since(last) >= 2*time.Second {
			progress(published, time.Since(start))
			last = time.Now()
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (rs *relaySet) stop(ctx context.Context) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, r := range rs.relays {
		_ = r.Stop(sctx)
	}
	for i := len(rs.closers) - 1; i >= 0; i-- {
		rs.closers[i]()
	}
	rs.relays, rs.closers = nil, nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func randomTag() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// rawPublish has the target publish n messages straight with its client, and returns the
// rate. The messages are those the relay sends for the same events, so the two rates
// differ by the relay's work only (reading, tracking and recording), not by message
// encoding.
func rawPublish(ctx context.Context, target Target, dest string, payload []byte, n, keys int) (float64, error) {
	created := time.Now()
	msgs := make([]*outbox.Message, n)
	for i := range msgs {
		m := &outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "k" + strconv.Itoa(i%keys), EventType: "order.placed",
			Payload: payload, ContentType: "application/octet-stream", CreatedAt: created, Seq: int64(i + 1)}
		m.DedupKey = m.ID.String()
		msgs[i] = m
	}
	start := time.Now()
	if err := target.Raw(ctx, dest, msgs); err != nil {
		return 0, err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// writeBacklog commits cfg.Events events in transactions of 5,000, two writers at once;
// shape, when not nil, changes the i-th event (of topic "orders" and key k<i mod keys>).
func writeBacklog(ctx context.Context, db database, cfg Config, payload []byte, shape func(i int, m *outbox.Message), say func(string, ...any)) error {
	const per = 5_000
	var next, done atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	start := time.Now()
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				from := int(next.Add(per)) - per
				if from >= cfg.Events {
					return
				}
				to := min(from+per, cfg.Events)
				msgs := make([]outbox.Message, 0, to-from)
				for i := from; i < to; i++ {
					msgs = append(msgs, backlogMessage("orders", i, cfg.Keys, payload))
					if shape != nil {
						shape(i, &msgs[len(msgs)-1])
					}
				}
				err := db.write(ctx, msgs)
				if err != nil {
					errs <- err
					return
				}
				if d := done.Add(int64(to - from)); d%100_000 < per {
					say("written %d/%d (%.0f/s)", d, cfg.Events, float64(d)/time.Since(start).Seconds())
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// backlogMessage is the i-th message of a backlog over keys keys, untimed.
func backlogMessage(topic string, i, keys int, payload []byte) outbox.Message {
	return outbox.Message{Topic: topic, Key: "k" + strconv.Itoa(i%keys), EventType: "order.placed",
		Payload: payload, ContentType: "application/octet-stream"}
}

// confirmLog records when each message was confirmed by the broker.
type confirmLog struct {
	mu sync.Mutex
	at map[outbox.ID]time.Time
}

func (c *confirmLog) record(msgs []*outbox.Message, errs []error, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at == nil {
		return // only recorded during the latency phase
	}
	for i, m := range msgs {
		if errs == nil || errs[i] == nil {
			if id, ok := trackingID(m); ok {
				c.at[id] = t
			}
		}
	}
}

// tracked returns a copy of payload that starts with id's text (a payload shorter than
// that grows to its length). The phases that time each event find it again by its
// payload, not by its ID: they write messages without an ID or a DedupKey, as
// applications do, for which the Writer claims no dedup key.
func tracked(payload []byte, id outbox.ID) []byte {
	tag := id.String()
	p := make([]byte, max(len(payload), len(tag)))
	copy(p, payload)
	copy(p, tag)
	return p
}

// trackingID returns the id a message's payload starts with (see tracked).
func trackingID(m *outbox.Message) (outbox.ID, bool) {
	if len(m.Payload) < 36 {
		return outbox.ID{}, false
	}
	id, err := outbox.ParseID(string(m.Payload[:36]))
	return id, err == nil
}

func (c *confirmLog) begin() {
	c.mu.Lock()
	c.at = map[outbox.ID]time.Time{}
	c.mu.Unlock()
}

func (c *confirmLog) get(id outbox.ID) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.at[id]
	return t, ok
}

type timedPublisher struct {
	outbox.Publisher
	log *confirmLog
}

func (p *timedPublisher) Publish(ctx context.Context, batch []*outbox.Message) []error {
	errs := p.Publisher.Publish(ctx, batch)
	p.log.record(batch, errs, time.Now())
	return errs
}

// steadyLatency commits one event at a time at cfg.Rate and returns, for each, the time
// from the moment its COMMIT returned to the moment the broker confirmed it. A phase of
// two minutes or more also reports each minute's percentiles through say, so a trend
// shows.
func steadyLatency(ctx context.Context, db database, cfg Config, payload []byte, confirmed *confirmLog, say func(string, ...any)) ([]time.Duration, error) {
	confirmed.begin()
	n := int(cfg.Duration.Seconds() * float64(cfg.Rate))
	committedAt := make(map[outbox.ID]time.Time, n)
	var mu sync.Mutex
	interval := time.Second / time.Duration(cfg.Rate)
	// Several writers, as an application has: one commit takes longer than the interval.
	const writers = 8
	jobs := make(chan outbox.Message, writers)
	var wg sync.WaitGroup
	var werr atomic.Value
	for g := 0; g < writers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range jobs {
				err := db.write(ctx, []outbox.Message{m})
				if err != nil {
					werr.Store(err)
					continue
				}
				t := time.Now()
				id, _ := trackingID(&m)
				mu.Lock()
				committedAt[id] = t
				mu.Unlock()
			}
		}()
	}
	start := time.Now()
	tick := time.NewTicker(interval)
	for i := 0; i < n; i++ {
		<-tick.C
		jobs <- outbox.Message{Topic: "orders", Key: "latency-" + strconv.Itoa(i%cfg.Keys), Payload: tracked(payload, outbox.NewID()), ContentType: "application/octet-stream"}
	}
	tick.Stop()
	close(jobs)
	wg.Wait()
	if err, ok := werr.Load().(error); ok {
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	var lat []time.Duration
	perMinute := map[int][]time.Duration{}
	for id, c := range committedAt {
		for {
			if t, ok := confirmed.get(id); ok {
				lat = append(lat, max(t.Sub(c), 0))
				minute := int(c.Sub(start) / time.Minute)
				perMinute[minute] = append(perMinute[minute], max(t.Sub(c), 0))
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("event %s committed but not confirmed within 30s", id)
			}
			time.Sleep(time.Millisecond)
		}
	}
	if path := os.Getenv("OUTBOX_BENCH_LATENCY_LOG"); path != "" {
		if err := appendLatencyLog(path, start, committedAt, confirmed); err != nil {
			return nil, err
		}
	}
	if cfg.Duration >= 2*time.Minute {
		for minute := 0; minute < len(perMinute); minute++ {
			if l := perMinute[minute]; len(l) > 0 {
				p50, _, p99 := percentiles(l)
				say("latency minute %d: %d events, p50 %.2f ms, p99 %.2f ms", minute+1, len(l),
					float64(p50)/float64(time.Millisecond), float64(p99)/float64(time.Millisecond))
			}
		}
	}
	return lat, nil
}

// appendLatencyLog appends to path one line per event of a latency phase that began at
// start: milliseconds from start to its commit, and from its commit to its confirm, in
// commit order, after a line "# phase" that separates the phases.
func appendLatencyLog(path string, start time.Time, committedAt map[outbox.ID]time.Time, confirmed *confirmLog) error {
	type event struct{ at, took time.Duration }
	events := make([]event, 0, len(committedAt))
	for id, c := range committedAt {
		t, _ := confirmed.get(id)
		events = append(events, event{c.Sub(start), max(t.Sub(c), 0)})
	}
	slices.SortFunc(events, func(a, b event) int { return cmp.Compare(a.at, b.at) })
	var b strings.Builder
	fmt.Fprintf(&b, "# phase started %.3f (Unix seconds); then per event: ms from the start to COMMIT, ms to the broker's confirm\n",
		float64(start.UnixMicro())/1e6)
	for _, e := range events {
		fmt.Fprintf(&b, "%.3f %.3f\n", float64(e.at)/float64(time.Millisecond), float64(e.took)/float64(time.Millisecond))
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("bench: latency log: %w", err)
	}
	_, err = f.WriteString(b.String())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("bench: latency log: %w", err)
	}
	return nil
}

// rssSampler tracks the process's peak resident memory while it runs.
type rssSampler struct {
	peak atomic.Int64
	done chan struct{}
}

func (s *rssSampler) start() {
	done := make(chan struct{})
	s.done = done
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			if kb := readRSSKiB(); kb > s.peak.Load() {
				s.peak.Store(kb)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
}

func (s *rssSampler) stop() {
	if s.done != nil {
		close(s.done)
		s.done = nil
	}
}

// reset makes the current RSS the peak.
func (s *rssSampler) reset() { s.peak.Store(readRSSKiB()) }

func (s *rssSampler) peakMiB() float64 { return float64(s.peak.Load()) / 1024 }

func readRSSKiB() int64 { return procStatusKiB("self", "VmRSS") }

// procStatusKiB reads a field in kB of /proc/<proc>/status (VmRSS, VmHWM); 0 when the
// process or the field is not there.
func procStatusKiB(proc, field string) int64 {
	b, err := os.ReadFile("/proc/" + proc + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb
		}
	}
	return 0
}
