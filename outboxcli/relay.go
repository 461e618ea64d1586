package outboxcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/brokers"
	"github.com/outboxkit/outbox/internal/console"
	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxprom"
)

const (
	brokerDefault        = "nats://127.0.0.1:4222"
	shutdownGraceDefault = 30 * time.Second
)

// relayFlags are the flags of `outbox relay`.
type relayFlags struct {
	db *dbFlags

	broker      *brokerFlags
	defaultDest string // --default-destination, with a config file's destinations
	console     *consoleFlags

	cfg   outbox.RelayConfig
	grace time.Duration

	source string           // poll or wal
	wal    outbox.WALConfig // with --source wal

	logFormat, logLevel string

	metricsAddr string
	otel        bool

	// With outboxes in the config file (fleet.go).
	discoverEvery, parkAfter, parkedPoll time.Duration
	metricsMax                           int // --metrics-max-outboxes
}

// relayConfigFlags maps outbox.RelayConfig fields to their flags, for error messages.
var relayConfigFlags = map[string]string{
	"ID":               "relay-id",
	"BatchSize":        "batch-size",
	"MaxInFlight":      "max-in-flight",
	"PublishBatchSize": "publish-batch-size",
	"PollInterval":     "poll-interval",
	"LeaseTTL":         "lease-ttl",
	"MaxAttempts":      "max-attempts",
	"RetryMinDelay":    "retry-min-delay",
	"RetryMaxDelay":    "retry-max-delay",
	"PublishTimeout":   "publish-timeout",
	"Retention":        "retention",
	"CleanupInterval":  "cleanup-interval",
	"CleanupBatch":     "cleanup-batch",
}

var relayCommand = &command{
	name:    "relay",
	summary: "Publish committed outbox messages to the broker (the daemon)",
	help: `Runs the relay until SIGTERM or SIGINT: it leases a fair share of the outbox's shards
(several relays may run against one outbox), publishes due messages to the broker,
marks them published once the broker confirmed them, retries rejections with backoff,
dead-letters a message after --max-attempts rejections, and deletes published
messages older than --retention. On a signal it stops fetching, waits up to
--shutdown-grace for messages in flight, and gives its leases back.

The broker is chosen by the scheme of --broker; each broker's own flags start with its
name (--nats-..., --rabbitmq-..., ...). A message goes to the destination --route makes
of it: a subject, a routing key, a topic, a stream, a queue or a URL path.

With --metrics-addr the relay serves, on that address, /metrics (Prometheus: the
relay's work and the outbox's backlog), /healthz (200 while the process runs) and
/readyz (200 once the database and the broker, or every destination, answer and a lease
round has given the relay its share of the shards; 503 with the reason otherwise, and
from the signal on).
docs/reference/metrics.md lists the metrics.

With --http-addr the relay also serves the web console (see outbox console --help):
the outbox's state and its dead letters, with replay and purge. Beyond loopback it
needs --http-token or --http-token-file. With an outboxes list, the console's first
page lists every outbox the process serves, worst first, and each outbox's pages are
under /o/NAME/.

With --source wal (PostgreSQL) the relay follows the database's log through the slot
'outbox wal setup' made, and fetches when a transaction that wrote to the outbox
commits: no polling while idle, no NOTIFY at commit. Messages, order and guarantees are
those of polling; the slot moves only past what is recorded or left to polling. When the
stream is unavailable (wal_level, privileges) the relay polls and logs why, at ERROR; a
dropped or lost slot is made anew and the relay catches up from the outbox table,
losing nothing (--wal-keep-lost-slot leaves it to an operator instead). See
docs/operations.md, "WAL mode setup", and docs/design-wal.md.

With an outboxes list in the config file, one process serves many outboxes: each entry
names one (schema: ...) or finds them (schemas: tenant_*, applied again every
--discover-interval and on SIGHUP), and may set its own route and relay settings. See
docs/operations.md, "Many outboxes from one relay".

The outbox schema must be migrated first (outbox migrate up).`,
	setup: func(fs *flag.FlagSet) runFunc {
		o := newRelayFlags(fs)
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			if inv.config != nil && inv.config.outboxes != nil && o.db.outbox == "" {
				return o.runFleet(ctx, inv)
			}
			return o.run(ctx, inv)
		}
	},
}

