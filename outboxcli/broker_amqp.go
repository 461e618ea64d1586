package outboxcli

import (
	"context"
	"errors"
	"flag"
	"net/url"
	"strings"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxamqp"
)

func init() {
	registerBroker(&brokerKind{
		name:    "RabbitMQ",
		schemes: []string{"amqp", "amqps"},
		example: "amqp://user@127.0.0.1:5672/vhost",
		flags: func(fs *flag.FlagSet) brokerOptions {
			o := &amqpOptions{}
			fs.StringVar(&o.exchange, "rabbitmq-exchange", "", "RabbitMQ `exchange` to publish to, with the route as routing key\n(default: the default exchange, which delivers to the queue named by the routing key)")
			fs.IntVar(&o.maxChannels, "rabbitmq-max-channels", outboxamqp.MaxChannelsDefault, "RabbitMQ channels to publish on at most, one per concurrent publish call")
			fs.IntVar(&o.maxMessageSize, "rabbitmq-max-message-size", outboxamqp.MaxMessageSizeDefault, "largest message body in `bytes`; larger ones are rejected unsent.\nKeep it at or under the server's max_message_size")
			fs.StringVar(&o.declare, "rabbitmq-declare", "", "declare this topology `file` (YAML or JSON, see outbox rabbitmq declare) before relaying")
			o.auth.add(fs)
			return o
		},
	})
}

type amqpOptions struct {
	exchange       string
	maxChannels    int
	maxMessageSize int
	declare        string
	auth           amqpAuth

	url      string               // --broker with the password flags applied
	topology *outboxamqp.Topology // read from --rabbitmq-declare
}

// amqpAuth are the flags that give the password outside the URL, shared by the relay and
// `outbox rabbitmq declare`.
type amqpAuth struct {
	password, passwordFile string
}

func (a *amqpAuth) add(fs *flag.FlagSet) {
	fs.StringVar(&a.password, "rabbitmq-password", "", "RabbitMQ `password` for the user of --broker, instead of one in the URL")
	fs.StringVar(&a.passwordFile, "rabbitmq-password-file", "", "`file` holding the RabbitMQ password (like --rabbitmq-password)")
}

// url returns --broker with the password of the flags in it, and checks that TLS flags
// come with an amqps:// URL.
func (a *amqpAuth) url(s *brokerSettings) (string, error) {
	if s.tls != nil && !strings.HasPrefix(s.url, "amqps://") {
		return "", usageErrorf("--broker-tls-*: TLS needs an amqps:// --broker URL, not %s", redactBroker(s.url))
	}
	password := a.password
	switch {
	case a.password != "" && a.passwordFile != "":
		return "", usageErrorf("--rabbitmq-password and --rabbitmq-password-file: give one")
	case a.passwordFile != "":
		var err error
		if password, err = readSecretFile(s, "rabbitmq-password-file", a.passwordFile); err != nil {
			return "", err
		}
	case password == "":
		return s.url, nil
	}
	u, err := url.Parse(s.url)
	if err != nil || u.User == nil || u.User.Username() == "" {
		return "", usageErrorf("--rabbitmq-password: --broker needs the user name (amqp://USER@host:5672/vhost)")
	}
	u.User = url.UserPassword(u.User.Username(), password)
	s.secrets.addBroker(u.String()) // the password is in the user information now
	return u.String(), nil
}

func (o *amqpOptions) check(s *brokerSettings) error {
	switch {
	case o.maxChannels < 1:
		return usageErrorf("--rabbitmq-max-channels: must be positive")
	case o.maxMessageSize < 1:
		return usageErrorf("--rabbitmq-max-message-size: must be positive")
	}
	var err error
	if o.url, err = o.auth.url(s); err != nil {
		return err
	}
	if o.declare != "" {
		if o.topology, err = loadTopology("rabbitmq-declare", o.declare); err != nil {
			return err
		}
	}
	return nil
}

func (o *amqpOptions) open(ctx context.Context, s *brokerSettings) (*openedBroker, error) {
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	pub, err := outboxamqp.Dial(dctx, o.url, outboxamqp.Config{
		Exchange:       o.exchange,
		Route:          s.route,
		MaxChannels:    o.maxChannels,
		MaxMessageSize: o.maxMessageSize,
		TLS:            s.tls,
	})
	if err != nil {
		if errors.Is(err, outbox.ErrInvalidConfig) {
			return nil, flagError(err, map[string]string{"Route": "route", "Exchange": "rabbitmq-exchange",
				"MaxChannels": "rabbitmq-max-channels", "MaxMessageSize": "rabbitmq-max-message-size"})
		}
		return nil, err
	}
	if o.topology != nil {
		if err := pub.Declare(dctx, o.topology); err != nil {
			pub.Close()
			return nil, err
		}
		s.log.Info("RabbitMQ topology declared", "file", o.declare)
	}
	if err := pub.Ping(dctx); err != nil {
		pub.Close()
		return nil, err
	}
	return &openedBroker{
		publisher: pub,
		close:     pub.Close,
		check:     checkTopics(pub.CheckRoute, "pending messages may be returned unroutable: the relay retries them, then dead-letters them"),
	}, nil
}
