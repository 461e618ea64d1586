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

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox/internal/brokers"
	"github.com/outboxkit/outbox/outboxamqp"
)

var rabbitmqDeadCommand = &command{
	name:    "dead",
	summary: "List and replay the messages of a RabbitMQ dead-letter (parking) queue",
	help: `A dead-letter queue holds what consumers gave up on: messages that outboxamqp.Consume
dead-lettered after its attempts (with the handler's error in Outbox-Dead-Reason), and
messages RabbitMQ dead-lettered through a queue's x-dead-letter-exchange (rejected by a
consumer, expired, over the queue's length, over a quorum queue's delivery limit), with
the reason in their x-death header. These commands read them in queue order, oldest
first, and move them back where they were first published.

Reading a queue is taking its messages without acknowledging them and closing the
channel, which returns each to its place: they are marked redelivered, and a quorum
queue counts a delivery for each (give a quorum parking queue no delivery limit).

This is not the outbox's own dead-letter table (outbox dead), where the relay parks
messages the broker refused.`,
	subs: []*command{rabbitmqDeadListCommand, rabbitmqDeadReplayCommand},
}

// rabbitmqConnFlags are the flags that reach RabbitMQ: --broker, the password flags and
// the TLS flags, as in `outbox rabbitmq declare`.
type rabbitmqConnFlags struct {
	url   string
	queue string
	auth  brokers.AMQPAuth
	tls   brokers.TLSFiles
}

func addRabbitMQConnFlags(fs *flag.FlagSet) *rabbitmqConnFlags {
	o := &rabbitmqConnFlags{}
	fs.StringVar(&o.queue, "queue", "", "the dead-letter `queue` (required)")
	fs.StringVar(&o.url, "broker", "amqp://127.0.0.1:5672/", "RabbitMQ `URL` (amqp:// or amqps://). Credentials in it never appear in output")
	o.auth.Flags(fs)
	o.tls.Flags(fs)
	return o
}

// dial checks the flags and connects; the caller closes the connection.
func (o *rabbitmqConnFlags) dial(inv *invocation) (*amqp.Connection, error) {
	if o.queue == "" {
		return nil, usageErrorf("--queue: give the dead-letter queue")
	}
	tls, err := o.tls.Config()
	if err != nil {
		return nil, brokerUsage(err)
	}
	u, err := o.auth.URL(o.url, tls, brokerSecretsOf{inv.secrets})
	if err != nil {
		return nil, brokerUsage(err)
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("outbox-cli")
	cfg := amqp.Config{Heartbeat: 10 * time.Second, Properties: props, Dial: amqp.DefaultDial(30 * time.Second)}
	if tls != nil {
		cfg.TLSClientConfig = tls
	}
	conn, err := amqp.DialConfig(u, cfg)
	if err != nil {
		var ae *amqp.Error
		if !errors.As(err, &ae) {
			err = errors.New(inv.secrets.scrub(err.Error()))
		}
		return nil, fmt.Errorf("connect to RabbitMQ at %s: %w", brokers.Redact(o.url), err)
	}
	return conn, nil
}

// depth returns how many messages are ready in the queue.
func (o *rabbitmqConnFlags) depth(conn *amqp.Connection) (int, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(o.queue, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("queue %q: %w", o.queue, err)
	}
	return q.Messages, nil
}

var rabbitmqDeadListCommand = &command{
	name:    "list",
	summary: "List the messages of a dead-letter queue, oldest first, without removing them",
	help: `Prints, for each message: when and from which queue it was dead-lettered, why (the
handler's error, or RabbitMQ's reason: rejected, expired, maxlen, delivery_limit), the
attempts, its id, and the exchange and routing key it was first published with (where
replay sends it). --json prints everything, x-death entries, headers and payload
(base64) included.`,
	setup: func(fs *flag.FlagSet) runFunc {
		o := addRabbitMQConnFlags(fs)
		limit := fs.Int("limit", listLimitDefault, "show at most `n`, oldest first; 0 shows all")
		asJSON := fs.Bool("json", false, "print a JSON array of dead letters, payloads in base64")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			if *limit < 0 {
				return usageErrorf("--limit: must not be negative (0 means no limit)")
			}
			conn, err := o.dial(inv)
			if err != nil {
				return err
			}
			defer conn.Close()
			dls, err := outboxamqp.ListDead(ctx, conn, o.queue, *limit)
			if err != nil {
				return err
			}
			if *asJSON {
				out := make([]amqpDeadJSON, len(dls))
				for i, dl := range dls {
					out[i] = amqpDeadToJSON(dl)
				}
				return writeJSON(inv.stdout, out)
			}
			if len(dls) == 0 {
				fmt.Fprintf(inv.stdout, "queue %s holds no dead letters\n", o.queue)
				return nil
			}
			if err := printAMQPDeadTable(inv.stdout, dls); err != nil {
				return err
			}
			if *limit > 0 && len(dls) == *limit {
				fmt.Fprintf(inv.stdout, "\nshowing the oldest %d; --limit 0 shows all\n", *limit)
			}
			return nil
		}
	},
}

