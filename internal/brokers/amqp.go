package brokers

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxamqp"
)

// RabbitMQ is RabbitMQ over AMQP 0-9-1, through outboxamqp.
var RabbitMQ = register(&Broker{
	Name:    "RabbitMQ",
	Label:   "amqp",
	Schemes: []string{"amqp", "amqps"},
	Example: "amqp://user@127.0.0.1:5672/vhost",

	CloudEventsPrefix: outboxamqp.CloudEventsPrefix,
	settings: func(fs *flag.FlagSet) options {
		o := &amqpOptions{}
		fs.StringVar(&o.exchange, "rabbitmq-exchange", "", "RabbitMQ `exchange` to publish to, with the route as routing key\n(default: the default exchange, which delivers to the queue named by the routing key)")
		fs.IntVar(&o.maxChannels, "rabbitmq-max-channels", outboxamqp.MaxChannelsDefault, "RabbitMQ channels to publish on at most, one per concurrent publish call")
		fs.IntVar(&o.maxMessageSize, "rabbitmq-max-message-size", outboxamqp.MaxMessageSizeDefault, "largest message body in `bytes`; larger ones are rejected unsent.\nKeep it at or under the server's max_message_size")
		fs.StringVar(&o.declare, "rabbitmq-declare", "", "declare this topology `file` (YAML or JSON, see outbox rabbitmq declare) before relaying")
		o.auth.Flags(fs)
		return o
	},
})

type amqpOptions struct {
	exchange       string
	maxChannels    int
	maxMessageSize int
	declare        string
	auth           AMQPAuth

	url      string               // the URL with the password settings applied
	topology *outboxamqp.Topology // read from --rabbitmq-declare
}

// AMQPAuth are the settings that give the RabbitMQ password outside the URL, shared by
// the RabbitMQ publisher and the CLI's RabbitMQ tools. Like flags, it is set while the
// command line is parsed, then only read.
type AMQPAuth struct {
	password, passwordFile string
}

// Flags registers the password settings on fs.
func (a *AMQPAuth) Flags(fs *flag.FlagSet) {
	fs.StringVar(&a.password, "rabbitmq-password", "", "RabbitMQ `password` for the user of --broker, instead of one in the URL")
	fs.StringVar(&a.passwordFile, "rabbitmq-password-file", "", "`file` holding the RabbitMQ password (like --rabbitmq-password)")
}

// URL returns brokerURL with the password of the settings in it, and checks that a TLS
// configuration comes with an amqps:// URL. The password and the URL holding it are
// registered with secrets, which may be nil.
func (a *AMQPAuth) URL(brokerURL string, tlsConfig *tls.Config, secrets Secrets) (string, error) {
	if tlsConfig != nil && !strings.HasPrefix(brokerURL, "amqps://") {
		return "", settingErrorf("--broker-tls-*: TLS needs an amqps:// --broker URL, not %s", Redact(brokerURL))
	}
	password := a.password
	switch {
	case a.password != "" && a.passwordFile != "":
		return "", settingErrorf("--rabbitmq-password and --rabbitmq-password-file: give one")
	case a.passwordFile != "":
		var err error
		if password, err = readSecretFile(secrets, "rabbitmq-password-file", a.passwordFile); err != nil {
			return "", err
		}
	case password == "":
		return brokerURL, nil
	}
	u, err := url.Parse(brokerURL)
	if err != nil || u.User == nil || u.User.Username() == "" {
		return "", settingErrorf("--rabbitmq-password: --broker needs the user name (amqp://USER@host:5672/vhost)")
	}
	u.User = url.UserPassword(u.User.Username(), password)
	secretURL(secrets, u.String()) // the password is in the user information now
	return u.String(), nil
}

func (o *amqpOptions) check(d *dest) error {
	switch {
	case o.maxChannels < 1:
		return settingErrorf("--rabbitmq-max-channels: must be positive")
	case o.maxMessageSize < 1:
		return settingErrorf("--rabbitmq-max-message-size: must be positive")
	}
	var err error
	if o.url, err = o.auth.URL(d.url, d.TLS, d.Secrets); err != nil {
		return err
	}
	if o.declare != "" {
		if o.topology, err = LoadTopology("rabbitmq-declare", o.declare); err != nil {
			return err
		}
	}
	return nil
}

func (o *amqpOptions) open(ctx context.Context, d *dest) (*Opened, error) {
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	pub, err := outboxamqp.Dial(dctx, o.url, outboxamqp.Config{
		Exchange:       o.exchange,
		Route:          d.Route,
		MaxChannels:    o.maxChannels,
		MaxMessageSize: o.maxMessageSize,
		TLS:            d.TLS,
	})
	if err != nil {
		if errors.Is(err, outbox.ErrInvalidConfig) {
			return nil, configError(err, map[string]string{"Route": "route", "Exchange": "rabbitmq-exchange",
				"MaxChannels": "rabbitmq-max-channels", "MaxMessageSize": "rabbitmq-max-message-size"})
		}
		return nil, err
	}
	if o.topology != nil {
		if err := pub.Declare(dctx, o.topology); err != nil {
			pub.Close()
			return nil, err
		}
		d.log().Info("RabbitMQ topology declared", "file", o.declare)
	}
	if err := pub.Ping(dctx); err != nil {
		pub.Close()
		return nil, err
	}
	return &Opened{
		Publisher:   pub,
		Close:       pub.Close,
		CheckTopics: checkTopics(pub.CheckRoute, "pending messages may be returned unroutable: the relay retries them, then dead-letters them"),
	}, nil
}

// LoadTopology reads and checks a topology file; its errors are *SettingError naming
// the setting.
func LoadTopology(setting, path string) (*outboxamqp.Topology, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, settingErrorf("--%s: %v", setting, err)
	}
	// JSON is YAML, so one decoder reads both; unknown keys are typos, not silence.
	var top outboxamqp.Topology
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&top); err != nil && !errors.Is(err, io.EOF) {
		return nil, settingErrorf("--%s: %s: %v", setting, path, err)
	}
	if len(top.Exchanges)+len(top.Queues)+len(top.Bindings) == 0 {
		return nil, settingErrorf("--%s: %s declares nothing: want exchanges, queues or bindings", setting, path)
	}
	if err := top.Validate(); err != nil {
		return nil, settingErrorf("--%s: %s: %v", setting, path, err)
	}
	return &top, nil
}
