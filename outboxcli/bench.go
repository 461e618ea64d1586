package outboxcli

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outbox/internal/bench"
)

var benchCommand = &command{
	name:    "bench",
	summary: "Measure the relay end to end: drain rate, latency and memory",
	help: `Measures store (--db) -> relay -> broker on the given servers, in three phases (four
with --writers):
  1. raw: the same messages published straight with the broker's client library, with
     the same confirms and no database: the reference the relay's rate is compared with
     (ratio = eps / raw_eps);
  2. drain: a backlog of --events messages over --keys keys is written, then --relays
     relays drain it; eps is events per second, rss_mib the process's peak memory;
  3. latency: --rate events per second for --duration, each in its own transaction,
     woken by LISTEN/NOTIFY on PostgreSQL (the other stores poll every 50 ms here);
     p50/p95/p99 are COMMIT returned -> broker confirmed;
  4. writers (with --writers N): N goroutines commit one event per transaction as fast
     as they can for --writers-duration while the relays publish, as an application and
     its relay share a database; writer_eps is their rate, relay_eps the same events
     published per second (writers' start -> last confirm), relay_writer_ratio the
     second over the first (1.00: the relay keeps up), catch_up_ms how long after the
     last commit the last event was confirmed, writers_p50/p95/p99_ms COMMIT returned ->
     broker confirmed. The reference, measured in the same run: the same N writers
     commit the same one-event transactions as one plain INSERT each into a naive
     outbox table (outbox_events: id, aggregate, event type, JSON payload of the same
     size, dedup key; indexed for a poller, by aggregate, unique dedup key), which no
     relay reads, for half of --writers-duration right before the writers and half
     right after; naive_writer_eps is its rate, writer_x = writer_eps /
     naive_writer_eps (ours, with the relays running, over the naive table's, with
     none: 1.00 means our Writer commits as fast as a plain INSERT).
     writer_commit_p50/p99_ms and naive_commit_p50/p99_ms are one whole write
     transaction, BEGIN to COMMIT returned. Both use the same pool, one connection per
     writer (the database must allow N more connections; SQLite keeps its store's
     pool). On SQLite it shows whether the relay gets its turns at the one write lock,
     and has no reference (no naive_* keys, no writer_x): its single writer is its own
     case. outbox bench --db sqlite --writers 8 --duration -1s.
With --destination2 URL, the backlog is drained three times more, at the end: to a
destination on --broker alone (dest1_eps), to one on the second broker alone
(dest2_eps), and to both through routing rules, half the events each (dests_eps);
dests_x = dests_eps over the slower of the two alone.
With --critical F, a backlog of --events in which a fraction F of the
messages, spread through it, are of topic "payments" on keys of their own is drained
twice more (--runs times each, in turn: medians), at the end: as it is (the reference),
then with those messages at priority 5. The critical messages have keys of their own, as
many as --keys.
critical_x is when the last of them was confirmed, as a fraction of the drain with
priorities (critical_base_x: without), critical_eps_x the drain rate with priorities over
the rate without.
With --replay N (PostgreSQL), N messages are seeded into the published history after
phase 3, and the live latency at --rate is measured for --duration right before and
while 'outbox replay' publishes them again (at --replay-rate, its --max-rate): replay_eps
is the replay's rate, replay_base_p99_ms and replay_p99_ms the live p99 without and
with it, replay_p99_x the second over the first.
With --pin-xmin, phases 1 to 3 run a second time with a snapshot held open in the bench's
database (PostgreSQL: REPEATABLE READ, which pins the xmin horizon; MySQL: a consistent
snapshot, which holds back purge; SQLite: a read transaction, which holds back
checkpoints), and the line adds pinned_eps, pinned_p99_ms and their ratios to the
unpinned figures of the same run (pinned_eps_x, pinned_p99_x). A latency phase of two
minutes or more prints each minute's p50 and p99, so a trend shows.
With --source wal (PostgreSQL), phases 1 to 3 (and 4) run twice on one server, polling
first, then in WAL mode after 'outbox wal setup': the usual keys are WAL mode's figures,
poll_* are polling's, and eps_x, p99_x, pg_cpu_x (and writer_eps_x) compare them. Without --database-url it starts a
private server with wal_level=logical (it needs the PostgreSQL server binaries), and then
also reports the server's CPU time per 10,000 events drained (pg_cpu_ms_per_10k, the
walsender's part walsender_cpu_ms_per_10k), the relays' (relay_cpu_ms_per_10k: this
process's), the machine's CPUs busy meanwhile (busy_cores), cpu_x comparing server and
relays together, and, after the latency phases, the statements per second the relays run
with nothing to publish, for --idle (idle_qps, of which fetches idle_fetch_qps). The
latency phase runs at --rate and then at each of --extra-rates (5000 by default with
--source wal; keys r5000_p50_ms, ...). log_share and writers_log_share are the part of
the latency phases' and the writers' events WAL mode published from the stream with no
fetch.
With --runs N, phases 1 and 2 are repeated N times and eps, raw_eps and ratio are the
medians (ratio is the median of the per-run ratios). It uses a throwaway outbox and
destinations (streams, queues, topics), dropped at the end. Progress goes to stderr; the
last line on stdout is "bench: key=value ...". With no flags it uses the local servers.
With --outboxes N (PostgreSQL, a nats:// broker) it measures a fleet instead: N outboxes,
one per schema, in a database the bench creates on the server of --database-url and
drops at the end, served by --relays processes of this executable ('outbox relay
--config' with a schemas: rule). The line then says: idle_qps, the database's
transactions per second per process with every outbox idle, over --idle, and
idle_conns and rss_mib per process then; drain_eps, one outbox draining --events
committed in one transaction, against solo_eps, the same backlog drained by as many
processes serving that outbox alone (drain_x = drain_eps / solo_eps); the p50 and p99
of --rate events a second written into a tenth of the outboxes, one per transaction,
COMMIT returned -> read from the broker, for --duration alone (trickle_p99_ms) and
during the drain (drain_trickle_p99_ms; fair_p99_x is the second over the first).`,
	setup: func(fs *flag.FlagSet) runFunc {
		var cfg bench.Config
		fs.StringVar(&cfg.DB, "db", bench.DBPostgres, "the store: postgres, sqlite (a temporary file) or mysql (MySQL or MariaDB)")
		fs.StringVar(&cfg.DatabaseURL, "database-url", "", "PostgreSQL `URL` or MySQL DSN (default: the local server); a throwaway schema\nor database is made there")
		fs.StringVar(&cfg.BrokerURL, "broker", brokerDefault, "broker `URL`; its scheme picks the broker: "+strings.Join(bench.Schemes(), ", "))
		fs.IntVar(&cfg.Events, "events", 200_000, "backlog size to drain")
		fs.IntVar(&cfg.Keys, "keys", 1_000, "distinct ordering keys")
		fs.IntVar(&cfg.PayloadBytes, "payload-bytes", 130, "payload size")
		fs.IntVar(&cfg.Relays, "relays", 1, "relays draining the backlog at once")
		fs.IntVar(&cfg.Rate, "rate", 1_000, "events per second in the latency phase")
		fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "length of the latency phase (-1s skips it)")
		fs.IntVar(&cfg.Writers, "writers", 0, "writers committing at full speed while the relays publish, in a fourth phase,\nagainst a naive outbox table's rate (0: no such phase)")
		fs.DurationVar(&cfg.WritersDuration, "writers-duration", 10*time.Second, "length of the writers phase; the naive table's reference takes as long again,\nhalf before it and half after")
		fs.IntVar(&cfg.Replay, "replay", 0, "PostgreSQL: seed `n` messages of published history, and measure the live latency at --rate\nfor --duration before and while outbox replay publishes them again (0: no such phase)")
		fs.StringVar(&cfg.Broker2URL, "destination2", "", "a second broker `URL`: drain the backlog to a destination on each broker alone, then to both\nthrough routing rules, half the events each (none when empty)")
		fs.Float64Var(&cfg.Critical, "critical", 0, "drain a backlog with this `fraction` of critical messages (topic payments, keys of\ntheir own) without and with priorities (0: no such phase)")
		fs.Float64Var(&cfg.ReplayRate, "replay-rate", 0, "with --replay: the replay's --max-rate (`n` messages per second; 0: its default)")
		fs.IntVar(&cfg.Runs, "runs", 1, "raw + drain measurements to take; the figures are their medians")
		fs.BoolVar(&cfg.PinXmin, "pin-xmin", false, "measure the drain and latency phases again with a snapshot held open in the\nbench's database (a long transaction), and report them as pinned_*")
		fs.IntVar(&cfg.RotateRows, "rotate-rows", 0, "PostgreSQL: the pending ring's bucket size (`n` messages; default the store's, 2000)")
		fs.IntVar(&cfg.SchemaVersion, "schema-version", 0, "migrate the bench's outbox up to this `version` only (PostgreSQL 3: pending rows\nwithout the ring; MySQL 3: without the priority index), to compare layouts (default:\nthe latest)")
		fs.StringVar(&cfg.Source, "source", bench.SourcePoll, "how the relays learn of new messages: `poll` (LISTEN/NOTIFY and polling) or wal, which\nmeasures polling too, in the same run (PostgreSQL)")
		fs.Var(&intList{v: &cfg.ExtraRates}, "extra-rates", "more latency-phase `rates` after --rate, comma-separated (default 5000 with --source wal;\n\"\" for none)")
		fs.DurationVar(&cfg.Idle, "idle", 10*time.Second, "with --outboxes, or --source wal on its private server: how long to count\nthe idle relays' statements")
		fs.IntVar(&cfg.Outboxes, "outboxes", 0, "measure a fleet of `n` outboxes served by --relays processes (0: one outbox)")
		fs.Var(durationValue{d: &cfg.ParkAfter, allowForever: true}, "park-after", "with --outboxes: the relays' --park-after, a `duration` (0: their default; -1: every\nrelay runs)")
		fs.IntVar(&cfg.Relay.BatchSize, "batch-size", 0, "relay fetch size (0: the relay's default)")
		fs.IntVar(&cfg.Relay.MaxInFlight, "max-in-flight", 0, "relay in-flight cap (0: the relay's default)")
		fs.IntVar(&cfg.Relay.PublishBatchSize, "publish-batch-size", 0, "relay publish batch size (0: the relay's default)")
		fs.DurationVar(&cfg.Relay.LeaseTTL, "lease-ttl", 0, "relay lease TTL (0: the relay's default, 15s)")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			if cfg.SchemaVersion < 0 {
				return usageErrorf("--schema-version: want a positive version")
			}
			if cfg.RotateRows < 0 || (cfg.RotateRows > 0 && cfg.DB != bench.DBPostgres) {
				return usageErrorf("--rotate-rows: want a positive number, with --db postgres")
			}
			if cfg.Events < 1 || cfg.Keys < 1 || cfg.PayloadBytes < 1 || cfg.Relays < 1 || cfg.Rate < 1 || cfg.Runs < 1 {
				return usageErrorf("--events, --keys, --payload-bytes, --relays, --rate and --runs must be positive")
			}
			if cfg.Writers < 0 || cfg.WritersDuration <= 0 {
				return usageErrorf("--writers must not be negative, --writers-duration must be positive")
			}
			switch {
			case cfg.Source != bench.SourcePoll && cfg.Source != bench.SourceWAL:
				return usageErrorf("--source: want poll or wal, not %q", cfg.Source)
			case cfg.Source == bench.SourceWAL && cfg.DB != bench.DBPostgres:
				return usageErrorf("--source wal: WAL mode reads PostgreSQL's logical replication; use --db postgres")
			case cfg.Source == bench.SourceWAL && cfg.PinXmin:
				return usageErrorf("--source wal and --pin-xmin measure different things: run them apart")
			case cfg.Idle <= 0:
				return usageErrorf("--idle must be positive")
			}
			cfg.Progress = inv.stderr
			if cfg.Outboxes != 0 {
				return runFleetBench(ctx, inv, cfg)
			}
			res, err := bench.Run(ctx, cfg)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(inv.stdout, res)
			return err
		}
	},
}

