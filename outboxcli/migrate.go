package outboxcli

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/outboxkit/outbox/outboxpgx"
)

var migrateCommand = &command{
	name:    "migrate",
	summary: "Create, upgrade, inspect or drop the outbox schema",
	help: `Manages the outbox tables in --schema (with --prefix). Migrations run in one
transaction under an advisory lock, so several processes may run 'migrate up' at once.`,
	subs: []*command{migrateUpCommand, migrateDownCommand, migrateStatusCommand, migrateSQLCommand},
}

var migrateUpCommand = &command{
	name:    "up",
	summary: "Apply the migrations not yet applied",
	help: `Applies every migration not yet applied, or those up to --to.

With an outboxes list in the config file (see outbox relay --help), and no --database-url,
--schema or --prefix on the command line, it migrates every outbox of the list, one after
the other (a rule's: every matching schema that holds an outbox already), says what it
did for each, and goes on past a failure; it exits 1 if any failed, and running it again
migrates only what is left.`,
	setup: func(fs *flag.FlagSet) runFunc {
		db := addDBFlags(fs, true)
		db.create = true
		to := &optionalInt{}
		fs.Var(to, "to", "apply migrations up to this `version` only (default: all)")
		fs.IntVar(&db.maxCopy, "max-copy", outboxpgx.MigrateCopyLimitDefault,
			"PostgreSQL: refuse to make the pending table a ring (migration 4) when more than `n` messages are\n"+
				"pending: they are copied while writers and relays wait (about 5 µs each); -1 for no limit")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			if to.set && to.n < 1 {
				return usageErrorf("--to: want a version of 1 or more")
			}
			if db.maxCopy < -1 {
				return usageErrorf("--max-copy: want -1 (no limit) or more")
			}
			if usesOutboxList(inv, fs) {
				return migrateFleet(ctx, inv, db, to.n)
			}
			drv, err := db.open(ctx, "outbox migrate")
			if err != nil {
				return err
			}
			defer drv.close()
			applied, err := drv.MigrateUp(ctx, to.n)
			if err != nil {
				return fmt.Errorf("migrate up: %w", err)
			}
			if len(applied) == 0 {
				fmt.Fprintf(inv.stdout, "%s is up to date\n", db.where())
				return nil
			}
			names := migrationNames(ctx, drv)
			for _, v := range applied {
				fmt.Fprintf(inv.stdout, "applied %03d_%s\n", v, names[v])
			}
			return nil
		}
	},
}

var migrateDownCommand = &command{
	name:    "down",
	summary: "Revert migrations (down to version 0 drops the outbox and its messages)",
	help: `Reverts the latest applied migration, or every migration above --to. A migration
whose reversal deletes data needs --yes, and without it the command says what would be
deleted and changes nothing: 005_wal (outbox_wal, which names WAL mode's replication
slots; it refuses while one exists: 'outbox wal drop' it first), 002_consumer (the
consumers' inbox and versions tables) and 001_init (the outbox tables with every message
in them, pending ones included).`,
	setup: func(fs *flag.FlagSet) runFunc {
		db := addDBFlags(fs, true)
		to := &optionalInt{}
		fs.Var(to, "to", "revert down to this `version`; 0 drops everything (default: one version back)")
		yes := fs.Bool("yes", false, "confirm reverting migrations that delete data (001_init, 002_consumer, 005_wal)")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			if to.set && to.n < 0 {
				return usageErrorf("--to: want a version of 0 or more")
			}
			drv, err := db.open(ctx, "outbox migrate")
			if err != nil {
				return err
			}
			defer drv.close()
			status, err := drv.MigrationStatus(ctx)
			if err != nil {
				return fmt.Errorf("migrate down: %w", err)
			}
			var applied []int
			drops := map[int]string{}
			for _, m := range status {
				if m.Applied {
					applied = append(applied, m.Version)
				}
				if m.Applied && m.DownDrops != "" {
					drops[m.Version] = fmt.Sprintf("%03d_%s drops %s", m.Version, m.Name, m.DownDrops)
				}
			}
			if len(applied) == 0 {
				fmt.Fprintf(inv.stdout, "%s has no outbox migrations applied: nothing to revert\n", db.where())
				return nil
			}
			target := to.n
			if !to.set { // one step back
				target = 0
				if len(applied) > 1 {
					target = applied[len(applied)-2]
				}
			}
			if !*yes {
				var lost []string
				for i := len(applied) - 1; i >= 0 && applied[i] > target; i-- {
					if d, ok := drops[applied[i]]; ok {
						lost = append(lost, d)
					}
				}
				if len(lost) > 0 {
					return usageErrorf("migrate down to version %d deletes data in %s (prefix %q): reverting %s. Nothing was changed; add --yes to do it",
						target, db.where(), db.prefix, strings.Join(lost, "; reverting "))
				}
			}
			reverted, err := drv.MigrateDown(ctx, target)
			if err != nil {
				return fmt.Errorf("migrate down: %w", err)
			}
			if len(reverted) == 0 {
				fmt.Fprintf(inv.stdout, "%s is already at version %d or below\n", db.where(), target)
			}
			names := migrationNames(ctx, drv)
			for _, v := range reverted {
				fmt.Fprintf(inv.stdout, "reverted %03d_%s\n", v, names[v])
			}
			return nil
		}
	},
}

var migrateStatusCommand = &command{
	name:    "status",
	summary: "List the migrations and whether each is applied",
	setup: func(fs *flag.FlagSet) runFunc {
		db := addDBFlags(fs, true)
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			drv, err := db.open(ctx, "outbox migrate")
			if err != nil {
				return err
			}
			defer drv.close()
			status, err := drv.MigrationStatus(ctx)
			if err != nil {
				return fmt.Errorf("migrate status: %w", err)
			}
			tw := tabwriter.NewWriter(inv.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "VERSION\tNAME\tAPPLIED")
			for _, m := range status {
				fmt.Fprintf(tw, "%03d\t%s\t%s\n", m.Version, m.Name, yesNo(m.Applied))
			}
			return tw.Flush()
		}
	},
}

var migrateSQLCommand = &command{
	name:    "sql",
	summary: "Print the schema as SQL, for teams with their own migration tool",
	help: `Prints every migration as one SQL script for --schema and --prefix, with the rows that
record them as applied, so that 'outbox migrate status' and the relay agree afterwards.
It needs no database connection.`,
	setup: func(fs *flag.FlagSet) runFunc {
		db := addDBFlags(fs, false)
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			drv, err := db.driver()
			if err != nil {
				return err
			}
			sql, err := drv.MigrationSQL()
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(inv.stdout, sql)
			return err
		}
	},
}

// migrationNames maps versions to names, for messages.
func migrationNames(ctx context.Context, drv storeDriver) map[int]string {
	names := map[int]string{}
	if st, err := drv.MigrationStatus(ctx); err == nil {
		for _, m := range st {
			names[m.Version] = m.Name
		}
	}
	return names
}

func noArgs(args []string) error {
	if len(args) > 0 {
		return usageErrorf("unexpected argument %q", args[0])
	}
	return nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
