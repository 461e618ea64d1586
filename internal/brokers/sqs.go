package brokers

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/smithy-go/logging"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxsqs"
)

// SQS is Amazon SQS, through outboxsqs. Its URL is "sqs://" with region, endpoint and
// profile query parameters; credentials come from the AWS SDK's chain.
var SQS = register(&Broker{
	Name:    "Amazon SQS",
	Label:   "sqs",
	Schemes: []string{"sqs"},
	Example: "sqs://?region=eu-west-1",
	settings: func(fs *flag.FlagSet) options {
		o := &sqsOptions{}
		fs.StringVar(&o.endpoint, "sqs-endpoint", "", "SQS endpoint `URL` for an emulator or a VPC endpoint (http://127.0.0.1:4566); default: the\nregion's. Credentials come from the AWS SDK's chain (AWS_ACCESS_KEY_ID and\nAWS_SECRET_ACCESS_KEY, AWS_PROFILE, SSO, container and instance roles)")
		fs.IntVar(&o.cfg.MaxMessageBytes, "sqs-max-message-bytes", outboxsqs.MaxMessageBytesDefault, "largest message in `bytes`, body and attributes, and largest SendMessageBatch call;\nlarger messages are dead-lettered (1048576 for queues whose MaximumMessageSize allows 1 MiB)")
		fs.IntVar(&o.cfg.MaxInflight, "sqs-max-inflight", outboxsqs.MaxInflightDefault, "at most `n` SendMessageBatch calls in flight at once (and as many idle connections kept)")
		return o
	},
})

// sqsOptions are the SQS settings; --sqs-endpoint sets the URL's endpoint parameter.
type sqsOptions struct {
	cfg      outboxsqs.Config
	endpoint string

	url string // the URL with --sqs-endpoint applied
}

// sqsConfigSettings names the setting of each outboxsqs.Config field.
var sqsConfigSettings = map[string]string{"Route": "route", "MaxMessageBytes": "sqs-max-message-bytes",
	"MaxInflight": "sqs-max-inflight", "url": "broker"}

func (o *sqsOptions) check(d *dest) error {
	o.cfg.Route = d.Route
	o.cfg.TLS = d.TLS
	if err := o.cfg.Validate(); err != nil {
		return configError(err, sqsConfigSettings)
	}
	var err error
	o.url, err = withEndpoint(d.url, o.endpoint, "sqs")
	return err
}

func (o *sqsOptions) open(ctx context.Context, d *dest) (*Opened, error) {
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	// The SDK's own log (warnings such as an unreadable Date header; request and
	// response dumps only with a ClientLogMode, which is never set here) goes to the
	// destination's logger, not straight to the process's stderr past the CLI's
	// scrubber.
	pub, err := outboxsqs.Dial(dctx, o.url, o.cfg, config.WithLogger(awsLog{log: d.log()}))
	if err != nil {
		if errors.Is(err, outbox.ErrInvalidConfig) {
			return nil, configError(err, sqsConfigSettings)
		}
		return nil, err
	}
	return &Opened{
		Publisher: pub,
		Close:     pub.Close,
		CheckTopics: func(ctx context.Context, log *slog.Logger, topics []string) {
			if _, static := outbox.MustParseRoute(d.Route).Static(); static && len(topics) > 1 {
				topics = topics[:1] // every topic goes to the same queue
			}
			for _, topic := range topics {
				err := pub.CheckQueue(ctx, &outbox.Message{Topic: topic})
				switch {
				case err == nil, errors.Is(err, outbox.ErrUnroutable):
					// ErrUnroutable: the route needs more than the topic, checked per message.
				case errors.Is(err, outboxsqs.ErrNoQueue):
					log.Warn("pending messages cannot be sent: the relay pauses on them until their queue exists",
						"topic", topic, "err", err)
				default:
					log.Warn("the queue of pending messages cannot be checked", "topic", topic, "err", err)
				}
			}
		},
	}, nil
}

// awsLog takes the AWS SDK's log lines into the destination's logger, and so through
// the CLI's scrubber: without it the SDK writes them to os.Stderr itself ("SDK
// 2024/05/01 WARN ..."), unstructured and unscrubbed. Its warnings are warnings; its
// debug lines (none without a ClientLogMode) are debug. ctx, set by WithContext for
// one call, is the call's (trace ids).
type awsLog struct {
	log *slog.Logger
	ctx context.Context
}

func (l awsLog) Logf(c logging.Classification, format string, v ...any) {
	level := slog.LevelDebug
	if c == logging.Warn {
		level = slog.LevelWarn
	}
	ctx := l.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	l.log.Log(ctx, level, fmt.Sprintf(format, v...), "component", "aws-sdk")
}

func (l awsLog) WithContext(ctx context.Context) logging.Logger { return awsLog{l.log, ctx} }
