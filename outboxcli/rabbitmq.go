package outboxcli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"gopkg.in/yaml.v3"

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
		var auth amqpAuth
		auth.add(fs)
		var b brokerFlags
		fs.StringVar(&b.tlsCA, "broker-tls-ca", "", "PEM `file` of the CA certificates that sign the broker's certificate (default: the system's)")
		fs.StringVar(&b.tlsCert, "broker-tls-cert", "", "PEM `file` of a client certificate for the broker (with --broker-tls-key)")
		fs.StringVar(&b.tlsKey, "broker-tls-key", "", "PEM `file` of the client certificate's private key")
		fs.StringVar(&b.tlsServerName, "broker-tls-server-name", "", "`name` to verify the broker's certificate against, when it differs from the URL's host")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			if file == "" {
				return usageErrorf("--file: give the topology file to declare")
			}
			top, err := loadTopology("file", file)
			if err != nil {
				return err
			}
			s := &brokerSettings{url: brokerURL, secrets: inv.secrets}
			if s.tls, err = b.tlsConfig(); err != nil {
				return err
			}
			u, err := auth.url(s)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			pub, err := outboxamqp.Dial(ctx, u, outboxamqp.Config{TLS: s.tls})
			if err != nil {
				return err
			}
			defer pub.Close()
			if err := pub.Declare(ctx, top); err != nil {
				return err
			}
			fmt.Fprintf(inv.stdout, "declared %d exchanges, %d queues and %d bindings of %s on %s\n",
				len(top.Exchanges), len(top.Queues), len(top.Bindings), file, redactBroker(brokerURL))
			return nil
		}
	},
}

// loadTopology reads and checks a topology file; its errors are usage errors naming
// flagName.
func loadTopology(flagName, path string) (*outboxamqp.Topology, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, usageErrorf("--%s: %v", flagName, err)
	}
	// JSON is YAML, so one decoder reads both; unknown keys are typos, not silence.
	var top outboxamqp.Topology
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&top); err != nil && !errors.Is(err, io.EOF) {
		return nil, usageErrorf("--%s: %s: %v", flagName, path, err)
	}
	if len(top.Exchanges)+len(top.Queues)+len(top.Bindings) == 0 {
		return nil, usageErrorf("--%s: %s declares nothing: want exchanges, queues or bindings", flagName, path)
	}
	if err := top.Validate(); err != nil {
		return nil, usageErrorf("--%s: %s: %v", flagName, path, err)
	}
	return &top, nil
}
