package outboxcli

import (
	"context"
	"encoding/base64"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
)

var deadCommand = &command{
	name:    "dead",
	summary: "List, show, replay or purge dead letters",
	help: `A message is dead-lettered after the broker rejected it --max-attempts times. It moves
to the outbox_dead table and stays there until it is replayed (published again with its
original id and dedup key) or purged.

Filters (all must match): --id (repeatable), --topic, --key, --error (substring of the
last error, any case), --since and --until (when it was dead-lettered: an RFC 3339 time,
or a duration meaning that long ago, as in --since 2h), --limit (the newest that many).`,
	subs: []*command{deadListCommand, deadShowCommand, deadReplayCommand, deadPurgeCommand},
}

// deadFilterFlags are the flags that select dead letters.
type deadFilterFlags struct {
	ids          stringList
	topic, key   string
	errContains  string
	since, until pointInTime
	limit        int
}

func addDeadFilterFlags(fs *flag.FlagSet, defaultLimit int, limitHelp string) *deadFilterFlags {
	o := &deadFilterFlags{}
	fs.Var(&o.ids, "id", "only the message with this `id` (repeatable; comma-separated in the environment)")
	fs.StringVar(&o.topic, "topic", "", "only messages of this `topic`")
	fs.StringVar(&o.key, "key", "", "only messages with this `key`")
	fs.StringVar(&o.errContains, "error", "", "only messages whose last error contains this `text` (any case)")
	fs.Var(&o.since, "since", "only messages dead-lettered at or after this `time` (RFC 3339, or a duration ago: 2h)")
	fs.Var(&o.until, "until", "only messages dead-lettered before this `time` (RFC 3339, or a duration ago: 30m)")
	fs.IntVar(&o.limit, "limit", defaultLimit, limitHelp)
	return o
}

// open checks the arguments and filter of a dead-letter command that takes no arguments,
// then opens the migrated store it works on: usage errors come before any connection.
// The caller closes the store.
func (o *deadFilterFlags) open(ctx context.Context, db *dbFlags, args []string) (outboxdriver.DeadFilter, *openedStore, error) {
	if err := noArgs(args); err != nil {
		return outboxdriver.DeadFilter{}, nil, err
	}
	f, err := o.filter()
	if err != nil {
		return f, nil, err
	}
	drv, err := db.openMigrated(ctx, "outbox dead")
	return f, drv, err
}

func (o *deadFilterFlags) filter() (outboxdriver.DeadFilter, error) {
	f := outboxdriver.DeadFilter{Topic: o.topic, Key: o.key, ErrorContains: o.errContains, Since: o.since.t, Until: o.until.t, Limit: o.limit}
	for _, s := range o.ids {
		id, err := outbox.ParseID(strings.TrimSpace(s))
		if err != nil {
			return f, usageErrorf("--id: %s", strings.TrimPrefix(err.Error(), "outbox: "))
		}
		f.IDs = append(f.IDs, id)
	}
	if o.limit < 0 {
		return f, usageErrorf("--limit: must not be negative (0 means no limit)")
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return f, usageErrorf("--since (%s) is not before --until (%s)", f.Since.Format(time.RFC3339), f.Until.Format(time.RFC3339))
	}
	return f, flagError(f.Validate(), deadFilterFields)
}

// describeNone says that nothing matched f.
func describeNone(f outboxdriver.DeadFilter) string {
	if parts := f.String(); parts != "" {
		return "no dead letters match " + parts
	}
	return "there are no dead letters"
}

// deadFilterFields maps DeadFilter's fields to their flags, for error messages.
var deadFilterFields = map[string]string{"DeadFilter.Topic": "topic", "DeadFilter.Key": "key", "DeadFilter.ErrorContains": "error"}

const listLimitDefault = 100

var deadListCommand = &command{
	name:    "list",
	summary: "List dead letters, newest first",
	setup: func(fs *flag.FlagSet) runFunc {
		db := addDBFlags(fs, true)
		ff := addDeadFilterFlags(fs, listLimitDefault, "show at most `n`, newest first; 0 shows all")
		asJSON := fs.Bool("json", false, "print a JSON array of dead letters, payloads in base64")
		return func(ctx context.Context, inv *invocation, args []string) error {
			f, drv, err := ff.open(ctx, db, args)
			if err != nil {
				return err
			}
			defer drv.close()
			dls, err := drv.DeadList(ctx, f)
			if err != nil {
				return err
			}
			if *asJSON {
				out := make([]deadLetterJSON, len(dls))
				for i, dl := range dls {
					out[i] = toJSON(dl)
				}
				return writeJSON(inv.stdout, out)
			}
			if len(dls) == 0 {
				fmt.Fprintln(inv.stdout, describeNone(f))
				return nil
			}
			if err := printDeadTable(inv.stdout, dls); err != nil {
				return err
			}
			if f.Limit > 0 && len(dls) == f.Limit {
				fmt.Fprintf(inv.stdout, "\nshowing the newest %d; --limit 0 shows all\n", f.Limit)
			}
			return nil
		}
	},
}

