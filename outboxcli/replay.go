package outboxcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/brokers"
	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/outboxdriver"
)

var replayCommand = &command{
	name:    "replay",
	summary: "Publish again messages of the published history, to a destination",
	help: `Publishes again the published messages selected by --since and --until (when they
were published: an RFC 3339 time, or a duration meaning that long ago, as in --since
2h; --until defaults to now), --topic (a topic, or a glob: orders.*), --key and
--aggregate-type, to --broker, or to --destination, one of the config file's
destinations (see outbox relay --help).

Each message keeps its ID, dedup key and headers, and gains the header Outbox-Replay
with the replay's name, so consumers that deduplicate skip what they processed and can
tell a replay from live traffic. A key's messages go in the order they were first
published. Live traffic goes first: the replay sends at most --max-rate messages a
second (1,000 by default), and pauses while at least --live-backlog messages of the
outbox have waited over a second for a relay.

A replay is recorded in the outbox (PostgreSQL, schema version 9) under --name (by
default replay-<time>): how far it got, which outbox status shows. Interrupted (Ctrl-C,
a crash, a destination that stays down), it goes on from there when run again with the
same --name; the messages of the span it was sending are sent again. --dry-run counts
what it would send and sends nothing.

The published history is what the relays' retention keeps (--retention, 7 days by
default). Replay reads PostgreSQL's history; MySQL and SQLite are not supported yet.`,
	setup: func(fs *flag.FlagSet) runFunc {
		o := &replayFlags{db: addDBFlags(fs, true), broker: addBrokerFlags(fs)}
		fs.Var(&o.since, "since", "replay messages published at or after this `time` (RFC 3339, or a duration ago: 2h); required")
		fs.Var(&o.until, "until", "replay messages published before this `time` (RFC 3339, or a duration ago; default now)")
		fs.StringVar(&o.filter.Topic, "topic", "", "only this `topic`, or the topics a glob matches (orders.*)")
		fs.StringVar(&o.filter.Key, "key", "", "only messages of this `key`")
		fs.StringVar(&o.filter.AggregateType, "aggregate-type", "", "only messages of this aggregate `type`")
		fs.StringVar(&o.destination, "destination", defaultDestination, "send to this `destination` of the config file (default: --broker's)")
		fs.StringVar(&o.name, "name", "", "the replay's `name`: its record, and the Outbox-Replay header; run again with it to go on\n(default replay-<time>)")
		fs.Float64Var(&o.rate, "max-rate", outbox.ReplayRateDefault, "publish at most `n` messages per second, so that live traffic keeps its share; -1 for no cap")
		fs.IntVar(&o.liveBacklog, "live-backlog", 100, "pause while at least `n` live messages have waited over a second; -1 never pauses")
		fs.IntVar(&o.batch, "publish-batch-size", 250, "publish at most `n` messages per publish call")
		fs.BoolVar(&o.dryRun, "dry-run", false, "count the messages the replay would send, and send nothing")
		fs.BoolVar(&o.asJSON, "json", false, "print the result as JSON")
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

type replayFlags struct {
	db           *dbFlags
	broker       *brokerFlags
	since, until pointInTime
	filter       outboxdriver.HistoryFilter
	destination  string
	name         string
	rate         float64
	liveBacklog  int
	batch        int
	dryRun       bool
	asJSON       bool

	logFormat, logLevel string
}

// historyStore is what a replay needs of a store.
type historyStore interface {
	outboxdriver.HistoryReader
	outboxdriver.ReplayJobs
}

// replayResult is what --json prints.
type replayResult struct {
	Name        string                     `json:"name"`
	DryRun      bool                       `json:"dry_run,omitempty"`
	Destination string                     `json:"destination"`
	Filter      outboxdriver.HistoryFilter `json:"filter"`
	Messages    int64                      `json:"messages"`
	State       string                     `json:"state,omitempty"`
	Sent        int64                      `json:"sent"`
	Failed      int64                      `json:"failed"`
	Skipped     int64                      `json:"skipped"`
	Cursor      time.Time                  `json:"cursor,omitzero"`
}

func (o *replayFlags) run(ctx context.Context, inv *invocation) error {
	log, err := newLogger(inv.stderr, o.logFormat, o.logLevel)
	if err != nil {
		return err
	}
	if o.rate <= 0 && o.rate != -1 || o.batch < 1 || o.liveBacklog < -1 {
		return usageErrorf("--max-rate must be positive or -1, --publish-batch-size positive, --live-backlog at least -1")
	}
	filterGiven := !o.since.t.IsZero() || !o.until.t.IsZero() || o.filter != (outboxdriver.HistoryFilter{})
	o.filter.Since, o.filter.Until = o.since.t, o.until.t
	if o.filter.Until.IsZero() {
		o.filter.Until = time.Now()
	}
	target, err := o.db.target("outbox replay")
	if err != nil {
		return err
	}
	if target.kind != dbPostgres {
		return usageErrorf("outbox replay reads PostgreSQL's published history; %s is not supported yet", target.kind)
	}
	dests, err := o.checkDestinations(inv, log)
	if err != nil {
		return err
	}
	if !slices.Contains(dests.names, o.destination) {
		return noDestination(o.destination, dests)
	}

	drv, err := o.db.openMigrated(ctx, "outbox replay")
	if err != nil {
		return err
	}
	defer drv.close()
	store, ok := drv.storeDriver.(historyStore)
	if !ok {
		return fmt.Errorf("the %s store cannot read its published history", target.kind)
	}

	// A replay run again with its name goes on from its record.
	job := outboxdriver.ReplayJob{Name: o.name, Destination: o.destination, State: outboxdriver.ReplayRunning}
	if o.name == "" {
		job.Name = "replay-" + time.Now().UTC().Format("20060102-150405")
	} else if prev, err := store.Replay(ctx, o.name); err == nil {
		if filterGiven && (!sameFilter(prev.Filter, o.filter, !o.until.t.IsZero()) || prev.Destination != o.destination) {
			return usageErrorf("--name %s: the replay of that name selects %s to %s; run it again without --since, --until, --topic, --key and --aggregate-type (or with the same), or pick another name",
				o.name, describeFilter(prev.Filter), prev.Destination)
		}
		if prev.State == outboxdriver.ReplayDone {
			fmt.Fprintf(inv.stdout, "replay %s is done: %d messages sent, %d failed\n", prev.Name, prev.Sent, prev.Failed)
			return nil
		}
		job = prev
		job.State, job.Error = outboxdriver.ReplayRunning, ""
		o.filter, o.destination = prev.Filter, prev.Destination
	} else if !errors.Is(err, outboxdriver.ErrNoReplay) && !errors.Is(err, pgsql.ErrNoReplayTable) {
		return err
	}
	if job.Filter == (outboxdriver.HistoryFilter{}) {
		if o.since.t.IsZero() {
			return usageErrorf("--since is required: the replay's time range starts there (an RFC 3339 time, or a duration ago: 2h)")
		}
		job.Filter = o.filter
	}
	if err := job.Filter.Validate(); err != nil {
		return usageErrorf("%s", strings.TrimPrefix(err.Error(), "outbox: "))
	}

	total, _, err := store.CountHistory(ctx, job.Filter)
	if err != nil {
		return err
	}
	result := replayResult{Name: job.Name, Destination: job.Destination, Filter: job.Filter, Messages: total}
	if o.dryRun {
		result.DryRun = true
		if o.asJSON {
			return writeJSON(inv.stdout, result)
		}
		fmt.Fprintf(inv.stdout, "would replay %d messages (%s) to destination %s\n", total, describeFilter(job.Filter), job.Destination)
		return nil
	}
	i := slices.Index(dests.names, job.Destination) // a resumed replay's recorded destination
	if i < 0 {
		return noDestination(job.Destination, dests)
	}
	opened, err := dests.openOne(ctx, log, i)
	if err != nil {
		return err
	}
	defer opened.Close()
	pub := opened.Publisher
	job.Total = total
	if err := store.SaveReplay(ctx, job); err != nil {
		return err
	}
	log.Info("replaying", "name", job.Name, "messages", total, "selection", describeFilter(job.Filter), "destination", job.Destination,
		"from", job.Cursor)

	// Progress: the record at every span, a line on the terminal every few seconds.
	start, lastLine := time.Now(), time.Time{}
	baseSent, baseFailed := job.Sent, job.Failed // an earlier run's
	report := func(p outbox.ReplayProgress, final bool) {
		if !final && time.Since(lastLine) < 5*time.Second {
			return
		}
		lastLine = time.Now()
		pct := 100.0
		if p.Total > 0 {
			pct = 100 * float64(p.Done) / float64(p.Total)
		}
		paused := ""
		if p.Paused {
			paused = " (paused: live messages wait)"
		}
		fmt.Fprintf(inv.stderr, "replay %s: %d of %d messages (%.1f%%), %.0f/s, published up to %s%s\n",
			job.Name, p.Done, p.Total, pct, float64(p.Sent)/max(time.Since(start).Seconds(), 0.001), p.Cursor.UTC().Format(time.RFC3339), paused)
	}
	save := func(p outbox.ReplayProgress, state string, cause error) error {
		job.State, job.Sent, job.Failed = state, baseSent+p.Sent, baseFailed+p.Failed
		if !p.Cursor.IsZero() {
			job.Cursor = p.Cursor
		}
		if cause != nil {
			job.Error = inv.secrets.scrub(cause.Error())
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		return store.SaveReplay(sctx, job)
	}
	p, err := outbox.Replay(ctx, store, pub, outbox.ReplayConfig{
		Filter: job.Filter, Name: job.Name, From: job.Cursor, BatchSize: o.batch, Rate: o.rate, LiveBacklog: o.liveBacklog,
		Logger: log,
		Progress: func(p outbox.ReplayProgress) error {
			report(p, false)
			return save(p, outboxdriver.ReplayRunning, nil)
		},
	})
	state := outboxdriver.ReplayDone
	switch {
	case err == nil:
	case ctx.Err() != nil:
		state = outboxdriver.ReplayStopped
	default:
		state = outboxdriver.ReplayFailed
	}
	report(p, true)
	if serr := save(p, state, err); serr != nil && err == nil {
		err = serr
	}
	result.State, result.Sent, result.Failed, result.Skipped, result.Cursor = state, p.Sent, p.Failed, p.Skipped, job.Cursor
	if err != nil {
		if state == outboxdriver.ReplayStopped {
			return fmt.Errorf("replay %s stopped after %d messages: run it again with --name %s to go on", job.Name, p.Done, job.Name)
		}
		return fmt.Errorf("replay %s failed after %d messages: %w (run it again with --name %s to go on)", job.Name, p.Done, err, job.Name)
	}
	if o.asJSON {
		return writeJSON(inv.stdout, result)
	}
	fmt.Fprintf(inv.stdout, "replay %s done: %d messages sent, %d failed for good (logged), %d sent by an earlier run\n", job.Name, p.Sent, p.Failed, p.Skipped)
	return nil
}

// sameFilter reports whether a replay's recorded filter is the one the flags give; an
// --until left to its default (now) matches any.
func sameFilter(recorded, flags outboxdriver.HistoryFilter, untilSet bool) bool {
	if !untilSet {
		flags.Until = recorded.Until
	}
	return recorded.Since.Equal(flags.Since) && recorded.Until.Equal(flags.Until) && recorded.Topic == flags.Topic &&
		recorded.Key == flags.Key && recorded.AggregateType == flags.AggregateType
}

// describeFilter renders a replay's selection in one line.
func describeFilter(f outboxdriver.HistoryFilter) string {
	parts := []string{"published " + f.Since.UTC().Format(time.RFC3339) + " to " + f.Until.UTC().Format(time.RFC3339)}
	for _, c := range []struct{ name, value string }{{"topic", f.Topic}, {"key", f.Key}, {"aggregate type", f.AggregateType}} {
		if c.value != "" {
			parts = append(parts, fmt.Sprintf("%s %q", c.name, c.value))
		}
	}
	return strings.Join(parts, ", ")
}

// checkDestinations returns the destinations a replay may send to: --broker's, and the
// config file's, checked as outbox relay checks them.
func (o *replayFlags) checkDestinations(inv *invocation, log *slog.Logger) (*destinations, error) {
	def, err := o.broker.check(log, inv.secrets)
	if err != nil {
		return nil, err
	}
	rf := &relayFlags{db: o.db, broker: o.broker, defaultDest: defaultDestination}
	ds, err := rf.checkDestinations(inv, log, def)
	if ds == nil && err == nil {
		ds = &destinations{names: []string{defaultDestination}, urls: []string{o.broker.url}, routes: []string{o.broker.route}, dests: []*brokers.Dest{def}}
	}
	return ds, err
}

// noDestination is the error of a --destination that neither the config file nor
// --broker names.
func noDestination(name string, ds *destinations) error {
	return usageErrorf("--destination %s: no such destination; the config file and --broker name %s", name, strings.Join(ds.names, ", "))
}
