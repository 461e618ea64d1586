package outboxcli

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/internal/pgsql/pgxq"
)

var walCommand = &command{
	name:    "wal",
	summary: "Set up, inspect or drop the publication and replication slot of WAL mode (PostgreSQL)",
	help: `In WAL mode, relays learn of new messages from PostgreSQL's logical replication instead
of polling (outbox relay --source wal; docs/design-wal.md). These commands manage what
WAL mode reads: a publication of the inserts into the outbox table and a logical
replication slot, recorded in the table outbox_wal (schema version 5). They need
PostgreSQL 14 or later with wal_level = logical.

A slot keeps every WAL segment written after the position relays confirmed, for the
whole server: a slot that nothing reads fills the disk. Set max_slot_wal_keep_size,
watch 'outbox wal status', and drop the slot when no relay will read it.

--slot defaults to outbox_wal and --publication to outbox_pub, each with --prefix in
front, and --schema too when it is not public (billing_app_outbox_wal): a slot's name is
unique in the whole server, a publication's in its database.

Exit status: 0 success; 1 failure (a missing privilege or wal_level, a missing or lost
slot); 2 usage or configuration error (a database that is not PostgreSQL, dropping a slot
in use without --force).`,
	subs: []*command{walSetupCommand, walStatusCommand, walDropCommand},
}

var walSetupCommand = &command{
	name:    "setup",
	summary: "Create the publication and the slot WAL mode reads (idempotent)",
	help: `Checks the server and the role first, and changes nothing when a check fails: wal_level
must be logical, the role needs the REPLICATION attribute, ownership of the outbox table
(to create the publication and disable the trigger) and CREATE on the database (to
create the publication), and a replication slot must be free. Then it creates what is
missing, in this order:

  1. the publication of the inserts into the outbox table (publish = 'insert',
     publish_via_partition_root = true); an existing one must have these settings;
  2. the logical replication slot (pgoutput). Creating it waits until every transaction
     open when it started has ended: after --slot-timeout it gives up and names the
     oldest open transaction;
  3. the slot's row in outbox_wal: where the slot started, the outbox sequence's value
     then, and the server's system identifier;
  4. unless --keep-notify, it disables the NOTIFY trigger (relays in WAL mode learn of
     new rows from the stream; NOTIFY takes a server-wide lock at every writer's commit),
     and records that it did, so that 'outbox wal drop' enables it again. Relays that
     poll then wake only every --poll-interval.

Running it again checks what exists, creates nothing twice, and finishes a setup that
stopped half-way. --dry-run prints the SQL it would run, and the checks that would stop
it.`,
	setup: func(fs *flag.FlagSet) runFunc {
		db := addDBFlags(fs, true)
		names := addWALFlags(fs)
		keepNotify := fs.Bool("keep-notify", false, "leave the NOTIFY trigger on (and enable it again if an earlier setup disabled it)")
		failover := fs.Bool("failover", false, "make the slot a failover slot, synchronized to standbys (PostgreSQL 17 or later)")
		timeout := fs.Duration("slot-timeout", pgsql.WALSlotTimeoutDefault, "give up creating the slot after this long waiting for open transactions")
		dryRun := fs.Bool("dry-run", false, "print the SQL setup would run, change nothing")
		asJSON := fs.Bool("json", false, "print JSON instead of text")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			if *timeout <= 0 {
				return usageErrorf("--slot-timeout: want a positive duration, like 30s")
			}
			return withWAL(ctx, db, names, func(w *walSession) error {
				if !*dryRun {
					if err := w.needMigrated(ctx, db); err != nil {
						return err
					}
				}
				res, err := w.names.WALSetup(ctx, w.inTx, pgsql.WALSetupOptions{Slot: w.slot, Publication: w.publication,
					KeepNotify: *keepNotify, Failover: *failover, SlotTimeout: *timeout, DryRun: *dryRun})
				return reportWAL(inv, *asJSON, *dryRun, res, err, printSetup)
			})
		}
	},
}