// newRelayFlags defines the flags of `outbox relay` on fs.
func newRelayFlags(fs *flag.FlagSet) *relayFlags {
	o := &relayFlags{db: addDBFlags(fs, true)}
	o.broker = addBrokerFlags(fs)
	o.console = addConsoleFlags(fs, "")

	c := &o.cfg
	fs.StringVar(&c.ID, "relay-id", "", "this relay's `id` in leases, logs and outbox status; unique among running relays\n(default hostname-pid-random)")
	fs.IntVar(&c.BatchSize, "batch-size", outbox.BatchSizeDefault, "read at most `n` messages per fetch")
	fs.IntVar(&c.MaxInFlight, "max-in-flight", outbox.MaxInFlightDefault, "keep at most `n` messages sent to the broker and not yet confirmed")
	fs.IntVar(&c.PublishBatchSize, "publish-batch-size", 0, fmt.Sprintf("send at most `n` messages per publish call (default %d, or --max-in-flight when smaller)", outbox.PublishBatchSizeDefault))
	c.PollInterval = outbox.PollIntervalDefault
	fs.Var(durationValue{d: &c.PollInterval}, "poll-interval", "look for due messages every `duration` when no notification comes")
	c.LeaseTTL = outbox.LeaseTTLDefault
	fs.Var(durationValue{d: &c.LeaseTTL}, "lease-ttl", "shard lease lifetime (`duration`): a dead relay's shards are taken over within this plus one renewal (min(this/3, 1s))")
	fs.IntVar(&c.MaxAttempts, "max-attempts", outbox.MaxAttemptsDefault, "dead-letter a message after `n` rejections; broker outages do not count")
	c.RetryMinDelay = outbox.RetryMinDelayDefault
	fs.Var(durationValue{d: &c.RetryMinDelay}, "retry-min-delay", "shortest backoff (`duration`) after a rejection")
	c.RetryMaxDelay = outbox.RetryMaxDelayDefault
	fs.Var(durationValue{d: &c.RetryMaxDelay}, "retry-max-delay", "longest backoff (`duration`) after a rejection")
	c.PublishTimeout = outbox.PublishTimeoutDefault
	fs.Var(durationValue{d: &c.PublishTimeout}, "publish-timeout", "give one publish call at most this `duration`; a timeout counts as an outage")
	c.Retention = outbox.RetentionDefault
	fs.Var(durationValue{d: &c.Retention, allowForever: true}, "retention", "keep published messages for this `duration` (e.g. 7d); -1 keeps them forever")
	c.CleanupInterval = outbox.CleanupIntervalDefault
	fs.Var(durationValue{d: &c.CleanupInterval}, "cleanup-interval", "run the retention cleanup every `duration`")
	fs.IntVar(&c.CleanupBatch, "cleanup-batch", outbox.CleanupBatchDefault, "delete at most `n` rows per cleanup statement")
	fs.IntVar(&o.db.rotateRows, "rotate-rows", outboxpgx.RotateRowsDefault, "PostgreSQL: move the pending ring on after `n` messages written to its current bucket (schema version 4)")
	fs.StringVar(&o.source, "source", "poll", "how the relay learns of new messages: `poll` (LISTEN/NOTIFY and polling) or wal\n(PostgreSQL logical replication; run 'outbox wal setup' first)")
	fs.StringVar(&o.wal.Slot, "wal-slot", "", "with --source wal: the replication `slot` (default: as 'outbox wal setup')")
	fs.StringVar(&o.wal.Publication, "wal-publication", "", "with --source wal: the `publication` (default: as 'outbox wal setup')")
	o.wal.SafetyPoll = outbox.WALSafetyPollDefault
	fs.Var(durationValue{d: &o.wal.SafetyPoll, allowForever: true}, "wal-safety-poll", "with --source wal: run a full fetch anyway every `duration`; -1 for never")
	o.wal.Heartbeat = outbox.WALHeartbeatDefault
	fs.Var(durationValue{d: &o.wal.Heartbeat, allowForever: true}, "wal-heartbeat", "with --source wal: the slot's reader writes a heartbeat into the log every `duration`\nand opens the stream again when three go missing; -1 for never")
	fs.BoolVar(&o.wal.KeepLostSlot, "wal-keep-lost-slot", false, "with --source wal: leave a lost or missing slot for an operator (poll until 'outbox wal setup')\ninstead of making it anew")

	o.grace = shutdownGraceDefault
	fs.Var(durationValue{d: &o.grace}, "shutdown-grace", "on SIGTERM or SIGINT, wait up to this `duration` for messages in flight to be confirmed")
	fs.StringVar(&o.defaultDest, "default-destination", defaultDestination, "with a config file's destinations and routing: the `destination` of the messages no rule\nmatches (default: --broker's); none dead-letters them")
	fs.StringVar(&o.logFormat, "log-format", "text", "log `format`: text or json")
	fs.StringVar(&o.logLevel, "log-level", "info", "log `level`: debug, info, warn or error")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "serve /metrics, /healthz and /readyz on this `address` (:9187, 127.0.0.1:9187); none when empty")
	fs.BoolVar(&o.otel, "otel", false, "export a span per published message over OTLP/HTTP, configured by the standard\nOTEL_EXPORTER_OTLP_* and OTEL_* environment variables")
	o.discoverEvery = discoverIntervalDefault
	fs.Var(durationValue{d: &o.discoverEvery}, "discover-interval", "with a config file's outboxes list: look for the outboxes its rules (schemas:, databases:)\nfind every `duration` (and on SIGHUP)")
	o.parkAfter = parkAfterDefault
	fs.Var(durationValue{d: &o.parkAfter, allowForever: true}, "park-after", "with a config file's outboxes list: stop the relay of a PostgreSQL outbox that published nothing\nand held no message for this `duration`, and watch it from one connection per database until a message comes; -1 for never")
	fs.IntVar(&o.metricsMax, "metrics-max-outboxes", metricsMaxDefault, "with a config file's outboxes list and --metrics-addr: the most outboxes with series of their\nown (an outbox label); the outboxes found after are served without, and counted by outbox_fleet_outboxes")
	o.parkedPoll = parkedPollDefault
	fs.Var(durationValue{d: &o.parkedPoll}, "parked-poll-interval", "with a config file's outboxes list: look for messages due in the parked outboxes every `duration`\n(one statement per database; a write wakes its outbox at once)")
	return o
}

