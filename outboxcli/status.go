package outboxcli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/outboxdriver"
)

var statusCommand = &command{
	name:    "status",
	summary: "Show the backlog, dead letters, relays and shard leases",
	help: `Shows how many messages are pending (due now, or delayed by a retry backoff or
DeliverAt), retrying after a rejection, dead-lettered and published (kept until
retention deletes them; estimated on large tables), the age of the oldest pending
message, the same per topic, and the relays with the shards they lease.

--json prints the same as one JSON object (durations in nanoseconds).

With an outboxes list in the config file (see outbox relay --help), and no --database-url,
--schema or --prefix on the command line, it shows one line per outbox of the list,
worst first (warnings, oldest pending message, backlog); --outbox NAME shows one in
full.`,
	setup: func(fs *flag.FlagSet) runFunc {
		db := addDBFlags(fs, true)
		asJSON := fs.Bool("json", false, "print JSON instead of text")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			if usesOutboxList(inv, fs) {
				return statusFleet(ctx, inv, db, *asJSON)
			}
			drv, err := db.openMigrated(ctx, "outbox status")
			if err != nil {
				return err
			}
			defer drv.close()
			st, err := drv.Status(ctx)
			if err != nil {
				return err
			}
			if jobs, ok := drv.storeDriver.(outboxdriver.ReplayJobs); ok {
				if st.Replays, err = jobs.Replays(ctx); err != nil && !errors.Is(err, pgsql.ErrNoReplayTable) {
					return err
				}
			}
			if *asJSON {
				return writeJSON(inv.stdout, st)
			}
			return printStatus(inv.stdout, st, drv.kind == dbPostgres, time.Now())
		}
	},
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printStatus prints st; postgres adds what only PostgreSQL reports (the oldest open
// transaction, which holds back vacuum).
func printStatus(w io.Writer, st outboxdriver.Status, postgres bool, now time.Time) error {
	if warnings := st.Warnings(); len(warnings) > 0 {
		for _, warning := range warnings {
			fmt.Fprintf(w, "WARNING: %s\n", warning)
		}
		fmt.Fprintln(w)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "pending\t%d\n", st.Pending)
	fmt.Fprintf(tw, "  due\t%d\n", st.Due)
	fmt.Fprintf(tw, "  delayed\t%d\t(retry backoff or DeliverAt)\n", st.Delayed)
	fmt.Fprintf(tw, "  retrying\t%d\t(rejected at least once)\n", st.Retrying)
	if st.DeadLastHour > 0 {
		fmt.Fprintf(tw, "dead\t%d (%d in the last hour)\n", st.Dead, st.DeadLastHour)
	} else {
		fmt.Fprintf(tw, "dead\t%d\n", st.Dead)
	}
	fmt.Fprintf(tw, "published\t%d\t(kept for retention; estimated on large tables)\n", st.Published)
	fmt.Fprintf(tw, "oldest pending\t%s\n", age(st.OldestPendingAge, st.Pending))
	fmt.Fprintf(tw, "shards leased\t%d of %d\n", st.ShardsLeased, st.Shards)
	if p := st.Partitions; p != nil {
		switch {
		case p.DaysAhead < 0:
			fmt.Fprintf(tw, "partitions\t%d\t(none for today: recording outcomes fails; run 'outbox partitions create')\n", p.Count)
		default:
			fmt.Fprintf(tw, "partitions\t%d\t(%s to %s, %d days ahead)\n", p.Count, p.Oldest.Format(time.DateOnly), p.Newest.Format(time.DateOnly), p.DaysAhead)
		}
	}
	if r := st.Ring; r != nil {
		fmt.Fprintf(tw, "pending ring\tbucket %d\t(%d rotations, %d messages since the last)\n", r.Current, r.Rotations, r.RowsSinceRotation)
	}
	if postgres {
		fmt.Fprintf(tw, "oldest transaction\t%s\t(holds back vacuum while open)\n", st.OldestTransactionAge.Round(time.Second))
	}
	for _, ws := range st.WAL {
		fmt.Fprintf(tw, "WAL slot %s\t%s\t(%s)\n", ws.Slot, walState(ws), walSlotFacts(ws, now))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	if len(st.Topics) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TOPIC\tPENDING\tDUE\tRETRYING\tDEAD\tOLDEST PENDING")
		for _, t := range st.Topics {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\n", t.Topic, t.Pending, t.Due, t.Retrying, t.Dead, age(t.OldestPendingAge, t.Pending))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	if len(st.Priorities) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "PRIORITY\tPENDING\tDUE\tOLDEST PENDING")
		for _, p := range st.Priorities {
			fmt.Fprintf(tw, "%d\t%d\t%d\t%s\n", p.Priority, p.Pending, p.Due, age(p.OldestPendingAge, p.Pending))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	if len(st.Replays) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "REPLAY\tSTATE\tDESTINATION\tSENT\tFAILED\tOF\tPUBLISHED UP TO\tUPDATED")
		for i, j := range st.Replays {
			if i == 10 {
				fmt.Fprintf(tw, "(and %d more)\n", len(st.Replays)-i)
				break
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s ago\n", j.Name, j.State, j.Destination, j.Sent, j.Failed, j.Total,
				j.Cursor.UTC().Format(time.RFC3339), roundAge(now.Sub(j.UpdatedAt)))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	fmt.Fprintln(w)
	if len(st.Relays) == 0 {
		fmt.Fprintln(w, "no relay is running (a relay that stops cleanly leaves this list at once; one that dies stays an hour)")
		return nil
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RELAY\tHOST\tPID\tLIVE\tSHARDS\tROUTING\tSTARTED\tLAST HEARTBEAT\tDESTINATIONS")
	for _, r := range st.Relays {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s ago\t%s\n", r.ID, r.Hostname, r.PID, yesNo(r.Live), r.Shards, cmp.Or(r.Fingerprint, "-"),
			r.StartedAt.Local().Format(time.DateTime), roundAge(now.Sub(r.HeartbeatAt)), destinationStates(r.Destinations, now))
	}
	return tw.Flush()
}

// destinationStates renders a relay's destinations for the relay table: "default up,
// audit down 2m", or "-" for a relay of one broker.
func destinationStates(ds []outboxdriver.DestinationState, now time.Time) string {
	if len(ds) == 0 {
		return "-"
	}
	var parts []string
	for _, d := range ds {
		if d.Up {
			parts = append(parts, d.Name+" up")
		} else {
			parts = append(parts, d.Name+" down "+roundAge(now.Sub(d.Since)))
		}
	}
	return strings.Join(parts, ", ")
}

func age(d time.Duration, pending int64) string {
	if pending == 0 {
		return "-"
	}
	return roundAge(d)
}

// roundAge keeps ages readable: 1h2m3s, 4.2s, 15ms.
func roundAge(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

// quoteIfNeeded quotes s when it has characters that would break a column.
func quoteIfNeeded(s string) string {
	for _, r := range s {
		if r == '\t' || r == '\n' || isControl(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// isControl reports whether r is a control character a terminal may act on, other than
// newline and tab: C0 (ESC starts clear-screen, title and OSC 52 clipboard sequences),
// DEL and C1 (U+009B is a one-character CSI).
func isControl(r rune) bool {
	return r != '\n' && r != '\t' && (r < ' ' || r == 0x7f || (r >= 0x80 && r < 0xa0))
}

// escapeControls makes text from the database (a payload, an error a broker returned)
// safe to print on a terminal: every control character but newline and tab is written
// as a Go escape (\x1b, \u009b), which the operator can still read.
func escapeControls(s string) string {
	if !strings.ContainsFunc(s, isControl) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if isControl(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// walState is a WAL slot's recorded state, with its reason.
func walState(ws outboxdriver.WALSlotStatus) string {
	if ws.Reason != "" {
		return ws.State + ": " + ws.Reason
	}
	return ws.State
}

// walSlotFacts says who reads a WAL slot and what it costs the server.
func walSlotFacts(ws outboxdriver.WALSlotStatus, now time.Time) string {
	reader := "no reader"
	if ws.Reader != "" {
		reader = "read by " + ws.Reader
	}
	since := roundAge(now.Sub(ws.StateSince)) + " in this state"
	if !ws.Exists {
		return reader + ", " + since + "; the slot is gone: the relays poll"
	}
	facts := fmt.Sprintf("%s, %s; %s behind, %s retained, wal_status %s", reader, since,
		optBytes(&ws.LagBytes), optBytes(&ws.RetainedBytes), ws.WALStatus)
	if ws.SafeWALSizeBytes != nil {
		facts += ", " + optBytes(ws.SafeWALSizeBytes) + " until lost"
	}
	return facts
}