// deadLetterJSON is a dead letter in the output of --json: snake_case keys like
// outboxdriver.Status, the payload in base64.
type deadLetterJSON struct {
	ID            outbox.ID         `json:"id"`
	DedupKey      string            `json:"dedup_key"`
	Topic         string            `json:"topic"`
	Key           string            `json:"key"`
	AggregateType string            `json:"aggregate_type"`
	EventType     string            `json:"event_type"`
	ContentType   string            `json:"content_type"`
	Headers       map[string]string `json:"headers"`
	Payload       []byte            `json:"payload"`
	Seq           int64             `json:"seq"`
	Shard         int               `json:"shard"`
	CreatedAt     time.Time         `json:"created_at"`
	DeadAt        time.Time         `json:"dead_at"`
	Attempts      int               `json:"attempts"`
	LastError     string            `json:"last_error"`
}

func toJSON(dl outboxdriver.DeadLetter) deadLetterJSON {
	h := dl.Headers
	if h == nil {
		h = map[string]string{}
	}
	return deadLetterJSON{
		ID: dl.ID, DedupKey: dl.DedupKey, Topic: dl.Topic, Key: dl.Key, AggregateType: dl.AggregateType,
		EventType: dl.EventType, ContentType: dl.ContentType, Headers: h, Payload: dl.Payload, Seq: dl.Seq,
		Shard: dl.Shard, CreatedAt: dl.CreatedAt, DeadAt: dl.DeadAt, Attempts: dl.Attempts, LastError: dl.LastError,
	}
}

func printDeadTable(w io.Writer, dls []outboxdriver.DeadLetter) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DEAD AT\tID\tTOPIC\tKEY\tEVENT TYPE\tATTEMPTS\tLAST ERROR")
	for _, dl := range dls {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", dl.DeadAt.Local().Format(time.DateTime), dl.ID, quoteIfNeeded(dl.Topic),
			quoteIfNeeded(dl.Key), quoteIfNeeded(dl.EventType), dl.Attempts, oneLine(dl.LastError, 80))
	}
	return tw.Flush()
}

// oneLine shortens s to its first line and at most n runes.
func oneLine(s string, n int) string {
	s, _, more := strings.Cut(escapeControls(s), "\n")
	s = strings.ReplaceAll(s, "\t", " ")
	if utf8.RuneCountInString(s) > n {
		s = string([]rune(s)[:n-3]) + "..."
	} else if more {
		s += " ..."
	}
	return s
}

var deadShowCommand = &command{
	name:    "show",
	args:    "ID",
	summary: "Print one dead letter in full",
	help: `Prints the dead letter with this id: its fields, headers, last error and payload (as
text when it is valid UTF-8, in base64 otherwise).`,
	setup: func(fs *flag.FlagSet) runFunc {
		db := addDBFlags(fs, true)
		asJSON := fs.Bool("json", false, "print JSON, payload in base64")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if len(args) != 1 {
				return usageErrorf("dead show takes one message id, e.g. outbox dead show 0190a5b2-7c1e-7d3f-9a4b-1c2d3e4f5a6b")
			}
			id, err := outbox.ParseID(args[0])
			if err != nil {
				return &usageError{msg: err.Error()}
			}
			drv, err := db.openMigrated(ctx, "outbox dead")
			if err != nil {
				return err
			}
			defer drv.close()
			dls, err := drv.DeadList(ctx, outboxdriver.DeadFilter{IDs: []outbox.ID{id}})
			if err != nil {
				return err
			}
			if len(dls) == 0 {
				return fmt.Errorf("no dead letter has id %s (it may have been replayed or purged; pending and published messages are not dead letters)", id)
			}
			if *asJSON {
				return writeJSON(inv.stdout, toJSON(dls[0]))
			}
			return printDeadLetter(inv.stdout, dls[0])
		}
	},
}

func printDeadLetter(w io.Writer, dl outboxdriver.DeadLetter) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k string, v any) {
		if v == "" {
			v = "(none)"
		}
		fmt.Fprintf(tw, "%s\t%v\n", k, v)
	}
	row("id", dl.ID)
	row("dedup key", quoteIfNeeded(dl.DedupKey))
	row("topic", quoteIfNeeded(dl.Topic))
	row("key", quoteIfNeeded(dl.Key))
	row("aggregate type", quoteIfNeeded(dl.AggregateType))
	row("event type", quoteIfNeeded(dl.EventType))
	row("content type", quoteIfNeeded(dl.ContentType))
	row("seq", dl.Seq)
	row("shard", dl.Shard)
	row("created at", dl.CreatedAt.Local().Format(time.RFC3339Nano))
	row("dead at", dl.DeadAt.Local().Format(time.RFC3339Nano))
	row("attempts", dl.Attempts)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nlast error:\n%s\n", indent(escapeControls(dl.LastError)))
	fmt.Fprintf(w, "\nheaders (%d):\n", len(dl.Headers))
	names := make([]string, 0, len(dl.Headers))
	for k := range dl.Headers {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(w, "  %s: %s\n", k, quoteIfNeeded(dl.Headers[k]))
	}
	if utf8.Valid(dl.Payload) {
		fmt.Fprintf(w, "\npayload (%d bytes, text):\n%s\n", len(dl.Payload), indent(escapeControls(string(dl.Payload))))
	} else {
		fmt.Fprintf(w, "\npayload (%d bytes, base64):\n%s\n", len(dl.Payload), indent(base64.StdEncoding.EncodeToString(dl.Payload)))
	}
	return nil
}