var walStatusCommand = &command{
	name:    "status",
	summary: "Show the slot's lag and retained WAL, the publication and the setup",
	help: `Shows the replication slot (whether a relay streams from it, PostgreSQL's wal_status,
how far its confirmed position is behind the server's WAL, how much WAL it retains, and
how much more may be written before it is lost under max_slot_wal_keep_size), the
publication, the slot's row in outbox_wal (the relay holding the slot lease, the state:
starting, streaming, or fallback with its reason), the NOTIFY trigger, wal_level and the
connected role's privileges. It changes nothing.

Exit status 1 when WAL mode cannot run: the slot or the publication is missing, lost or
unfit, wal_level is not logical, setup did not record the slot, or relays are in
fallback. --json prints the same as one JSON object (durations in nanoseconds), also
on exit 1.`,
	setup: func(fs *flag.FlagSet) runFunc {
		db := addDBFlags(fs, true)
		names := addWALFlags(fs)
		asJSON := fs.Bool("json", false, "print JSON instead of text")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			return withWAL(ctx, db, names, func(w *walSession) error {
				st, err := w.names.WALStatus(ctx, w.inTx, w.slot, w.publication)
				if err != nil {
					return err
				}
				if *asJSON {
					err = writeJSON(inv.stdout, st)
				} else {
					err = printWALStatus(inv.stdout, st, w.names)
				}
				if err != nil {
					return err
				}
				switch len(st.Problems) {
				case 0:
					return nil
				case 1:
					return fmt.Errorf("WAL mode cannot run: %s", st.Problems[0])
				}
				return fmt.Errorf("WAL mode cannot run:\n  - %s", strings.Join(st.Problems, "\n  - "))
			})
		}
	},
}

var walDropCommand = &command{
	name:    "drop",
	summary: "Drop the slot and the publication; relays poll, nothing is lost",
	help: `Drops the replication slot, then the publication (the one recorded with the slot, or
--publication when it publishes the outbox table alone), deletes the slot's row in
outbox_wal, and enables the NOTIFY trigger again if setup disabled it. Relays then poll:
nothing is lost, since every pending message is still in the outbox table.

While a relay streams from the slot, drop refuses (exit status 2) unless --force, which
first terminates that relay's replication connection (pg_terminate_backend). What is
already gone is skipped, so dropping twice is safe. --dry-run prints the SQL it would
run. It needs the REPLICATION attribute (for the slot), ownership of the publication,
and ownership of the outbox table when it enables the trigger.`,
	setup: func(fs *flag.FlagSet) runFunc {
		db := addDBFlags(fs, true)
		names := addWALFlags(fs)
		force := fs.Bool("force", false, "terminate the relay streaming from the slot instead of refusing")
		dryRun := fs.Bool("dry-run", false, "print the SQL drop would run, change nothing")
		asJSON := fs.Bool("json", false, "print JSON instead of text")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			return withWAL(ctx, db, names, func(w *walSession) error {
				res, err := w.names.WALDrop(ctx, w.inTx, pgsql.WALDropOptions{Slot: w.slot, Publication: w.publication, Force: *force, DryRun: *dryRun})
				var active *pgsql.WALSlotActiveError
				if errors.As(err, &active) {
					return &usageError{msg: err.Error()}
				}
				return reportWAL(inv, *asJSON, *dryRun, res, err, printDrop)
			})
		}
	},
}

// walFlags name the slot and the publication; empty means the outbox's default.
type walFlags struct {
	slot, publication string
}

func addWALFlags(fs *flag.FlagSet) *walFlags {
	w := &walFlags{}
	fs.StringVar(&w.slot, "slot", "", "the logical replication `slot` relays read (default outbox_wal, with --prefix in front,\n"+
		"and --schema too when it is not public)")
	fs.StringVar(&w.publication, "publication", "", "the `publication` the slot streams (default outbox_pub, named like --slot's default)")
	return w
}

// walSession is one connection to the outbox's database, for one wal command: the
// shared WAL code (internal/pgsql) runs its statements there, each step in a
// transaction of its own.
type walSession struct {
	names             *pgsql.Names
	slot, publication string
	conn              *pgx.Conn
}