// runFleetBench runs a fleet bench (--outboxes), whose relays are processes of this
// executable.
func runFleetBench(ctx context.Context, inv *invocation, cfg bench.Config) error {
	switch {
	case cfg.Outboxes < 2:
		return usageErrorf("--outboxes: want 2 or more (one drains a backlog, the others trickle)")
	case cfg.DB != bench.DBPostgres || cfg.Source != bench.SourcePoll:
		return usageErrorf("--outboxes: a fleet serves the schemas of a PostgreSQL database, polling: use --db postgres --source poll")
	case cfg.Duration <= 0:
		return usageErrorf("--outboxes: the trickle is measured for --duration, which must be positive")
	case cfg.ParkAfter < 0 && cfg.ParkAfter != -1:
		return usageErrorf("--park-after: must be a positive duration, or -1 never to park")
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench: find this executable, to start the relays: %w", err)
	}
	cfg.Command = []string{self}
	res, err := bench.RunFleet(ctx, cfg)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(inv.stdout, res)
	return err
}

// intList is a flag of comma-separated positive integers.
type intList struct{ v *[]int }

func (l *intList) String() string {
	if l.v == nil {
		return ""
	}
	parts := make([]string, len(*l.v))
	for i, n := range *l.v {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ",")
}

func (l *intList) Set(s string) error {
	out := []int{} // "" gives none, not the default
	if s == "" {
		*l.v = out
		return nil
	}
	for _, part := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || n < 1 {
			return fmt.Errorf("%q is not a positive number", part)
		}
		out = append(out, n)
	}
	*l.v = out
	return nil
}
