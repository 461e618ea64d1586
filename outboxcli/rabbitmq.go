package outboxcli

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/outboxkit/outbox/internal/brokers"
	"github.com/outboxkit/outbox/outboxamqp"
)

var rabbitmqCommand = &command{
	name:    "rabbitmq",
	summary: "Operate RabbitMQ: declare topology, list and replay dead letters",
	subs:    []*command{rabbitmqDeclareCommand, rabbitmqDeadCommand},
}

var rabbitmqDeclareCommand = &command{
	name:    "declare",
	summary: "Declare the exchanges, queues and bindings of a topology file",
	help: `Declares, in order, the exchanges, queues and bindings of a topology file (YAML or
JSON; deploy/rabbitmq/topology.yaml is an example with critical and background queues,
an alternate exchange for unroutable events and a dead-letter exchange). It is
idempotent: what exists with the same settings is left alone, so run it at every
deploy. An object that exists with other settings is an error naming it (RabbitMQ cannot
change a queue's arguments in place), and nothing is ever deleted or unbound.

The file has three lists:
  exchanges: name, type (direct, fanout, topic: the default, headers), durable (default
             true), auto-delete, internal, alternate-exchange, arguments
  queues:    name, type (classic: the default, quorum), durable (default true), lazy,
             message-ttl (a duration: 60s), max-length, max-length-bytes, overflow
             (drop-head, reject-publish, reject-publish-dlx), max-priority,
             dead-letter-exchange, dead-letter-routing-key, arguments
  bindings:  exchange, queue, routing-key, arguments`,
	setup: func(fs *flag.FlagSet) runFunc {
		var file, brokerURL string
		fs.StringVar(&file, "file", "", "topology `file` to declare (YAML or JSON)")
		fs.StringVar(&file, "f", "", "the same as --file `file`")
		fs.StringVar(&brokerURL, "broker", "amqp://127.0.0.1:5672/", "RabbitMQ `URL` (amqp:// or amqps://). Credentials in it never appear in output")
		var auth brokers.AMQPAuth
		auth.Flags(fs)
		var tlsFiles brokers.TLSFiles
		tlsFiles.Flags(fs)
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			if file == "" {
				return usageErrorf("--file: give the topology file to declare")
			}
			top, err := brokers.LoadTopology("file", file)
			if err != nil {
				return brokerUsage(err)
			}
			tls, err := tlsFiles.Config()
			if err != nil {
				return brokerUsage(err)
			}
			u, err := auth.URL(brokerURL, tls, brokerSecretsOf{inv.secrets})
			if err != nil {
				return brokerUsage(err)
			}
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			pub, err := outboxamqp.Dial(ctx, u, outboxamqp.Config{TLS: tls})
			if err != nil {
				return err
			}
			defer pub.Close()
			if err := pub.Declare(ctx, top); err != nil {
				return err
			}
			fmt.Fprintf(inv.stdout, "declared %d exchanges, %d queues and %d bindings of %s on %s\n",
				len(top.Exchanges), len(top.Queues), len(top.Bindings), file, brokers.Redact(brokerURL))
			return nil
		}
	},
}
