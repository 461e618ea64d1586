package brokers

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"net/url"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxpubsub"
)

// PubSub is Google Cloud Pub/Sub, through outboxpubsub. Its URL is "pubsub://PROJECT"
// with an optional endpoint query parameter for an emulator; credentials come from
// Application Default Credentials.
var PubSub = register(&Broker{
	Name:    "Google Cloud Pub/Sub",
	Label:   "pubsub",
	Schemes: []string{"pubsub"},
	Example: "pubsub://my-project",
	settings: func(fs *flag.FlagSet) options {
		o := &pubsubOptions{}
		fs.StringVar(&o.endpoint, "pubsub-endpoint", "", "`host:port` of a Pub/Sub emulator (plain gRPC, no credentials); default: Google's service,\nor PUBSUB_EMULATOR_HOST. Credentials come from Application Default Credentials\n(GOOGLE_APPLICATION_CREDENTIALS, the metadata server, gcloud auth application-default login)")
		fs.DurationVar(&o.cfg.Timeout, "pubsub-timeout", outboxpubsub.TimeoutDefault, "how long the client tries to publish a message, retries included, before the relay\ntakes it for an outage")
		fs.BoolVar(&o.cfg.Unordered, "pubsub-unordered", false, "publish without ordering keys (by default a message's key is its ordering key)")
		return o
	},
})

// pubsubOptions are the Pub/Sub settings; --pubsub-endpoint sets the URL's endpoint
// parameter.
type pubsubOptions struct {
	cfg      outboxpubsub.Config
	endpoint string

	url string // the URL with --pubsub-endpoint applied
}

// pubsubConfigSettings names the setting of each outboxpubsub.Config field.
var pubsubConfigSettings = map[string]string{"Route": "route", "Timeout": "pubsub-timeout"}

func (o *pubsubOptions) check(d *dest) error {
	o.cfg.Route = d.Route
	if err := o.cfg.Validate(); err != nil {
		return configError(err, pubsubConfigSettings)
	}
	if _, _, err := outboxpubsub.ParseURL(d.url); err != nil {
		return settingErrorf("--broker: %s: %v", Redact(d.url), err)
	}
	o.url = d.url
	if o.endpoint != "" {
		u, _ := url.Parse(d.url)
		q := u.Query()
		if q.Has("endpoint") {
			return settingErrorf("--pubsub-endpoint and the endpoint parameter of --broker: give one")
		}
		q.Set("endpoint", o.endpoint)
		u.RawQuery = q.Encode()
		o.url = u.String()
	}
	return nil
}

func (o *pubsubOptions) open(ctx context.Context, d *dest) (*Opened, error) {
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	pub, err := outboxpubsub.Dial(dctx, o.url, o.cfg)
	if err != nil {
		if errors.Is(err, outbox.ErrInvalidConfig) {
			return nil, configError(err, pubsubConfigSettings)
		}
		return nil, err
	}
	return &Opened{Publisher: pub, Close: pub.Close, CheckTopics: func(ctx context.Context, log *slog.Logger, topics []string) {
		for _, topic := range topics {
			if err := pub.CheckTopic(ctx, &outbox.Message{Topic: topic}); err != nil && !errors.Is(err, outbox.ErrUnroutable) {
				log.Warn("pending messages cannot be sent: the relay pauses on them until their topic exists",
					"topic", topic, "err", err)
			}
		}
	}}, nil
}
