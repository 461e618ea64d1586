package chaos

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/torture"
	"github.com/outboxkit/outbox/outboxpgx"
)

// Child relay configuration travels in the environment.
const (
	envChild    = "OUTBOX_TORTURE_RELAY"
	envDatabase = "OUTBOX_TORTURE_DATABASE_URL"
	envKind     = "OUTBOX_TORTURE_BROKER_KIND"
	envSchema   = "OUTBOX_TORTURE_SCHEMA"
	envBroker   = "OUTBOX_TORTURE_BROKER"
	envRoute    = "OUTBOX_TORTURE_ROUTE"
	envTTL      = "OUTBOX_TORTURE_LEASE_TTL"
	envID       = "OUTBOX_TORTURE_ID"
	envInFlight = "OUTBOX_TORTURE_MAX_IN_FLIGHT"
	envAppName  = "OUTBOX_TORTURE_APP_NAME"
	envAttempts = "OUTBOX_TORTURE_MAX_ATTEMPTS"
	envWAL      = "OUTBOX_TORTURE_WAL"
	envBatch    = "OUTBOX_TORTURE_BATCH"
	// envFleet (fleet.go) names a config file: the relay runs the outbox command.
)

// ringRotateRows is the relays' Config.RotateRows: at the workload's few hundred events a
// second, the pending ring moves on about every second (as often as relays recycle), so
// buckets are emptied, and their stragglers moved, all through the run and during every
// fault.
const ringRotateRows = 250

// historyRetention is the relays' retention: long enough that no day of the run expires
// (a run across midnight UTC keeps yesterday), short enough that the days churnHistory
// creates in the distant past are dropped at once.
const historyRetention = 48 * time.Hour

// IsRelay reports whether this process was started as a relay of a run. A program that
// runs torture runs (a test binary's TestMain, the outbox-torture command) must check it first
// thing and, if so, exit with RelayMain's code: relays are the same executable started
// again with their configuration in the environment.
func IsRelay() bool { return os.Getenv(envChild) == "1" }

// errPoison is the rejection the broker side gives a poison event.
var errPoison = errors.New("torture: poison refused by the broker side")

// refusePoison refuses every message carrying torture.PoisonHeader as a rejection (not
// an outage), so the relay retries it MaxAttempts times and dead-letters it, and passes
// the rest to the real publisher.
type refusePoison struct{ outbox.Publisher }

func (p refusePoison) Publish(ctx context.Context, batch []*outbox.Message) []error {
	var pass []*outbox.Message
	var idx []int
	errs := make([]error, len(batch))
	for i, m := range batch {
		if m.Headers[torture.PoisonHeader] != "" {
			errs[i] = errPoison
			continue
		}
		pass, idx = append(pass, m), append(idx, i)
	}
	if len(pass) == len(batch) {
		return p.Publisher.Publish(ctx, batch)
	}
	if len(pass) > 0 {
		for j, err := range p.Publisher.Publish(ctx, pass) {
			errs[idx[j]] = err
		}
	}
	return errs
}

// Reconnected passes the real publisher's reconnection signal through (a paused relay
// resumes at once on it); nil, which never fires, when it has none.
func (p refusePoison) Reconnected() <-chan struct{} {
	if rc, ok := p.Publisher.(outbox.Reconnector); ok {
		return rc.Reconnected()
	}
	return nil
}

// Ping passes the real publisher's Ping through (the relay pings after an outage).
func (p refusePoison) Ping(ctx context.Context) error {
	if pg, ok := p.Publisher.(outbox.Pinger); ok {
		return pg.Ping(ctx)
	}
	return nil
}

