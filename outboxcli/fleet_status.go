package outboxcli

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/outboxkit/outbox/outboxdriver"
)

// fleetStatus is one outbox's line of the overview.
type fleetStatus struct {
	Name   string               `json:"name"`
	Status *outboxdriver.Status `json:"status,omitempty"`
	Error  string               `json:"error,omitempty"`
}

// statusFleet prints an overview of every outbox of the config file's outboxes list,
// worst first.
func statusFleet(ctx context.Context, inv *invocation, base *dbFlags, asJSON bool) error {
	conns := newDBConns(ctx, "outbox status")
	defer conns.close()
	targets, err := fleetOutboxDBs(ctx, inv, base)
	if err != nil {
		return err
	}
	lines := make([]fleetStatus, len(targets))
	failed := 0
	for i, t := range targets {
		lines[i].Name = t.name
		st, err := func() (outboxdriver.Status, error) {
			drv, err := conns.driver(t.db)
			if err != nil {
				return outboxdriver.Status{}, err
			}
			return drv.Status(ctx)
		}()
		if err != nil {
			lines[i].Error = err.Error()
			failed++
			continue
		}
		lines[i].Status = &st
	}
	slices.SortStableFunc(lines, func(a, b fleetStatus) int { return worse(b, a) })
	if asJSON {
		if err := writeJSON(inv.stdout, lines); err != nil {
			return err
		}
	} else if err := printFleet(inv, lines); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("status: %d of %d outboxes could not be read (ERROR above)", failed, len(lines))
	}
	return nil
}

// worse orders the overview (outboxdriver.CompareHealth, then by name); above 0 when a
// is the worse.
func worse(a, b fleetStatus) int {
	return cmp.Or(outboxdriver.CompareHealth(a.Status, b.Status), strings.Compare(b.Name, a.Name))
}

func printFleet(inv *invocation, lines []fleetStatus) error {
	tw := tabwriter.NewWriter(inv.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "OUTBOX\tPENDING\tDUE\tOLDEST\tDEAD\tDEAD 1H\tRELAYS\tSHARDS LEASED\tWARNINGS")
	for _, l := range lines {
		if l.Status == nil {
			fmt.Fprintf(tw, "%s\tERROR: %s\n", l.Name, strings.ReplaceAll(l.Error, "\n", " "))
			continue
		}
		st := l.Status
		live := 0
		for _, r := range st.Relays {
			if r.Live {
				live++
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%d\t%d\t%d/%d\t%d\n", l.Name, st.Pending, st.Due, age(st.OldestPendingAge, st.Pending),
			st.Dead, st.DeadLastHour, live, st.ShardsLeased, st.Shards, len(st.Warnings()))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(inv.stdout, "\n%d outboxes, worst first. An outbox's warnings and topics: outbox status --outbox NAME.\n", len(lines))
	return err
}