func (o *relayFlags) run(ctx context.Context, inv *invocation) error {
	// Everything that can be checked without a connection is checked first: a bad
	// value fails at once with status 2, before the relay touches anything.
	log, err := newLogger(inv.stderr, o.logFormat, o.logLevel)
	if err != nil {
		return err
	}
	if err := o.checkTuning(); err != nil {
		return err
	}
	if err := checkListenAddr("metrics-addr", o.metricsAddr); err != nil {
		return err
	}
	if err := o.console.check(ctx, inv); err != nil {
		return err
	}
	target, err := o.db.target("outbox relay")
	if err != nil {
		return err
	}
	dest, err := o.broker.check(log, inv.secrets)
	if err != nil {
		return err
	}
	dests, err := o.checkDestinations(inv, log, dest)
	if err != nil {
		return err
	}
	switch o.source {
	case "poll":
	case "wal":
		if target.kind != dbPostgres {
			return usageErrorf("--source wal: WAL mode reads PostgreSQL's logical replication; on %s, relays poll", target.kind)
		}
		for _, f := range []struct{ flag, value string }{{"wal-slot", o.wal.Slot}, {"wal-publication", o.wal.Publication}} {
			if f.value != "" {
				if err := pgsql.CheckWALName(f.flag, f.value); err != nil {
					return usageErrorf("--%s: %v", f.flag, err)
				}
			}
		}
		o.cfg.WAL = &o.wal
	default:
		return usageErrorf("--source: want poll or wal, not %q", o.source)
	}
	o.cfg.Logger = log
	o.cfg.Fingerprint = o.fingerprint(dest.Broker().Label, dests)
	if err := o.cfg.Validate(); err != nil {
		return relayConfigError(err)
	}

	obs, reg, ready, stopServices, err := o.startServices(ctx, inv, dest.Broker(), log)
	if err != nil {
		return err
	}
	defer stopServices()
	if obs != nil {
		o.cfg.Observer = outbox.MultiObserver(o.cfg.Observer, obs)
	}
	if reg != nil {
		label := dest.Broker().Label
		if dests != nil {
			label = dests.label()
		}
		o.cfg.Observer = outbox.MultiObserver(o.cfg.Observer, outboxprom.New(outboxprom.Config{Registerer: reg, Broker: label}))
	}

	where := []any{"database", redactDSN(o.db.url), "prefix", o.db.prefix}
	if target.kind == dbPostgres {
		where = append(where, "schema", o.db.schema)
	}
	log.Info("connecting to "+target.kind.String(), where...)
	drv, err := o.db.connect(ctx, target)
	if err != nil {
		return err
	}
	defer drv.close()
	if err := o.db.checkRelayable(ctx, drv, log); err != nil {
		return err
	}

	var pub outbox.Publisher
	var router *outbox.Router
	checks := []readyCheck{{name: "database", check: drv.ping}}
	if dests != nil {
		var destChecks []readyCheck
		var closeAll func()
		router, destChecks, closeAll, err = dests.open(ctx, log)
		if err != nil {
			return err
		}
		defer closeAll()
		log.Info("publishing by the routing rules", "destinations", router.Destinations(), "rules", len(dests.routing.Rules),
			"default_destination", o.defaultDest)
		pub = router
		checks = append(checks, destChecks...)
	} else {
		log.Info("connecting to the broker", "broker", dest.Broker().Name, "url", brokers.Redact(o.broker.url), "route", o.broker.route)
		broker, err := o.broker.open(ctx, dest)
		if err != nil {
			return err
		}
		defer broker.Close()
		if broker.CheckTopics != nil {
			checkPendingTopics(ctx, log, drv, broker)
		}
		pub = broker.Publisher
		if p, ok := broker.Publisher.(outbox.Pinger); ok {
			checks = append(checks, readyCheck{name: "broker", check: p.Ping})
		}
	}

	var store outboxdriver.Store = drv.storeDriver
	if ready != nil {
		reg.MustRegister(outboxprom.NewStatusCollector(drv, outboxprom.StatusConfig{Logger: log}))
		leases := newLeaseWatch(drv.storeDriver, o.cfg.LeaseTTL)
		store = leases.store()
		ready.running(leases, checks...)
		defer ready.stopping()
	}

	relay, err := outbox.NewRelay(store, pub, o.cfg)
	if err != nil {
		return relayConfigError(err)
	}
	if reg != nil && router != nil {
		reg.MustRegister(outboxprom.NewDestinationCollector(router.Stats, outboxprom.DestinationConfig{Relay: relay.ID()}))
	}
	stopConsole, err := o.console.start(ctx, inv, console.Config{Admin: drv, RelayStats: relay.Stats, RelayID: relay.ID()}, log)
	if err != nil {
		return err
	}
	defer stopConsole() // after the relay drained, before the broker and pool close
	if ready != nil {
		go func() {
			// Not ready from the signal on: the relay drains and gives its leases back.
			select {
			case <-ctx.Done():
				ready.stopping()
			case <-relay.Stopped():
			}
		}()
	}
	err = relay.Run(ctx, o.grace)
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("the relay did not drain within --shutdown-grace (%s): the messages it had in flight will be published again by the next relay, and consumers deduplicate them", o.grace)
	}
	if err != nil {
		return err
	}
	log.Info("relay exited cleanly")
	return nil
}