// RelayMain runs a relay until SIGTERM, logging JSON to stderr, and returns the exit code.
func RelayMain() int {
	if config := os.Getenv(envFleet); config != "" {
		return fleetRelayMain(config)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	cfg, err := pgxpool.ParseConfig(os.Getenv(envDatabase))
	if err != nil {
		log.Error("pool config", "err", err)
		return 1
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = os.Getenv(envAppName)
	// As the outbox command's relay: a connect timeout, and room for a fetch, an outcome
	// write, a lease round and the cleaner at once.
	cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	cfg.MaxConns = max(cfg.MaxConns, 8)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Error("pool", "err", err)
		return 1
	}
	defer pool.Close()
	drv, err := outboxpgx.New(pool, outboxpgx.Config{Schema: os.Getenv(envSchema), RotateRows: ringRotateRows})
	if err != nil {
		log.Error("driver", "err", err)
		return 1
	}
	var pub outbox.Publisher
	for { // the broker may be cut or restarting when this relay (re)starts
		p, err := dial(ctx, os.Getenv(envKind), os.Getenv(envBroker), os.Getenv(envRoute))
		if err == nil {
			defer p.Close()
			pub = p
			break
		}
		log.Warn("broker dial", "err", err)
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(200 * time.Millisecond):
		}
	}
	ttl, _ := time.ParseDuration(os.Getenv(envTTL))
	inFlight, _ := strconv.Atoi(os.Getenv(envInFlight))
	batch, _ := strconv.Atoi(os.Getenv(envBatch))
	attempts, _ := strconv.Atoi(os.Getenv(envAttempts))
	var wal *outbox.WALConfig
	if on, _ := strconv.ParseBool(os.Getenv(envWAL)); on {
		wal = &outbox.WALConfig{}
	}
	r, err := outbox.NewRelay(drv, refusePoison{pub}, outbox.RelayConfig{
		WAL: wal,
		ID:  os.Getenv(envID), LeaseTTL: ttl, MaxInFlight: inFlight, PublishBatchSize: min(250, max(inFlight, 1)), BatchSize: batch,
		PollInterval: 100 * time.Millisecond, MaxAttempts: attempts,
		RetryMinDelay: 50 * time.Millisecond, RetryMaxDelay: 200 * time.Millisecond,
		OutageMinDelay: 50 * time.Millisecond, OutageMaxDelay: time.Second, PublishTimeout: 5 * time.Second,
		CleanupInterval: time.Second, Retention: historyRetention,
		Logger: log,
	})
	if err != nil {
		log.Error("relay", "err", err)
		return 1
	}
	if err := r.Run(ctx, 5*time.Second); err != nil {
		log.Error("run", "err", err)
		return 1
	}
	return 0
}

// relayConfig is what every relay process of a run shares.
type relayConfig struct {
	databaseURL, schema, kind, broker, route, appName string
	ttl                                               time.Duration
	inFlight, batch, maxAttempts                      int      // batch 0: the relay's default
	env                                               []string // extra environment
	logDir                                            string   // where each incarnation's log is kept too ("": nowhere)
	wal                                               bool     // WAL mode
	fleetConfig                                       string   // the outbox command's config file (fleet.go), or "" for a library relay
}

// relay is one relay slot: a child process, restarted (as a new incarnation with a new
// ID) after a SIGKILL.
type relay struct {
	t    testenv.TB
	cfg  relayConfig
	slot int

	mu      sync.Mutex
	gen     int
	cmd     *exec.Cmd
	done    chan struct{}
	stderr  *testenv.Buffer
	logs    []string // tails of earlier incarnations
	hwmKiB  int64    // peak VmHWM over every incarnation
	stopped bool     // SIGSTOPped
}

func startRelay(t testenv.TB, cfg relayConfig, slot int) *relay {
	r := &relay{t: t, cfg: cfg, slot: slot}
	if err := r.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.kill()
		if t.Failed() {
			r.mu.Lock()
			t.Logf("relay %d logs (last incarnations):\n%s", slot, tail(strings.Join(r.logs, "")+r.stderr.String(), 60))
			r.mu.Unlock()
		}
	})
	return r
}

// id names the current incarnation in logs and fault records (r<slot>.<incarnation>).
func (r *relay) id() string { return "r" + strconv.Itoa(r.slot) + "." + strconv.Itoa(r.gen) }