// withWAL validates the flags, connects, and runs fn. WAL mode is PostgreSQL's logical
// replication: any other database is a usage error, as with partitions.
func withWAL(ctx context.Context, db *dbFlags, wf *walFlags, fn func(*walSession) error) error {
	if kind, err := db.kind(); err != nil {
		return err
	} else if kind != dbPostgres {
		return usageErrorf("WAL mode reads PostgreSQL's logical replication: 'outbox wal' works on PostgreSQL only; on %s, relays poll", kind)
	}
	t, err := db.target("outbox wal")
	if err != nil {
		return err
	}
	names, err := pgsql.NewNames(pgsql.Config{Schema: db.schema, Prefix: db.prefix})
	if err != nil {
		return flagError(err, dbConfigFlags)
	}
	defSlot, defPub := names.WALDefaults()
	w := &walSession{names: names, slot: cmp.Or(wf.slot, defSlot), publication: cmp.Or(wf.publication, defPub)}
	for _, f := range []struct{ flag, field, value, given string }{
		{"slot", "Slot", w.slot, wf.slot}, {"publication", "Publication", w.publication, wf.publication},
	} {
		if err := pgsql.CheckWALName(f.field, f.value); err != nil {
			if f.given == "" {
				return usageErrorf("--%s: the default name %q is longer than 63 bytes: pass --%s", f.flag, f.value, f.flag)
			}
			return flagError(err, map[string]string{f.field: f.flag})
		}
	}
	w.conn, err = pgx.ConnectConfig(ctx, t.pg.ConnConfig)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL at %s: %w", redactDSN(db.url), err)
	}
	defer w.conn.Close(context.WithoutCancel(ctx))
	return fn(w)
}

// inTx runs fn in a transaction of the session's connection (pgsql.InTx).
func (w *walSession) inTx(ctx context.Context, fn func(pgsql.Querier) error) error {
	return pgx.BeginFunc(ctx, w.conn, func(tx pgx.Tx) error { return fn(pgxq.Querier{DB: tx}) })
}

// needMigrated fails with advice unless every migration up to version 5 is applied:
// setup writes to outbox_wal (version 5), and a publication follows the table it was
// created for, so the pending ring (version 4, which replaces the outbox table) must be
// in place first. Later versions are not WAL mode's to ask for.
func (w *walSession) needMigrated(ctx context.Context, db *dbFlags) error {
	st, err := w.names.Status(ctx, w.inTx)
	if err != nil {
		return fmt.Errorf("read the outbox schema version: %w", err)
	}
	var missing []int
	for _, m := range st {
		if !m.Applied && m.Version <= pgsql.WALMigration {
			missing = append(missing, m.Version)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the outbox in %s (prefix %q) lacks schema versions %v, which WAL mode needs: run 'outbox migrate up' with the same --database-url, --schema and --prefix",
			db.where(), db.prefix, missing)
	}
	return nil
}

// printSteps prints the steps done, or on a dry run the SQL of each.
func printSteps(w io.Writer, steps []pgsql.WALStep, dryRun bool) {
	for _, s := range steps {
		if dryRun {
			fmt.Fprintf(w, "-- %s\n%s\n\n", s.Do, s.SQL)
		} else {
			fmt.Fprintf(w, "done: %s\n", s.Do)
		}
	}
}

// printPlan prints what a setup or a drop ran (or, on a dry run, would run); wouldBe and
// was say, for each case, that there was nothing to do. It reports whether the caller goes
// on (not a dry run).
func printPlan(w io.Writer, what, slot, publication string, steps []pgsql.WALStep, dryRun bool, wouldBe, was string) bool {
	if dryRun {
		fmt.Fprintf(w, "-- dry run: %s of slot %q and publication %q would run:\n\n", what, slot, publication)
		printSteps(w, steps, true)
		if len(steps) == 0 {
			fmt.Fprintln(w, "-- nothing: "+wouldBe)
		}
		return false
	}
	if len(steps) == 0 {
		fmt.Fprintln(w, was)
	}
	printSteps(w, steps, false)
	return true
}

// reportWAL prints what wal setup or wal drop did (or, with dryRun, would do), as JSON
// with asJSON, and returns err; an error other than a dry run's failed check is returned
// with nothing printed.
func reportWAL[T any](inv *invocation, asJSON, dryRun bool, res T, err error, print func(io.Writer, T)) error {
	var check *pgsql.WALCheckError
	if err != nil && !(dryRun && errors.As(err, &check)) {
		return err
	}
	if asJSON {
		if jerr := writeJSON(inv.stdout, res); jerr != nil {
			return jerr
		}
	} else {
		print(inv.stdout, res)
	}
	return err
}

func printSetup(w io.Writer, res pgsql.WALSetupResult) {
	if !printPlan(w, "setup", res.Slot, res.Publication, res.Steps, res.DryRun,
		"everything is in place", "everything was in place: nothing to do") {
		return
	}
	if r := res.Setup; r != nil {
		notify := "on"
		if r.NotifyDisabled {
			notify = "disabled by setup"
		}
		fmt.Fprintf(w, "WAL mode is set up: slot %q (created at %s, outbox seq %d), publication %q, NOTIFY trigger %s\n",
			res.Slot, r.CreatedLSN, r.CreatedSeq, res.Publication, notify)
	}
	fmt.Fprintln(w, "The slot retains WAL until relays in WAL mode confirm positions: watch 'outbox wal status', set\n"+
		"max_slot_wal_keep_size, and 'outbox wal drop' the slot if no relay will read it.")
}

