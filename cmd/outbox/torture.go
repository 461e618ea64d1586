package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/torture/chaos"
)

var tortureCommand = &command{
	name:    "torture",
	summary: "Check the guarantees under load and faults (the correctness suite's long run)",
	help: `Runs the correctness suite's torture run on demand: writers commit (and roll back)
events in PostgreSQL transactions, relays run as separate processes and publish to a
private broker server, and a seeded nemesis injects faults meanwhile: relay SIGKILL,
relay SIGSTOP past its lease, broker restarts, broker connection cuts, database session
kills (and, with --private-postgres, PostgreSQL immediate restarts). Then every fault is
healed, the outbox drains, the broker is read back completely and the history is checked:
lost, phantom, per-key order violations, payload mismatches, duplicates against their
bound, dead letters against the injected poison.

The load runs for --duration, or until --events events were written, and in any case
until every fault kind was injected once and each count in --faults was reached. The
run works in a throwaway schema of --database-url; the broker is a private server the
run starts (nats-server must be installed for NATS; RabbitMQ for rabbitmq; Kafka runs on
the in-process kfake). Progress goes to stderr; the last line on stdout is the summary,
ending result=ok or result=FAIL (exit status 1). Ctrl-C ends the load early and still
checks what was written. Replay a run with its --seed.

  outbox torture --events 1000000 --relays 3 --faults relay-kill=50,broker-restart=10`,
	setup: func(fs *flag.FlagSet) runFunc {
		var cfg chaos.Config
		var faults, kinds string
		fs.StringVar(&cfg.Broker, "broker", "nats", "broker kind: "+strings.Join(chaos.Brokers(), ", "))
		fs.IntVar(&cfg.Relays, "relays", 1, "relay processes")
		fs.DurationVar(&cfg.Duration, "duration", 45*time.Second, "how long the load runs (unless --events is set)")
		fs.IntVar(&cfg.Events, "events", 0, "run the load until this many events were written (0: --duration)")
		fs.Uint64Var(&cfg.Seed, "seed", 0, "seed for the workload and the nemesis (0: random; the summary prints it)")
		fs.StringVar(&faults, "faults", "", "minimum fault counts, `kind=n,...` (e.g. relay-kill=50,broker-restart=10)")
		fs.StringVar(&kinds, "kinds", "", "fault kinds to inject, `kind,...` (default: all the broker supports)")
		fs.DurationVar(&cfg.MinGap, "min-gap", 300*time.Millisecond, "shortest quiet time between faults")
		fs.DurationVar(&cfg.MaxGap, "max-gap", 1500*time.Millisecond, "longest quiet time between faults")
		fs.IntVar(&cfg.Writers, "writers", 8, "concurrent writers")
		fs.Float64Var(&cfg.Rate, "rate", 300, "transactions per second over all writers (1-3 events each)")
		fs.IntVar(&cfg.Keys, "keys", 64, "aggregates (ordering keys); with few, long transactions hold up the writers")
		fs.StringVar(&cfg.DatabaseURL, "database-url", "", "PostgreSQL `URL` (default: the local test database); a throwaway schema is made there")
		fs.BoolVar(&cfg.PrivatePostgres, "private-postgres", false, "run the database on a private PostgreSQL server instead of --database-url (initdb in a\ntemporary directory; needs the PostgreSQL server binaries) and add pg-restart faults")
		fs.StringVar(&cfg.Artifacts, "artifacts", "", "`directory` that keeps the fault log and, on failure, the history")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			if cfg.MinGap <= 0 || cfg.MaxGap < cfg.MinGap {
				return usageErrorf("--min-gap must be positive and --max-gap at least --min-gap")
			}
			if cfg.Relays < 1 || cfg.Writers < 1 || cfg.Keys < 1 || cfg.Rate <= 0 || cfg.Events < 0 || cfg.Duration <= 0 {
				return usageErrorf("--relays, --writers, --keys, --rate and --duration must be positive, --events not negative")
			}
			if !slices.Contains(chaos.Brokers(), cfg.Broker) {
				return usageErrorf("--broker %q: not one of %s", cfg.Broker, strings.Join(chaos.Brokers(), ", "))
			}
			var err error
			if cfg.MinFaults, err = parseFaultCounts(faults); err != nil {
				return usageErrorf("--faults: %v", err)
			}
			if kinds != "" {
				cfg.Kinds = strings.Split(kinds, ",")
			}
			if cfg.Seed == 0 {
				cfg.Seed = chaos.RandomSeed()
			}
			cfg.Done = ctx.Done()
			logf := func(format string, args ...any) {
				fmt.Fprintf(inv.stderr, "%s %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
			}
			cfg.Progress = logf
			var line string
			var ok bool
			err = testenv.Run("torture", logf, func(tb testenv.TB) {
				rep := chaos.Run(tb, cfg)
				line, ok = rep.String(), rep.OK()
			})
			if line != "" {
				fmt.Fprintln(inv.stdout, line)
			}
			if err != nil {
				return fmt.Errorf("torture run (seed %d) is invalid: %w", cfg.Seed, err)
			}
			if !ok {
				return fmt.Errorf("torture run failed: replay with --seed %d", cfg.Seed)
			}
			return nil
		}
	},
}

// parseFaultCounts parses "kind=n,kind=n".
func parseFaultCounts(s string) (map[string]int, error) {
	if s == "" {
		return nil, nil
	}
	out := map[string]int{}
	for part := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		n, err := strconv.Atoi(v)
		if !ok || k == "" || err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not kind=count with a positive count", part)
		}
		out[k] = n
	}
	return out, nil
}

// tortureRelay runs this process as a relay of a torture run when it was started as one.
func tortureRelay() {
	if chaos.IsRelay() {
		os.Exit(chaos.RelayMain())
	}
}
