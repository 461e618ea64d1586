package outboxcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/outboxkit/outbox/internal/demo"
)

var demoCommand = &command{
	name:    "demo",
	summary: "See the outbox work end to end on embedded servers, in under a minute",
	help: `Runs a small order service that places orders and writes their events in the same
transaction, rolling some back; the relay publishing the events; and a shipping
consumer that handles them through an inbox, with some acks "lost" after the work
committed so that the broker delivers those events again. It prints progress, then a
summary that checks the guarantees on what just happened: every committed event
handled, no rolled-back event handled, per-key order, no duplicate effect (every
redelivery skipped by the inbox); then the latencies, commit -> published (the relay)
and commit -> handled (the consumer, which claims its deliveries in batches), and what
to run next.

Nothing needs to be installed or running: the database is a SQLite file and the broker
an embedded NATS JetStream server, both in a temporary directory removed at the end
(--dir keeps them, to look at with 'outbox status' or 'outbox console').
--database-url and --broker use real servers instead (a throwaway schema and stream,
removed at the end). Exit status 0 when every guarantee held, 1 otherwise.

Bigger runs: --orders sets how many orders are placed (two events each) and --writers
how many order transactions run at once, e.g.
  outbox demo --orders 50000 --writers 32
--rollback and --crash set the shares rolled back and of acks lost.`,
	setup: func(fs *flag.FlagSet) runFunc {
		var cfg demo.Config
		fs.IntVar(&cfg.Orders, "orders", 2000, "orders to place (each writes 2 events)")
		fs.IntVar(&cfg.Writers, "writers", 8, "order transactions at once")
		fs.Float64Var(&cfg.Rollback, "rollback", 0.1, "share of order transactions rolled back")
		fs.Float64Var(&cfg.Crash, "crash", 0.05, "share of deliveries whose ack is lost after the work committed")
		fs.StringVar(&cfg.DatabaseURL, "database-url", "", "PostgreSQL `URL` to use instead of an embedded SQLite file")
		fs.StringVar(&cfg.BrokerURL, "broker", "", "NATS `URL` to use instead of an embedded server")
		fs.StringVar(&cfg.Dir, "dir", "", "keep the SQLite file and the embedded server's store in this `directory`")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			if cfg.Orders < 1 || cfg.Writers < 1 || cfg.Rollback < 0 || cfg.Rollback >= 1 || cfg.Crash < 0 || cfg.Crash >= 1 {
				return usageErrorf("--orders and --writers must be positive; --rollback and --crash between 0 and 1")
			}
			if err := checkDemoURLs(cfg); err != nil {
				return err
			}
			cfg.Out = inv.stdout
			cfg.Command = cliCommand()
			res, err := demo.Run(ctx, cfg)
			if err != nil {
				return err
			}
			fmt.Fprint(inv.stdout, res.Summary())
			if res.Interrupted {
				return errors.New("interrupted")
			}
			if !res.OK() {
				return errors.New("a guarantee did not hold: see the summary")
			}
			return nil
		}
	},
}

// checkDemoURLs refuses a --database-url or --broker the demo cannot use: it runs on
// PostgreSQL or its own SQLite file, and its consumer reads NATS JetStream.
func checkDemoURLs(cfg demo.Config) error {
	if cfg.DatabaseURL != "" {
		if kind, err := (&dbFlags{url: cfg.DatabaseURL}).kind(); err != nil || kind != dbPostgres {
			return usageErrorf("--database-url: the demo runs on PostgreSQL (postgres://...) or, without --database-url, on SQLite files of its own (--dir keeps them)")
		}
	}
	if cfg.BrokerURL != "" {
		u, err := url.Parse(strings.TrimSpace(strings.Split(cfg.BrokerURL, ",")[0]))
		if err != nil || (u.Scheme != "nats" && u.Scheme != "tls") {
			return usageErrorf("--broker: the demo's consumer reads NATS JetStream: give a nats:// URL, or leave --broker out for an embedded server")
		}
	}
	return nil
}

// cliCommand is how the user ran this program, for the commands the demo suggests next:
// `go run ./cmd/outbox` when go run built it (it installed nothing called outbox),
// outbox otherwise.
func cliCommand() string {
	if exe, err := os.Executable(); err == nil && strings.Contains(exe, string(os.PathSeparator)+"go-build") {
		return "go run ./cmd/outbox"
	}
	return "outbox"
}