// relayID is the relay ID every incarnation of the slot runs under, as a relay that
// systemd or a StatefulSet restarts keeps its ID: an incarnation started after a kill
// adopts its predecessor's leases at once (LeaseRequest.Adopt), under new tokens.
func (r *relay) relayID() string { return "r" + strconv.Itoa(r.slot) }

// start starts a new incarnation; r.mu must not be held.
func (r *relay) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gen++
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self)
	c := r.cfg
	cmd.Env = append(os.Environ(), envChild+"=1", envDatabase+"="+c.databaseURL, envSchema+"="+c.schema,
		envKind+"="+c.kind, envBroker+"="+c.broker, envRoute+"="+c.route,
		envTTL+"="+c.ttl.String(), envID+"="+r.relayID(), envInFlight+"="+strconv.Itoa(c.inFlight),
		envAppName+"="+c.appName, envAttempts+"="+strconv.Itoa(c.maxAttempts), envWAL+"="+strconv.FormatBool(c.wal),
		envBatch+"="+strconv.Itoa(c.batch))
	if c.fleetConfig != "" {
		cmd.Env = append(cmd.Env, envFleet+"="+c.fleetConfig)
	}
	cmd.Env = append(cmd.Env, c.env...)
	if r.stderr != nil {
		r.logs = append(r.logs, tail(r.stderr.String(), 20))
	}
	r.stderr = &testenv.Buffer{}
	cmd.Stderr = r.stderr
	var logFile *os.File
	if c.logDir != "" {
		if logFile, err = os.Create(filepath.Join(c.logDir, "relay-"+r.id()+".log")); err != nil {
			return err
		}
		cmd.Stderr = io.MultiWriter(r.stderr, logFile)
	}
	// The relay dies with this process even when the cleanups never run (a test
	// binary killed by -timeout's panic).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		if logFile != nil {
			_ = logFile.Close()
		}
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait() // copies the whole of stderr before it returns
		if logFile != nil {
			_ = logFile.Close()
		}
		close(done)
	}()
	r.cmd, r.done, r.stopped = cmd, done, false
	return nil
}

// sample reads the current incarnation's VmHWM into the peak; r.mu must be held.
func (r *relay) sampleLocked() {
	if r.cmd == nil || r.cmd.Process == nil {
		return
	}
	if kib := vmHWM(r.cmd.Process.Pid); kib > r.hwmKiB {
		r.hwmKiB = kib
	}
}

func (r *relay) sample() {
	r.mu.Lock()
	r.sampleLocked()
	r.mu.Unlock()
}

func (r *relay) peakKiB() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hwmKiB
}

// sigkill kills the current incarnation and waits for it to exit.
func (r *relay) sigkill() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sampleLocked()
	id := r.id()
	_ = r.cmd.Process.Kill()
	<-r.done
	return id
}

// stop stops the current incarnation gracefully (SIGTERM: it drains what it holds and
// gives its leases back) and waits for it to exit.
func (r *relay) stop() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sampleLocked()
	id := r.id()
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	<-r.done
	return id
}

// signal sends sig to the current incarnation.
func (r *relay) signal(sig syscall.Signal) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sampleLocked()
	r.stopped = sig == syscall.SIGSTOP
	return r.id(), r.cmd.Process.Signal(sig)
}

// exited reports whether the current incarnation has exited on its own.
func (r *relay) exited() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// kill ends the current incarnation for good (test cleanup).
func (r *relay) kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	r.sampleLocked()
	_ = r.cmd.Process.Signal(syscall.SIGCONT)
	_ = r.cmd.Process.Kill()
	<-r.done
}

// vmHWM returns the peak resident set of process pid in KiB (0 if unreadable).
func vmHWM(pid int) int64 {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return n
		}
	}
	return 0
}

func tail(s string, lines int) string {
	out := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(out) > lines {
		out = out[len(out)-lines:]
	}
	return strings.Join(out, "\n") + "\n"
}