// amqpDeadJSON is a dead letter in the output of --json.
type amqpDeadJSON struct {
	ID          string            `json:"id"`
	MessageID   string            `json:"message_id"`
	Queue       string            `json:"queue"`
	Reason      string            `json:"reason"`
	Attempts    int               `json:"attempts"`
	DeadAt      *time.Time        `json:"dead_at"`
	Exchange    string            `json:"exchange"`
	RoutingKeys []string          `json:"routing_keys"`
	OriginKnown bool              `json:"origin_known"`
	Deaths      []amqpDeathJSON   `json:"deaths"`
	Headers     map[string]string `json:"headers"`
	ContentType string            `json:"content_type"`
	EventType   string            `json:"event_type"`
	Payload     []byte            `json:"payload"`
}

type amqpDeathJSON struct {
	Queue       string     `json:"queue"`
	Reason      string     `json:"reason"`
	Count       int64      `json:"count"`
	Time        *time.Time `json:"time"`
	Exchange    string     `json:"exchange"`
	RoutingKeys []string   `json:"routing_keys"`
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func amqpDeadToJSON(dl outboxamqp.DeadLetter) amqpDeadJSON {
	out := amqpDeadJSON{
		ID: dl.ID, MessageID: dl.MessageID, Queue: dl.Queue, Reason: dl.Reason, Attempts: dl.Attempts, DeadAt: timeOrNil(dl.DeadAt),
		Exchange: dl.Exchange, RoutingKeys: dl.RoutingKeys, OriginKnown: dl.Known, Deaths: []amqpDeathJSON{}, Headers: dl.Headers,
		ContentType: dl.ContentType, EventType: dl.EventType, Payload: dl.Payload,
	}
	if out.RoutingKeys == nil {
		out.RoutingKeys = []string{}
	}
	for _, d := range dl.Deaths {
		keys := d.RoutingKeys
		if keys == nil {
			keys = []string{}
		}
		out.Deaths = append(out.Deaths, amqpDeathJSON{Queue: d.Queue, Reason: d.Reason, Count: d.Count, Time: timeOrNil(d.Time), Exchange: d.Exchange, RoutingKeys: keys})
	}
	return out
}

func printAMQPDeadTable(w io.Writer, dls []outboxamqp.DeadLetter) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DEAD AT\tFROM QUEUE\tREASON\tATTEMPTS\tID\tEXCHANGE\tROUTING KEY")
	for _, dl := range dls {
		at, from, exchange, key := "?", cmp.Or(dl.Queue, "?"), "?", "?"
		if !dl.DeadAt.IsZero() {
			at = dl.DeadAt.Local().Format(time.DateTime)
		}
		if dl.Known {
			exchange, key = cmp.Or(dl.Exchange, "(default)"), strings.Join(dl.RoutingKeys, ",")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", at, quoteIfNeeded(from), oneLine(cmp.Or(dl.Reason, "?"), 60), dl.Attempts,
			quoteIfNeeded(dl.ID), quoteIfNeeded(exchange), quoteIfNeeded(key))
	}
	return tw.Flush()
}