func indent(s string) string {
	if s == "" {
		return "  (none)"
	}
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ")
}

// confirmFlags are --yes and --dry-run of the commands that change dead letters.
type confirmFlags struct{ yes, dryRun bool }

func addConfirmFlags(fs *flag.FlagSet, verb, past string) *confirmFlags {
	o := &confirmFlags{}
	fs.BoolVar(&o.yes, "yes", false, "do it: without --yes the command only says what it would "+verb)
	fs.BoolVar(&o.dryRun, "dry-run", false, "list what would be "+past+" and change nothing")
	return o
}

// changeDead is the shared flow of replay and purge: count, preview, then act only
// with --yes.
func changeDead(ctx context.Context, inv *invocation, drv storeDriver, f outboxdriver.DeadFilter, c *confirmFlags,
	verb, past string, act func() (int, error), after string) error {
	n, err := drv.DeadCount(ctx, f)
	if err != nil {
		return err
	}
	if n == 0 {
		fmt.Fprintf(inv.stdout, "nothing to %s: %s\n", verb, describeNone(f))
		return nil
	}
	if c.dryRun {
		fmt.Fprintf(inv.stdout, "would %s %s:\n\n", verb, f.Describe(n))
		preview := f
		preview.Limit = min(n, 20)
		dls, err := drv.DeadList(ctx, preview)
		if err != nil {
			return err
		}
		if err := printDeadTable(inv.stdout, dls); err != nil {
			return err
		}
		if n > len(dls) {
			fmt.Fprintf(inv.stdout, "... and %d more (outbox dead list shows them all)\n", n-len(dls))
		}
		return nil
	}
	if !c.yes {
		fmt.Fprintf(inv.stdout, "would %s %s\n", verb, f.Describe(n))
		return usageErrorf("add --yes to %s them, or --dry-run to list them", verb)
	}
	done, err := act()
	if err != nil {
		return err
	}
	fmt.Fprintf(inv.stdout, "%s %s%s\n", past, f.Describe(done), after)
	return nil
}

var deadReplayCommand = &command{
	name:    "replay",
	summary: "Publish dead letters again, with their original ids",
	help: `Moves the matching dead letters back to pending, due now with their attempts reset;
a running relay publishes them within its poll interval. Each keeps its id, dedup key
and place in its key's order, so consumers deduplicate a message they already have.
Fix the cause first (the last error says what it was), or they die again.

Without --yes it only says how many it would replay; --dry-run lists them.`,
	setup: func(fs *flag.FlagSet) runFunc {
		db := addDBFlags(fs, true)
		ff := addDeadFilterFlags(fs, 0, "replay at most `n`, newest first; 0 means all that match")
		c := addConfirmFlags(fs, "replay", "replayed")
		return func(ctx context.Context, inv *invocation, args []string) error {
			f, drv, err := ff.open(ctx, db, args)
			if err != nil {
				return err
			}
			defer drv.close()
			return changeDead(ctx, inv, drv, f, c, "replay", "replayed",
				func() (int, error) { return drv.DeadReplay(ctx, f) },
				"; relays publish them again with their original ids")
		}
	},
}

var deadPurgeCommand = &command{
	name:    "purge",
	summary: "Delete dead letters for good",
	help: `Deletes the matching dead letters. It needs a filter, or --all to delete every dead
letter. Pending and published messages are never touched. The dedup keys of purged
messages stay taken until the relay's retention cleanup releases them.

Without --yes it only says how many it would delete; --dry-run lists them.`,
	setup: func(fs *flag.FlagSet) runFunc {
		db := addDBFlags(fs, true)
		ff := addDeadFilterFlags(fs, 0, "delete at most `n`, newest first; 0 means all that match")
		all := fs.Bool("all", false, "delete every dead letter (instead of a filter)")
		c := addConfirmFlags(fs, "purge", "purged")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			f, err := ff.filter()
			if err != nil {
				return err
			}
			switch {
			case *all && (!f.IsEmpty() || f.Limit > 0):
				return usageErrorf("--all deletes every dead letter: leave out the filters, or leave out --all")
			case !*all && f.IsEmpty():
				return usageErrorf("purge needs a filter (--id, --topic, --key, --error, --since, --until), or --all to delete every dead letter")
			}
			drv, err := db.openMigrated(ctx, "outbox dead")
			if err != nil {
				return err
			}
			defer drv.close()
			return changeDead(ctx, inv, drv, f, c, "purge", "purged", func() (int, error) {
				if *all {
					return drv.DeadPurgeAll(ctx)
				}
				return drv.DeadPurge(ctx, f)
			}, "")
		}
	},
}
