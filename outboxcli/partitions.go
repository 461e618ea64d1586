package outboxcli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/outboxkit/outbox/outboxpgx"
)

var partitionsCommand = &command{
	name:    "partitions",
	summary: "List, create or drop the published history's daily partitions",
	help: `The published history lives in one partition per UTC day (schema version 3). Relays
create days 7 ahead and drop the days older than their --retention on their own; these
commands do the same by hand, for a check, a catch-up after relays were down for days,
or an outbox whose relays keep history forever.

DDL waits at most 200 ms for its table lock and gives up rather than hold up relays
recording outcomes: run it again. Exit status 0 success, 1 failure, 2 usage or
configuration error.`,
	subs: []*command{partitionsListCommand, partitionsCreateCommand, partitionsDropCommand},
}

// partitionsOutput is what the partitions commands print with --json.
type partitionsOutput struct {
	Days   []string `json:"days"`             // YYYY-MM-DD, UTC
	Legacy bool     `json:"legacy,omitempty"` // drop: the history from before version 3 too
	DryRun bool     `json:"dry_run,omitempty"`
}

// printDays prints out, each day after verb (and "would " + the verb's base form on a dry
// run: "created"/"create"), or bare when verb is empty.
func printDays(w io.Writer, asJSON bool, out partitionsOutput, verb, base string) error {
	if asJSON {
		if out.Days == nil {
			out.Days = []string{}
		}
		return writeJSON(w, out)
	}
	if out.DryRun {
		verb = "would " + base
	}
	for _, d := range out.Days {
		if verb == "" {
			fmt.Fprintln(w, d)
		} else {
			fmt.Fprintf(w, "%s %s\n", verb, d)
		}
	}
	if out.Legacy {
		fmt.Fprintf(w, "%s the history kept from before schema version 3\n", verb)
	}
	if verb != "" && len(out.Days) == 0 && !out.Legacy {
		fmt.Fprintln(w, "nothing to do")
	}
	return nil
}

func dayStrings(days []time.Time) []string {
	out := make([]string, len(days))
	for i, d := range days {
		out[i] = d.Format(time.DateOnly)
	}
	return out
}

// withDriver opens the migrated outbox for one partitions command; its published history
// must be partitioned (schema version 3).
func withDriver(ctx context.Context, db *dbFlags, fn func(*outboxpgx.Driver) error) error {
	if kind, err := db.kind(); err != nil {
		return err
	} else if kind != dbPostgres {
		return usageErrorf("the published history is kept in daily partitions on PostgreSQL only; on %s, relays delete it row by row after --retention", kind)
	}
	s, err := db.open(ctx, "outbox partitions")
	if err != nil {
		return err
	}
	defer s.close()
	if deferred, err := db.checkMigrated(ctx, s); err != nil {
		return err
	} else if slices.Contains(deferred, 3) { // the others (the ring, WAL mode) do not matter here
		return fmt.Errorf("the published history in %s (prefix %q) is not partitioned yet (missing schema versions %v): run 'outbox migrate up'", db.where(), db.prefix, deferred)
	}
	return fn(s.pg)
}

var partitionsListCommand = &command{
	name:    "list",
	summary: "List the days that have a partition",
	help:    `Prints the UTC days of published history that have a partition, oldest first.`,
	setup: func(fs *flag.FlagSet) runFunc {
		db := addDBFlags(fs, true)
		asJSON := fs.Bool("json", false, "print JSON instead of text")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			return withDriver(ctx, db, func(drv *outboxpgx.Driver) error {
				days, err := drv.Partitions(ctx)
				if err != nil {
					return err
				}
				return printDays(inv.stdout, *asJSON, partitionsOutput{Days: dayStrings(days)}, "", "")
			})
		}
	},
}

var partitionsCreateCommand = &command{
	name:    "create",
	summary: "Create the partitions of today and the days ahead",
	help:    `Creates the partition of every UTC day from today to today + --days that has none.`,
	setup: func(fs *flag.FlagSet) runFunc {
		db := addDBFlags(fs, true)
		ahead := fs.Int("days", 7, "days after today to create")
		dryRun := fs.Bool("dry-run", false, "say which days would be created, create nothing")
		asJSON := fs.Bool("json", false, "print JSON instead of text")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			if *ahead < 0 || *ahead > 366 {
				return usageErrorf("--days: want 0 to 366")
			}
			return withDriver(ctx, db, func(drv *outboxpgx.Driver) error {
				days, err := drv.CreatePartitions(ctx, *ahead, *dryRun)
				if err != nil {
					return fmt.Errorf("create partitions: %w", err)
				}
				return printDays(inv.stdout, *asJSON, partitionsOutput{Days: dayStrings(days), DryRun: *dryRun}, "created", "create")
			})
		}
	},
}

var partitionsDropCommand = &command{
	name:    "drop",
	summary: "Drop the days older than the retention time",
	help: `Drops every day of published history that ended more than --retention ago, and the
history kept from before schema version 3 once that version is older than --retention.
Published messages are history: pending and dead messages are never in a partition.`,
	setup: func(fs *flag.FlagSet) runFunc {
		db := addDBFlags(fs, true)
		retention := fs.Duration("retention", 0, "keep this much history: the relays' --retention (required)")
		dryRun := fs.Bool("dry-run", false, "say which days would be dropped, drop nothing")
		asJSON := fs.Bool("json", false, "print JSON instead of text")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			if *retention <= 0 {
				return usageErrorf("--retention: required, a positive duration (the relays' --retention, e.g. 168h)")
			}
			return withDriver(ctx, db, func(drv *outboxpgx.Driver) error {
				days, legacy, err := drv.DropPartitions(ctx, *retention, *dryRun)
				if err != nil {
					return fmt.Errorf("drop partitions: %w", err)
				}
				return printDays(inv.stdout, *asJSON, partitionsOutput{Days: dayStrings(days), Legacy: legacy, DryRun: *dryRun}, "dropped", "drop")
			})
		}
	},
}
