package brokers

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxkinesis"
)

// Kinesis is Amazon Kinesis Data Streams, through outboxkinesis. Its URL is
// "kinesis://" with region, endpoint and profile query parameters; credentials come
// from the AWS SDK's chain.
var Kinesis = register(&Broker{
	Name:    "Amazon Kinesis Data Streams",
	Label:   "kinesis",
	Schemes: []string{"kinesis"},
	Example: "kinesis://?region=eu-west-1",
	settings: func(fs *flag.FlagSet) options {
		o := &kinesisOptions{}
		fs.StringVar(&o.endpoint, "kinesis-endpoint", "", "Kinesis endpoint `URL` for an emulator or a VPC endpoint (http://127.0.0.1:4567); default:\nthe region's. Credentials come from the AWS SDK's chain")
		fs.IntVar(&o.cfg.MaxRecordBytes, "kinesis-max-record-bytes", outboxkinesis.MaxRecordBytesDefault, "largest record in `bytes` (data and partition key); larger messages are dead-lettered")
		fs.IntVar(&o.cfg.MaxInflight, "kinesis-max-inflight", outboxkinesis.MaxInflightDefault, "at most `n` PutRecords calls in flight at once")
		return o
	},
})

// kinesisOptions are the Kinesis settings; --kinesis-endpoint sets the URL's endpoint
// parameter.
type kinesisOptions struct {
	cfg      outboxkinesis.Config
	endpoint string

	url string // the URL with --kinesis-endpoint applied
}

// kinesisConfigSettings names the setting of each outboxkinesis.Config field.
var kinesisConfigSettings = map[string]string{"Route": "route", "MaxRecordBytes": "kinesis-max-record-bytes",
	"MaxInflight": "kinesis-max-inflight", "url": "broker"}

func (o *kinesisOptions) check(d *dest) error {
	o.cfg.Route = d.Route
	if err := o.cfg.Validate(); err != nil {
		return configError(err, kinesisConfigSettings)
	}
	if _, _, _, err := outboxkinesis.ParseURL(d.url); err != nil {
		return configError(err, kinesisConfigSettings)
	}
	var err error
	o.url, err = withEndpoint(d.url, o.endpoint, "kinesis")
	return err
}

func (o *kinesisOptions) open(ctx context.Context, d *dest) (*Opened, error) {
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	pub, err := outboxkinesis.Dial(dctx, o.url, o.cfg, config.WithLogger(awsLog{log: d.log()}))
	if err != nil {
		if errors.Is(err, outbox.ErrInvalidConfig) {
			return nil, configError(err, kinesisConfigSettings)
		}
		return nil, err
	}
	return &Opened{Publisher: pub, Close: pub.Close, CheckTopics: func(ctx context.Context, log *slog.Logger, topics []string) {
		if _, static := outbox.MustParseRoute(d.Route).Static(); static && len(topics) > 1 {
			topics = topics[:1] // every topic goes to the same stream
		}
		for _, topic := range topics {
			err := pub.CheckStream(ctx, &outbox.Message{Topic: topic})
			switch {
			case err == nil, errors.Is(err, outbox.ErrUnroutable):
			case errors.Is(err, outboxkinesis.ErrNoStream):
				log.Warn("pending messages cannot be sent: the relay pauses on them until their stream exists", "topic", topic, "err", err)
			default:
				log.Warn("the stream of pending messages cannot be checked", "topic", topic, "err", err)
			}
		}
	}}, nil
}