func printDrop(w io.Writer, res pgsql.WALDropResult) {
	if !printPlan(w, "drop", res.Slot, res.Publication, res.Steps, res.DryRun,
		"nothing is left to drop", "nothing left to drop") {
		return
	}
	fmt.Fprintln(w, "Relays poll from now on, and nothing is lost: every pending message is still in the outbox table.")
}

func printWALStatus(w io.Writer, st pgsql.WALStatus, n *pgsql.Names) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if st.SlotExists {
		using := "no relay streams from it"
		if st.Active {
			using = fmt.Sprintf("streaming to PID %d", st.ActivePID)
		}
		fmt.Fprintf(tw, "slot\t%s\t%s; wal_status %s\n", st.Slot, using, st.WALStatus)
		fmt.Fprintf(tw, "lag\t%s\t(confirmed position behind the server's WAL)\n", optBytes(st.LagBytes))
		fmt.Fprintf(tw, "retained WAL\t%s\n", optBytes(st.RetainedBytes))
		if st.SafeWALSizeBytes != nil {
			fmt.Fprintf(tw, "safe WAL size\t%s\t(more WAL before the slot is lost; max_slot_wal_keep_size = %s)\n", optBytes(st.SafeWALSizeBytes), st.MaxSlotWALKeepSize)
		} else {
			fmt.Fprintf(tw, "safe WAL size\tunlimited\t(max_slot_wal_keep_size = %s: the slot may fill the disk)\n", st.MaxSlotWALKeepSize)
		}
	} else {
		fmt.Fprintf(tw, "slot\t%s\tmissing\n", st.Slot)
	}
	switch {
	case !st.PublicationExists:
		fmt.Fprintf(tw, "publication\t%s\tmissing\n", st.Publication)
	case st.PublicationMismatch != "":
		fmt.Fprintf(tw, "publication\t%s\tdoes not fit: %s\n", st.Publication, st.PublicationMismatch)
	default:
		fmt.Fprintf(tw, "publication\t%s\tinserts into %s\n", st.Publication, n.Outbox)
	}
	if r := st.Setup; r != nil {
		state := r.State
		if r.StateReason != "" {
			state += " (" + r.StateReason + ")"
		}
		fmt.Fprintf(tw, "state\t%s\tsince %s\n", state, r.StateAt.Local().Format(time.DateTime))
		if r.Owner != "" && r.LeaseLeft > 0 {
			fmt.Fprintf(tw, "slot lease\t%s\t%s left (token %d)\n", r.Owner, roundAge(r.LeaseLeft), r.Token)
		} else {
			fmt.Fprintf(tw, "slot lease\tnone\t(no relay holds it)\n")
		}
		fmt.Fprintf(tw, "created\tat %s\toutbox seq %d, system %s\n", r.CreatedLSN, r.CreatedSeq, r.SystemID)
	} else {
		fmt.Fprintf(tw, "state\tnot recorded\t(setup has not run)\n")
	}
	trigger := "on"
	switch {
	case !st.TriggerEnabled && st.Setup != nil && st.Setup.NotifyDisabled:
		trigger = "disabled by setup"
	case !st.TriggerEnabled:
		trigger = "disabled"
	}
	fmt.Fprintf(tw, "NOTIFY trigger\t%s\n", trigger)
	fmt.Fprintf(tw, "wal_level\t%s\n", st.WALLevel)
	fmt.Fprintf(tw, "role\t%s\tREPLICATION %s; owns the outbox table %s\n", st.Role, yesNo(st.Replication), yesNo(st.OwnsTable))
	return tw.Flush()
}

// optBytes prints a byte count in binary units, "-" when PostgreSQL gave none.
func optBytes(p *int64) string {
	if p == nil {
		return "-"
	}
	b := *p
	const unit = 1024
	if b < unit && b > -unit {
		return fmt.Sprintf("%d B", b)
	}
	v, suffix := float64(b), ""
	for _, s := range []string{"KiB", "MiB", "GiB", "TiB"} {
		v /= unit
		suffix = s
		if v < unit && v > -unit {
			break
		}
	}
	return fmt.Sprintf("%.1f %s", v, suffix)
}
