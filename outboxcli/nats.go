package outboxcli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox/internal/brokers"
	"github.com/outboxkit/outbox/outboxnats"
)

var natsCommand = &command{
	name:    "nats",
	summary: "NATS JetStream tools: the consumers' dead-letter stream",
	subs:    []*command{natsDeadCommand},
}

var natsDeadCommand = &command{
	name:    "dead",
	summary: "List or replay messages consumers dead-lettered to a stream",
	help: `outboxnats.Consume copies a message it gives up on to its DeadLetterSubject, with the
reason, the stream and subject it came from, and the attempts, before terminating it.
These commands read the stream that captures that subject (--stream), and replay
messages to the subjects they came from once the cause is fixed.`,
	subs: []*command{natsDeadListCommand, natsDeadReplayCommand},
}

// natsFlags connect the nats commands to a server.
type natsFlags struct{ url, creds string }

func addNATSFlags(fs *flag.FlagSet) *natsFlags {
	o := &natsFlags{}
	fs.StringVar(&o.url, "broker", brokerDefault, "NATS `URL` (several separated by commas). Credentials in it never appear in output.")
	fs.StringVar(&o.creds, "nats-creds", "", "NATS credentials `file` (JWT and NKey seed)")
	return o
}

func (o *natsFlags) connect(ctx context.Context) (jetstream.JetStream, func(), error) {
	opts := []nats.Option{nats.Name("outbox-cli"), nats.Timeout(10 * time.Second)}
	if o.creds != "" {
		opts = append(opts, nats.UserCredentials(o.creds))
	}
	nc, err := nats.Connect(o.url, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS at %s: %w", brokers.Redact(o.url), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return js, nc.Close, nil
}

func needStream(stream string) error {
	if stream == "" {
		return usageErrorf("--stream: name the dead-letter stream")
	}
	return nil
}

var natsDeadListCommand = &command{
	name:    "list",
	summary: "List dead letters, oldest first",
	setup: func(fs *flag.FlagSet) runFunc {
		n := addNATSFlags(fs)
		stream := fs.String("stream", "", "the dead-letter `stream`")
		limit := fs.Int("limit", 50, "show at most `n`; 0 means all")
		asJSON := fs.Bool("json", false, "print JSON, one object per dead letter, payload base64")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			if err := needStream(*stream); err != nil {
				return err
			}
			if *limit < 0 {
				return usageErrorf("--limit: must not be negative (0 means all)")
			}
			js, closeConn, err := n.connect(ctx)
			if err != nil {
				return err
			}
			defer closeConn()
			dead, err := outboxnats.ListDead(ctx, js, *stream, *limit)
			if err != nil {
				return err
			}
			if *asJSON {
				enc := json.NewEncoder(inv.stdout)
				for _, d := range dead {
					if err := enc.Encode(natsDeadJSON(d)); err != nil {
						return err
					}
				}
				return nil
			}
			if len(dead) == 0 {
				fmt.Fprintf(inv.stdout, "stream %s holds no dead letters\n", *stream)
				return nil
			}
			return printNATSDead(inv.stdout, dead)
		}
	},
}

func natsDeadJSON(d outboxnats.DeadLetter) map[string]any {
	headers := map[string]string{}
	for k := range d.Headers {
		headers[k] = d.Headers.Get(k)
	}
	return map[string]any{"seq": d.Seq, "dead_at": d.Time, "id": d.ID, "subject": d.Subject, "stream": d.Stream,
		"reason": d.Reason, "attempts": d.Attempts, "headers": headers, "payload": d.Payload}
}

func printNATSDead(w io.Writer, dead []outboxnats.DeadLetter) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tDEAD AT\tSUBJECT\tATTEMPTS\tID\tREASON")
	for _, d := range dead {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\n", d.Seq, d.Time.UTC().Format(time.RFC3339), d.Subject, d.Attempts, d.ID, oneLine(d.Reason, 80))
	}
	return tw.Flush()
}

var natsDeadReplayCommand = &command{
	name:    "replay",
	summary: "Publish dead letters again to the subjects they came from",
	help: `Publishes the chosen dead letters (--seq, or the oldest --limit, or all) to the
subjects they were consumed from, with their original headers and payload, and deletes
each from the dead-letter stream once JetStream stored its copy. Consumers with an inbox
skip one they handled before. Fix the cause first, or they die again.

Without --yes it only says how many it would replay; --dry-run lists them.`,
	setup: func(fs *flag.FlagSet) runFunc {
		n := addNATSFlags(fs)
		stream := fs.String("stream", "", "the dead-letter `stream`")
		var seqs stringList
		fs.Var(&seqs, "seq", "replay the dead letter with this stream `sequence` (repeatable)")
		limit := fs.Int("limit", 0, "replay at most `n`, oldest first; 0 means all (ignored with --seq)")
		c := addConfirmFlags(fs, "replay", "replayed")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			if err := needStream(*stream); err != nil {
				return err
			}
			want := map[uint64]bool{}
			for _, s := range seqs {
				v, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
				if err != nil || v == 0 {
					return usageErrorf("--seq: %q is not a stream sequence", s)
				}
				want[v] = true
			}
			if *limit < 0 {
				return usageErrorf("--limit: must not be negative (0 means all)")
			}
			js, closeConn, err := n.connect(ctx)
			if err != nil {
				return err
			}
			defer closeConn()
			all, err := outboxnats.ListDead(ctx, js, *stream, 0)
			if err != nil {
				return err
			}
			var chosen []outboxnats.DeadLetter
			for _, d := range all {
				if len(want) > 0 && !want[d.Seq] || len(want) == 0 && *limit > 0 && len(chosen) == *limit {
					continue
				}
				chosen = append(chosen, d)
			}
			if len(chosen) == 0 {
				fmt.Fprintf(inv.stdout, "nothing to replay: stream %s holds no matching dead letters\n", *stream)
				return nil
			}
			if c.dryRun {
				fmt.Fprintf(inv.stdout, "would replay %d dead letters:\n\n", len(chosen))
				return printNATSDead(inv.stdout, chosen)
			}
			if !c.yes {
				fmt.Fprintf(inv.stdout, "would replay %d dead letters\n", len(chosen))
				return usageErrorf("add --yes to replay them, or --dry-run to list them")
			}
			picked := make([]uint64, len(chosen))
			for i, d := range chosen {
				picked[i] = d.Seq
			}
			done, err := outboxnats.ReplayDead(ctx, js, *stream, picked)
			fmt.Fprintf(inv.stdout, "replayed %d of %d dead letters\n", done, len(chosen))
			return err
		}
	},
}
