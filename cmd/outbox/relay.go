package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxnats"
	"github.com/outboxkit/outbox/outboxpgx"
)

const (
	brokerDefault        = "nats://127.0.0.1:4222"
	shutdownGraceDefault = 30 * time.Second
)

// relayFlags are the flags of `outbox relay`.
type relayFlags struct {
	db *dbFlags

	broker        string
	subjectPrefix string
	createStream  string
	subjects      stringList

	cfg   outbox.RelayConfig
	grace time.Duration

	logFormat, logLevel string
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

The broker is NATS JetStream (nats://host:port; several URLs separated by commas).
A message of topic T goes to the subject <--subject-prefix>T, which a JetStream stream
must capture: --nats-create-stream creates one if it does not exist. Kafka, RabbitMQ,
Redis Streams and HTTP webhooks are planned.

The outbox schema must be migrated first (outbox migrate up).`,
	setup: func(fs *flag.FlagSet) runFunc {
		o := &relayFlags{db: addDBFlags(fs, true)}
		fs.StringVar(&o.broker, "broker", brokerDefault, "broker `URL`; only nats:// for now. Credentials in it never appear in output.")
		fs.StringVar(&o.subjectPrefix, "subject-prefix", "", "NATS subject `prefix` put before each topic (events. sends topic orders to events.orders)")
		fs.StringVar(&o.createStream, "nats-create-stream", "", "create this JetStream `stream` if it does not exist, capturing <subject-prefix>> or\n--nats-stream-subjects; an existing stream is checked, never changed")
		fs.Var(&o.subjects, "nats-stream-subjects", "`subjects` of the stream --nats-create-stream creates (repeatable; comma-separated in the environment)")

		c := &o.cfg
		fs.StringVar(&c.ID, "relay-id", "", "this relay's `id` in leases, logs and outbox status; unique among running relays\n(default hostname-pid-random)")
		fs.IntVar(&c.BatchSize, "batch-size", outbox.BatchSizeDefault, "read at most `n` messages per fetch")
		fs.IntVar(&c.MaxInFlight, "max-in-flight", outbox.MaxInFlightDefault, "keep at most `n` messages sent to the broker and not yet confirmed")
		fs.IntVar(&c.PublishBatchSize, "publish-batch-size", outbox.PublishBatchSizeDefault, "send at most `n` messages per publish call")
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

		o.grace = shutdownGraceDefault
		fs.Var(durationValue{d: &o.grace}, "shutdown-grace", "on SIGTERM or SIGINT, wait up to this `duration` for messages in flight to be confirmed")
		fs.StringVar(&o.logFormat, "log-format", "text", "log `format`: text or json")
		fs.StringVar(&o.logLevel, "log-level", "info", "log `level`: debug, info, warn or error")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			return o.run(ctx, inv)
		}
	},
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
	offline, err := o.db.driver()
	if err != nil {
		return err
	}
	poolCfg, err := o.db.poolConfig("outbox relay")
	if err != nil {
		return err
	}
	if err := checkBroker(o.broker); err != nil {
		return err
	}
	if err := checkSubjectPrefix(o.subjectPrefix); err != nil {
		return err
	}
	subjects, err := o.streamSubjects()
	if err != nil {
		return err
	}
	o.cfg.Logger = log
	// NewRelay validates the whole configuration, cross-field rules included; this relay
	// is never started.
	if _, err := outbox.NewRelay(offline, nopPublisher{}, o.cfg); err != nil {
		return relayConfigError(err)
	}

	log.Info("connecting to PostgreSQL", "database", redactDSN(o.db.url), "schema", o.db.schema, "prefix", o.db.prefix)
	pool, drv, err := o.db.connect(ctx, poolCfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := o.db.checkMigrated(ctx, drv); err != nil {
		return err
	}

	log.Info("connecting to NATS", "broker", redactBroker(o.broker), "subject_prefix", o.subjectPrefix)
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	pub, err := outboxnats.Dial(dctx, o.broker, outboxnats.Config{SubjectPrefix: o.subjectPrefix})
	if err == nil {
		if err = pub.Ping(dctx); err != nil {
			pub.Close()
		}
	}
	cancel()
	if err != nil {
		if errors.Is(err, outbox.ErrInvalidConfig) {
			return flagError(err, map[string]string{"SubjectPrefix": "subject-prefix"})
		}
		return fmt.Errorf("connect to NATS at %s: %w", redactBroker(o.broker), err)
	}
	defer pub.Close()

	if o.createStream != "" {
		if err := pub.EnsureStream(ctx, o.createStream, subjects); err != nil {
			return err
		}
		log.Info("JetStream stream ready", "stream", o.createStream, "subjects", subjects)
	}
	warnUncapturedTopics(ctx, log, drv, pub, o.subjectPrefix)

	relay, err := outbox.NewRelay(drv, pub, o.cfg)
	if err != nil {
		return relayConfigError(err)
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

// checkTuning rejects zero and negative tuning values: outbox.RelayConfig reads zero as
// "default", which on a command line would only hide a mistake.
func (o *relayFlags) checkTuning() error {
	c := o.cfg
	ints := map[string]int{"batch-size": c.BatchSize, "max-in-flight": c.MaxInFlight, "publish-batch-size": c.PublishBatchSize,
		"max-attempts": c.MaxAttempts, "cleanup-batch": c.CleanupBatch}
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

// streamSubjects returns the subjects of the stream --nats-create-stream creates.
func (o *relayFlags) streamSubjects() ([]string, error) {
	if len(o.subjects) > 0 && o.createStream == "" {
		return nil, usageErrorf("--nats-stream-subjects: only used with --nats-create-stream")
	}
	if o.createStream == "" {
		return nil, nil
	}
	if strings.ContainsAny(o.createStream, " \t\r\n.*>") {
		return nil, usageErrorf("--nats-create-stream: %q is not a valid stream name (no spaces, '.', '*' or '>')", o.createStream)
	}
	if len(o.subjects) > 0 {
		return o.subjects, nil
	}
	if !strings.HasSuffix(o.subjectPrefix, ".") {
		return nil, usageErrorf("--nats-create-stream: give --nats-stream-subjects, or a --subject-prefix ending in '.' (events.) so that the stream can capture events.>")
	}
	return []string{o.subjectPrefix + ">"}, nil
}

// checkSubjectPrefix rejects prefixes that cannot start a subject, before connecting.
// outboxnats checks the rest.
func checkSubjectPrefix(p string) error {
	if strings.ContainsAny(p, " \t\r\n*>") || strings.HasPrefix(p, ".") || strings.Contains(p, "..") {
		return usageErrorf("--subject-prefix: %q cannot start a NATS subject (no white space, wildcards or empty tokens)", p)
	}
	return nil
}

// checkBroker accepts nats:// URLs and explains the rest.
func checkBroker(s string) error {
	for _, part := range strings.Split(s, ",") {
		u, err := url.Parse(strings.TrimSpace(part))
		if err != nil || u.Scheme == "" || u.Host == "" {
			return usageErrorf("--broker: %s is not a broker URL: want nats://host:4222", redactBroker(part))
		}
		switch u.Scheme {
		case "nats":
		case "kafka", "amqp", "amqps", "rabbitmq", "redis", "rediss", "http", "https":
			return usageErrorf("--broker: %s:// is not supported yet: this version publishes to NATS JetStream (nats://host:4222); Kafka, RabbitMQ (amqp://), Redis Streams and HTTP webhooks are planned", u.Scheme)
		default:
			return usageErrorf("--broker: unknown scheme %q: want nats://host:4222 (Kafka, RabbitMQ, Redis Streams and HTTP webhooks are planned)", u.Scheme)
		}
	}
	return nil
}

// warnUncapturedTopics warns about topics with pending messages whose subject no stream
// captures: the relay would pause on them as on an outage, and the log should say why
// at start rather than only in outage messages.
func warnUncapturedTopics(ctx context.Context, log *slog.Logger, drv *outboxpgx.Driver, pub *outboxnats.Publisher, prefix string) {
	status, err := drv.Status(ctx)
	if err != nil {
		log.Warn("could not read the outbox status to check stream subjects", "err", err)
		return
	}
	checked := 0
	for _, t := range status.Topics {
		if t.Pending == 0 || checked == 50 {
			continue
		}
		checked++
		subject := prefix + t.Topic
		if err := pub.CheckSubject(ctx, subject); err != nil {
			log.Warn("pending messages cannot be stored: the relay pauses on them until a stream captures their subject",
				"topic", t.Topic, "subject", subject, "pending", t.Pending, "err", err)
		}
	}
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

// nopPublisher lets NewRelay validate a configuration before the broker is dialled.
type nopPublisher struct{}

func (nopPublisher) Publish(context.Context, []*outbox.Message) []error { return nil }
