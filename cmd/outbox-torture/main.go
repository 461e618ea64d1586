// Command outbox-torture checks the outbox's guarantees under load and faults: the
// correctness suite's torture run, on demand.
//
// Writers commit (and roll back) events in PostgreSQL transactions, relays run as
// separate processes and publish to a private broker server, and a seeded nemesis
// injects faults meanwhile: relay SIGKILL, relay SIGSTOP past its lease, broker restarts,
// broker connection cuts, database session kills (and, with -private-postgres, PostgreSQL
// immediate restarts). Then every fault is healed, the outbox drains, the broker is read
// back completely and the history is checked: lost, phantom, per-key order violations,
// payload mismatches, duplicates against their bound, dead letters against the injected
// poison. Timing figures come before the summary line: commit-to-arrival and, per fault
// kind, heal-to-first-arrival (torture.Measure); they never fail a run.
//
// It is a tool of the project's own test suite, built apart from the outbox command so
// that the daemon links no test server:
//
//	go run ./cmd/outbox-torture -events 1000000 -relays 3 -faults relay-kill=50,broker-restart=10
//
// The relays of a run are this executable started again: the first thing main does is
// check whether it is one (chaos.IsRelay).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/torture/chaos"
)

const usage = `Usage: outbox-torture [flags]

Runs the correctness suite's torture run: writers commit (and roll back) events in
PostgreSQL transactions, relays run as separate processes and publish to a private
broker server, and a seeded nemesis injects faults meanwhile: relay SIGKILL, relay
SIGSTOP past its lease, broker restarts, broker connection cuts, database session kills
(and, with --private-postgres, PostgreSQL immediate restarts). Then every fault is
healed, the outbox drains, the broker is read back completely and the history is
checked: lost, phantom, per-key order violations, payload mismatches, duplicates against
their bound, dead letters against the injected poison.

The load runs for --duration, or until --events events were written, and in any case
until every fault kind was injected once and each count in --faults was reached. The
run works in a throwaway schema of --database-url; the broker is a private server the
run starts (nats-server must be installed for NATS; RabbitMQ for rabbitmq; Kafka runs on
the in-process kfake). Progress goes to stderr; the last line on stdout is the summary,
ending result=ok or result=FAIL (exit status 1; 2 for a usage error). Before it, stdout
has the timing figures, which never fail a run: commit-to-arrival p50/p99 over the whole
run, and per fault kind the time from each heal to the first copy the broker stored after
it (NATS only: other brokers give no arrival times yet); the summary carries lat_p50_ms,
lat_p99_ms and heal_p99_ms. Ctrl-C ends the load early and still checks what was
written. Replay a run with its --seed.

  outbox-torture --events 1000000 --relays 3 --faults relay-kill=50,broker-restart=10

Flags:
`

func main() {
	if chaos.IsRelay() {
		os.Exit(chaos.RelayMain())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal kills the process the default way
	}()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// errUsage marks a usage error: exit status 2.
var errUsage = errors.New("usage")

func usageErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errUsage}, args...)...)
}

// run runs the command with args and returns its exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "outbox-torture: %v\nRun 'outbox-torture --help' for usage.\n", strings.TrimPrefix(err.Error(), "usage: "))
		return 2
	}
	cfg.Done = ctx.Done()
	logf := func(format string, args ...any) {
		fmt.Fprintf(stderr, "%s %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	cfg.Progress = logf
	var line, timing string
	var ok bool
	err = testenv.Run("torture", logf, func(tb testenv.TB) {
		rep := chaos.Run(tb, cfg)
		line, timing, ok = rep.String(), rep.Timing.Table(), rep.OK()
	})
	if line != "" {
		fmt.Fprint(stdout, timing)
		fmt.Fprintln(stdout, line)
	}
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "outbox-torture: the run (seed %d) is invalid: %v\n", cfg.Seed, err)
		return 1
	case !ok:
		fmt.Fprintf(stderr, "outbox-torture: the run failed: replay with --seed %d\n", cfg.Seed)
		return 1
	}
	return 0
}

// parse reads the flags into a run's configuration.
func parse(args []string, stderr io.Writer) (chaos.Config, error) {
	var cfg chaos.Config
	var faults, kinds string
	fs := flag.NewFlagSet("outbox-torture", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&cfg.Broker, "broker", "nats", "broker kind: "+strings.Join(chaos.Brokers(), ", "))
	fs.IntVar(&cfg.Relays, "relays", 1, "relay processes")
	fs.IntVar(&cfg.Outboxes, "outboxes", 1, "outboxes, in two databases, each relay process serving all of them\nwith 'outbox relay' and an outboxes list (NATS only; no poison events)")
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
	fs.BoolVar(&cfg.WAL, "wal", false, "run the relays in WAL mode (PostgreSQL logical replication; implies --private-postgres,\nwith wal_level=logical, and sets up the slot)")
	fs.BoolVar(&cfg.PrivatePostgres, "private-postgres", false, "run the database on a private PostgreSQL server instead of --database-url (initdb in a\ntemporary directory; needs the PostgreSQL server binaries) and add pg-restart faults")
	fs.StringVar(&cfg.Artifacts, "artifacts", "", "`directory` that keeps the fault log and, on failure, the history")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, usage)
			fs.SetOutput(stderr)
			fs.PrintDefaults()
			return cfg, err
		}
		return cfg, usageErrorf("%v", err)
	}
	if fs.NArg() > 0 {
		return cfg, usageErrorf("unexpected argument %q", fs.Arg(0))
	}
	if cfg.MinGap <= 0 || cfg.MaxGap < cfg.MinGap {
		return cfg, usageErrorf("--min-gap must be positive and --max-gap at least --min-gap")
	}
	if cfg.Relays < 1 || cfg.Outboxes < 1 || cfg.Writers < 1 || cfg.Keys < 1 || cfg.Rate <= 0 || cfg.Events < 0 || cfg.Duration <= 0 {
		return cfg, usageErrorf("--relays, --outboxes, --writers, --keys, --rate and --duration must be positive, --events not negative")
	}
	if cfg.Outboxes > 1 && (cfg.Broker != "nats" || cfg.WAL) {
		return cfg, usageErrorf("--outboxes: several outboxes run with --broker nats and without --wal")
	}
	if !slices.Contains(chaos.Brokers(), cfg.Broker) {
		return cfg, usageErrorf("--broker %q: not one of %s", cfg.Broker, strings.Join(chaos.Brokers(), ", "))
	}
	var err error
	if cfg.MinFaults, err = parseFaultCounts(faults); err != nil {
		return cfg, usageErrorf("--faults: %v", err)
	}
	if kinds != "" {
		cfg.Kinds = strings.Split(kinds, ",")
	}
	if cfg.Seed == 0 {
		cfg.Seed = chaos.RandomSeed()
	}
	return cfg, nil
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
