package brokers

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"log/slog"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxkafka"
)

// Kafka is Apache Kafka, through outboxkafka. Its URL lists seed brokers:
// kafka://k1:9092,k2:9092.
var Kafka = register(&Broker{
	Name:    "Kafka",
	Label:   "kafka",
	Schemes: []string{"kafka"},
	Example: "kafka://127.0.0.1:9092",

	CloudEventsPrefix: outboxkafka.CloudEventsPrefix,
	settings: func(fs *flag.FlagSet) options {
		o := &kafkaOptions{}
		fs.StringVar(&o.compression, "kafka-compression", outboxkafka.CompressionDefault, "Kafka record batch `codec`: none, gzip, snappy, lz4 or zstd")
		fs.IntVar(&o.maxMessageBytes, "kafka-max-message-bytes", outboxkafka.MaxMessageBytesDefault, "largest record batch in `bytes`; larger messages are rejected unsent.\nKeep it at or under the max.message.bytes of every topic")
		fs.BoolVar(&o.tls, "kafka-tls", false, "connect to Kafka with TLS, with the system's CAs (implied by --broker-tls-*)")
		fs.StringVar(&o.mechanism, "kafka-sasl-mechanism", "", "Kafka SASL `mechanism`: plain, scram-sha-256 or scram-sha-512 (default: no SASL)")
		fs.StringVar(&o.user, "kafka-sasl-user", "", "Kafka SASL user `name`")
		fs.StringVar(&o.password, "kafka-sasl-password", "", "Kafka SASL `password`")
		fs.StringVar(&o.passwordFile, "kafka-sasl-password-file", "", "`file` holding the Kafka SASL password (like --kafka-sasl-password)")
		fs.BoolVar(&o.autoCreate, "kafka-auto-create-topics", false, "ask the brokers to create missing topics (only brokers with auto.create.topics.enable do)")
		return o
	},
})

type kafkaOptions struct {
	compression     string
	maxMessageBytes int
	tls             bool
	mechanism       string
	user            string
	password        string
	passwordFile    string
	autoCreate      bool

	seeds []string       // from the URL
	sasl  sasl.Mechanism // from the SASL settings
}

func (o *kafkaOptions) check(d *dest) error {
	var err error
	if o.seeds, err = outboxkafka.Seeds(d.url); err != nil {
		return settingErrorf("--broker: %v", strings.TrimPrefix(err.Error(), "outboxkafka: "))
	}
	password := o.password
	switch {
	case o.password != "" && o.passwordFile != "":
		return settingErrorf("--kafka-sasl-password and --kafka-sasl-password-file: give one")
	case o.passwordFile != "":
		if password, err = readSecretFile(d.Secrets, "kafka-sasl-password-file", o.passwordFile); err != nil {
			return err
		}
	}
	if o.mechanism == "" {
		if o.user != "" || password != "" {
			return settingErrorf("--kafka-sasl-user and --kafka-sasl-password: give --kafka-sasl-mechanism too")
		}
		return nil
	}
	if o.user == "" || password == "" {
		return settingErrorf("--kafka-sasl-mechanism: give --kafka-sasl-user and --kafka-sasl-password (or -file)")
	}
	switch o.mechanism {
	case "plain":
		o.sasl = plain.Auth{User: o.user, Pass: password}.AsMechanism()
	case "scram-sha-256":
		o.sasl = scram.Auth{User: o.user, Pass: password}.AsSha256Mechanism()
	case "scram-sha-512":
		o.sasl = scram.Auth{User: o.user, Pass: password}.AsSha512Mechanism()
	default:
		return settingErrorf("--kafka-sasl-mechanism: %q is not one of plain, scram-sha-256, scram-sha-512", o.mechanism)
	}
	return nil
}

func (o *kafkaOptions) open(ctx context.Context, d *dest) (*Opened, error) {
	cfg := outboxkafka.Config{
		Route:           d.Route,
		Compression:     o.compression,
		MaxMessageBytes: o.maxMessageBytes,
		TLS:             d.TLS,
		SASL:            o.sasl,
	}
	if o.tls && cfg.TLS == nil {
		cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	var opts []kgo.Opt
	if o.autoCreate {
		opts = append(opts, kgo.AllowAutoTopicCreation())
	}
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	pub, err := outboxkafka.Dial(dctx, o.seeds, cfg, opts...)
	if err != nil {
		if errors.Is(err, outbox.ErrInvalidConfig) {
			return nil, configError(err, map[string]string{"Route": "route", "Compression": "kafka-compression",
				"MaxMessageBytes": "kafka-max-message-bytes"})
		}
		return nil, err
	}
	opened := &Opened{Publisher: pub, Close: pub.Close}
	if !o.autoCreate {
		opened.CheckTopics = func(ctx context.Context, log *slog.Logger, topics []string) {
			for _, topic := range topics {
				r, err := pub.Record(&outbox.Message{Topic: topic})
				if err != nil {
					continue // the route needs more than the topic, or gives an invalid name: checked per message
				}
				if err := pub.CheckTopic(ctx, r.Topic); err != nil {
					log.Warn("pending messages cannot be stored: the relay pauses on them until the Kafka topic exists",
						"topic", topic, "kafka_topic", r.Topic, "err", err)
				}
			}
		}
	}
	return opened, nil
}