var rabbitmqDeadReplayCommand = &command{
	name:    "replay",
	summary: "Move dead letters back to the exchange and routing key they were first published with",
	help: `Moves the messages of the dead-letter queue, oldest first, in batches of 100, back to the
exchange and routing key they were first published with (every queue bound to that key
gets the message again: consumers with an inbox skip what they handled), or with
--to-queue straight to the queue they were dead-lettered from. Each new copy is
published with publisher confirms before the parked one is removed: a message is never
lost, and a crash in between replays it twice at worst. The x-death and Outbox-Dead-*
headers are dropped, so consumers count their attempts afresh; the message id and
Outbox-Id stay. Messages that do not say where they came from, or that no longer route,
stay in the queue and are reported. Fix the cause first, or they die again.

Without --yes it only says how many it would replay; --dry-run lists them.`,
	setup: func(fs *flag.FlagSet) runFunc {
		o := addRabbitMQConnFlags(fs)
		limit := fs.Int("limit", 0, "replay at most `n`, oldest first; 0 means every message in the queue when the command starts")
		toQueue := fs.Bool("to-queue", false, "send each message to the queue it was dead-lettered from (through the default exchange), not to its original exchange")
		c := addConfirmFlags(fs, "replay", "replayed")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			if *limit < 0 {
				return usageErrorf("--limit: must not be negative (0 means all)")
			}
			conn, err := o.dial(inv)
			if err != nil {
				return err
			}
			defer conn.Close()
			n, err := o.depth(conn)
			if err != nil {
				return err
			}
			if n == 0 {
				fmt.Fprintf(inv.stdout, "nothing to replay: queue %s is empty\n", o.queue)
				return nil
			}
			if *limit > 0 {
				n = min(n, *limit)
			}
			where := "to the exchanges and routing keys they were first published with"
			if *toQueue {
				where = "to the queues they were dead-lettered from"
			}
			what := fmt.Sprintf("%s of queue %s", plural(n, "dead letter"), o.queue)
			if *limit == 0 || n < *limit {
				what = "all " + what
				if n == 1 {
					what = "the only dead letter of queue " + o.queue
				}
			} else {
				what = "the oldest " + what
			}
			opts := outboxamqp.ReplayOptions{Limit: n, ToQueue: *toQueue}
			if c.dryRun {
				opts.DryRun = true
				dls, err := outboxamqp.ReplayDead(ctx, conn, o.queue, opts)
				fmt.Fprintf(inv.stdout, "would replay %s %s:\n\n", plural(len(dls), "dead letter"), where)
				shown := dls[:min(len(dls), 20)]
				if len(shown) > 0 {
					if perr := printAMQPDeadTable(inv.stdout, shown); perr != nil {
						return perr
					}
				}
				if len(dls) > len(shown) {
					fmt.Fprintf(inv.stdout, "... and %d more (outbox rabbitmq dead list shows them all)\n", len(dls)-len(shown))
				}
				if err != nil {
					fmt.Fprintf(inv.stdout, "\nsome would stay in the queue: %v\n", err)
				}
				return nil
			}
			if !c.yes {
				fmt.Fprintf(inv.stdout, "would replay %s %s\n", what, where)
				return usageErrorf("add --yes to replay them, or --dry-run to list them")
			}
			dls, err := outboxamqp.ReplayDead(ctx, conn, o.queue, opts)
			fmt.Fprintf(inv.stdout, "replayed %s of queue %s %s\n", plural(len(dls), "dead letter"), o.queue, where)
			return err
		}
	},
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
