package brokers

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxsns"
)

// SNS is Amazon SNS, through outboxsns. Its URL is "sns://" with region, endpoint and
// profile query parameters; credentials come from the AWS SDK's chain.
var SNS = register(&Broker{
	Name:    "Amazon SNS",
	Label:   "sns",
	Schemes: []string{"sns"},
	Example: "sns://?region=eu-west-1",
	settings: func(fs *flag.FlagSet) options {
		o := &snsOptions{}
		fs.StringVar(&o.endpoint, "sns-endpoint", "", "SNS endpoint `URL` for an emulator or a VPC endpoint (http://127.0.0.1:4566); default: the\nregion's. Credentials come from the AWS SDK's chain")
		fs.IntVar(&o.cfg.MaxMessageBytes, "sns-max-message-bytes", outboxsns.MaxMessageBytesDefault, "largest message in `bytes`, with its attributes, and largest PublishBatch call;\nlarger messages are dead-lettered")
		fs.IntVar(&o.cfg.MaxInflight, "sns-max-inflight", outboxsns.MaxInflightDefault, "at most `n` PublishBatch calls in flight at once")
		return o
	},
})

// snsOptions are the SNS settings; --sns-endpoint sets the URL's endpoint parameter.
type snsOptions struct {
	cfg      outboxsns.Config
	endpoint string

	url string // the URL with --sns-endpoint applied
}

// snsConfigSettings names the setting of each outboxsns.Config field.
var snsConfigSettings = map[string]string{"Route": "route", "MaxMessageBytes": "sns-max-message-bytes",
	"MaxInflight": "sns-max-inflight", "url": "broker"}

func (o *snsOptions) check(d *dest) error {
	o.cfg.Route = d.Route
	if err := o.cfg.Validate(); err != nil {
		return configError(err, snsConfigSettings)
	}
	if _, _, _, err := outboxsns.ParseURL(d.url); err != nil {
		return configError(err, snsConfigSettings)
	}
	var err error
	o.url, err = withEndpoint(d.url, o.endpoint, "sns")
	return err
}

func (o *snsOptions) open(ctx context.Context, d *dest) (*Opened, error) {
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	pub, err := outboxsns.Dial(dctx, o.url, o.cfg, config.WithLogger(awsLog{log: d.log()}))
	if err != nil {
		if errors.Is(err, outbox.ErrInvalidConfig) {
			return nil, configError(err, snsConfigSettings)
		}
		return nil, err
	}
	return &Opened{Publisher: pub, Close: pub.Close, CheckTopics: func(ctx context.Context, log *slog.Logger, topics []string) {
		if _, static := outbox.MustParseRoute(d.Route).Static(); static && len(topics) > 1 {
			topics = topics[:1] // every topic goes to the same SNS topic
		}
		for _, topic := range topics {
			err := pub.CheckTopic(ctx, &outbox.Message{Topic: topic})
			switch {
			case err == nil, errors.Is(err, outbox.ErrUnroutable):
			case errors.Is(err, outboxsns.ErrNoTopic):
				log.Warn("pending messages cannot be sent: the relay pauses on them until their topic exists", "topic", topic, "err", err)
			default:
				log.Warn("the topic of pending messages cannot be checked", "topic", topic, "err", err)
			}
		}
	}}, nil
}