// startServices starts what a relay process runs whatever it serves: tracing (--otel:
// obs is its observer, else nil) and the metrics and health endpoints (--metrics-addr:
// reg and ready, else nil), which come up first so that probes and scrapes get answers
// (not ready, starting) while the relays connect. stop ends them, flushing the last
// spans.
func (o *relayFlags) startServices(ctx context.Context, inv *invocation, broker *brokers.Broker, log *slog.Logger) (
	obs outbox.Observer, reg *prometheus.Registry, ready *readiness, stop func(), err error) {
	var stops []func(context.Context) error
	stop = func() {
		for _, s := range slices.Backward(stops) {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			_ = s(sctx)
			cancel()
		}
	}
	if o.otel {
		var stopTracing func(context.Context) error
		if obs, stopTracing, err = startTracing(ctx, inv, broker, log); err != nil {
			return nil, nil, nil, nil, fmt.Errorf("--otel: %w", err)
		}
		stops = append(stops, stopTracing)
	}
	if o.metricsAddr != "" {
		reg = newMetricsRegistry()
		ready = newReadiness(log)
		stopHTTP, err := serveHTTP(ctx, "metrics and health checks", o.metricsAddr, opsMux(reg, ready, log), log)
		if err != nil {
			stop()
			return nil, nil, nil, nil, fmt.Errorf("--metrics-addr: %w", err)
		}
		stops = append(stops, stopHTTP)
	}
	return obs, reg, ready, stop, nil
}

