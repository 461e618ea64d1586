package outboxcli

import (
	"context"
	"flag"
	"fmt"
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
     broker confirmed. On SQLite it shows whether the relay gets its turns at the one
     write lock: outbox bench --db sqlite --writers 8 --duration -1s.
With --pin-xmin, phases 1 to 3 run a second time with a snapshot held open in the bench's
database (PostgreSQL: REPEATABLE READ, which pins the xmin horizon; MySQL: a consistent
snapshot, which holds back purge; SQLite: a read transaction, which holds back
checkpoints), and the line adds pinned_eps, pinned_p99_ms and their ratios to the
unpinned figures of the same run (pinned_eps_x, pinned_p99_x). A latency phase of two
minutes or more prints each minute's p50 and p99, so a trend shows.
With --runs N, phases 1 and 2 are repeated N times and eps, raw_eps and ratio are the
medians (ratio is the median of the per-run ratios). It uses a throwaway outbox and
destinations (streams, queues, topics), dropped at the end. Progress goes to stderr; the
last line on stdout is "bench: key=value ...". With no flags it uses the local servers.`,
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
		fs.IntVar(&cfg.Writers, "writers", 0, "writers committing at full speed while the relays publish, in a fourth phase\n(0: no such phase)")
		fs.DurationVar(&cfg.WritersDuration, "writers-duration", 10*time.Second, "length of the writers phase")
		fs.IntVar(&cfg.Runs, "runs", 1, "raw + drain measurements to take; the figures are their medians")
		fs.BoolVar(&cfg.PinXmin, "pin-xmin", false, "measure the drain and latency phases again with a snapshot held open in the\nbench's database (a long transaction), and report them as pinned_*")
		fs.IntVar(&cfg.RotateRows, "rotate-rows", 0, "PostgreSQL: the pending ring's bucket size (`n` messages; default the store's, 2000)")
		fs.IntVar(&cfg.SchemaVersion, "schema-version", 0, "PostgreSQL: migrate the bench's outbox up to this `version` only (3: pending rows\nwithout the ring), to compare layouts (default: the latest)")
		fs.IntVar(&cfg.Relay.BatchSize, "batch-size", 0, "relay fetch size (0: the relay's default)")
		fs.IntVar(&cfg.Relay.MaxInFlight, "max-in-flight", 0, "relay in-flight cap (0: the relay's default)")
		fs.IntVar(&cfg.Relay.PublishBatchSize, "publish-batch-size", 0, "relay publish batch size (0: the relay's default)")
		fs.DurationVar(&cfg.Relay.LeaseTTL, "lease-ttl", 0, "relay lease TTL (0: the relay's default, 15s)")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			if cfg.SchemaVersion < 0 || (cfg.SchemaVersion > 0 && cfg.DB != bench.DBPostgres) {
				return usageErrorf("--schema-version: want a positive version, with --db postgres")
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
			cfg.Progress = inv.stderr
			res, err := bench.Run(ctx, cfg)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(inv.stdout, res)
			return err
		}
	},
}