// checkTuning rejects zero and negative tuning values: outbox.RelayConfig reads zero as
// "default", which on a command line would only hide a mistake.
func (o *relayFlags) checkTuning() error {
	c := o.cfg
	ints := map[string]int{"batch-size": c.BatchSize, "max-in-flight": c.MaxInFlight,
		"max-attempts": c.MaxAttempts, "cleanup-batch": c.CleanupBatch, "rotate-rows": o.db.rotateRows}
	durations := map[string]time.Duration{"poll-interval": c.PollInterval, "lease-ttl": c.LeaseTTL,
		"retry-min-delay": c.RetryMinDelay, "retry-max-delay": c.RetryMaxDelay, "publish-timeout": c.PublishTimeout,
		"cleanup-interval": c.CleanupInterval, "shutdown-grace": o.grace}
	for _, name := range sortedKeys(ints) {
		if ints[name] <= 0 {
			return usageErrorf("--%s: must be a positive number, not %d", name, ints[name])
		}
	}
	for _, name := range sortedKeys(durations) {
		if durations[name] <= 0 {
			return usageErrorf("--%s: must be a positive duration, not %s", name, durations[name])
		}
	}
	if c.PublishBatchSize < 0 {
		return usageErrorf("--publish-batch-size: must be a positive number (or 0 for the default), not %d", c.PublishBatchSize)
	}
	if c.Retention <= 0 && c.Retention != -1 {
		return usageErrorf("--retention: must be a positive duration, or -1 to keep published messages forever")
	}
	return nil
}

// relayConfigError names flags, not Go fields, in an outbox.RelayConfig error.
func relayConfigError(err error) error {
	var ce *outbox.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	reason := ce.Reason
	fields := sortedKeys(relayConfigFlags)
	sort.Slice(fields, func(i, j int) bool { return len(fields[i]) > len(fields[j]) }) // PublishBatchSize before BatchSize
	for _, f := range fields {
		reason = strings.ReplaceAll(reason, f, "--"+relayConfigFlags[f])
	}
	if name, ok := relayConfigFlags[ce.Field]; ok {
		return usageErrorf("--%s: %s", name, reason)
	}
	return usageErrorf("%s: %s", ce.Field, reason)
}

// checkPendingTopics has the broker check the topics with pending messages (50 at most),
// so that a destination it cannot take is named in the log at start, not only in outage
// messages later.
func checkPendingTopics(ctx context.Context, log *slog.Logger, drv outboxdriver.Admin, broker *brokers.Opened) {
	status, err := drv.Status(ctx)
	if err != nil {
		log.Warn("could not read the outbox status to check the broker's destinations", "err", err)
		return
	}
	var topics []string
	for _, t := range status.Topics {
		if t.Pending > 0 && len(topics) < 50 {
			topics = append(topics, t.Topic)
		}
	}
	broker.CheckTopics(ctx, log, topics)
}

// newLogger returns the relay's logger on w.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usageErrorf("--log-level: %q is not a level: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usageErrorf("--log-format: %q is not a format: want text or json", format)
}
