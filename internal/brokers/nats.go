package brokers

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxnats"
)

// NATS is NATS JetStream, through outboxnats.
var NATS = register(&Broker{
	Name:    "NATS JetStream",
	Label:   "nats",
	Schemes: []string{"nats", "tls"},
	Example: "nats://127.0.0.1:4222",
	settings: func(fs *flag.FlagSet) options {
		o := &natsOptions{}
		fs.StringVar(&o.createStream, "nats-create-stream", "", "create this JetStream `stream` if it does not exist, capturing the route's subjects\n(events.{topic} -> events.>) or --nats-stream-subjects; an existing stream is checked, never changed")
		fs.Var(&o.subjects, "nats-stream-subjects", "`subjects` of the stream --nats-create-stream creates (repeatable; comma-separated in the environment)")
		fs.StringVar(&o.creds, "nats-creds", "", "NATS credentials `file` (JWT and NKey seed) for the connection")
		return o
	},
})

type natsOptions struct {
	createStream string
	subjects     list
	creds        string
}

func (o *natsOptions) check(d *dest) error {
	if len(o.subjects) > 0 && o.createStream == "" {
		return settingErrorf("--nats-stream-subjects: only used with --nats-create-stream")
	}
	if o.createStream == "" {
		return nil
	}
	if strings.ContainsAny(o.createStream, " \t\r\n.*>") {
		return settingErrorf("--nats-create-stream: %q is not a valid stream name (no spaces, '.', '*' or '>')", o.createStream)
	}
	if len(o.subjects) == 0 {
		subject := streamFilter(d.Route)
		if subject == "" {
			return settingErrorf("--nats-create-stream: give --nats-stream-subjects, or a --route whose fixed start ends in '.' (events.{topic}) so that the stream can capture events.>")
		}
		o.subjects = list{subject}
	}
	return nil
}

// streamFilter returns the subject filter that captures every subject of route: the
// template's fixed start up to its last '.', then ">" ("events.{topic}" -> "events.>"),
// or "" when the route starts with a placeholder.
func streamFilter(route string) string {
	fixed, _, _ := strings.Cut(route, "{")
	i := strings.LastIndex(fixed, ".")
	if i <= 0 {
		return ""
	}
	return fixed[:i+1] + ">"
}

func (o *natsOptions) open(ctx context.Context, d *dest) (*Opened, error) {
	var opts []nats.Option
	if d.TLS != nil {
		opts = append(opts, nats.Secure(d.TLS))
	}
	if o.creds != "" {
		opts = append(opts, nats.UserCredentials(o.creds))
	}
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	pub, err := outboxnats.Dial(dctx, d.url, outboxnats.Config{Route: d.Route}, opts...)
	if err == nil {
		if err = pub.Ping(dctx); err != nil {
			pub.Close()
		}
	}
	if err != nil {
		if errors.Is(err, outbox.ErrInvalidConfig) {
			return nil, configError(err, map[string]string{"Route": "route"})
		}
		return nil, err
	}
	if o.createStream != "" {
		if err := pub.EnsureStream(ctx, o.createStream, o.subjects); err != nil {
			pub.Close()
			return nil, err
		}
		d.log().Info("JetStream stream ready", "stream", o.createStream, "subjects", []string(o.subjects))
	}
	return &Opened{
		Publisher: pub,
		Close:     pub.Close,
		CheckTopics: func(ctx context.Context, log *slog.Logger, topics []string) {
			for _, topic := range topics {
				subject, err := pub.Subject(&outbox.Message{Topic: topic})
				if err != nil {
					continue // the route needs more than the topic: checked per message
				}
				if err := pub.CheckSubject(ctx, subject); err != nil {
					log.Warn("pending messages cannot be stored: the relay pauses on them until a stream captures their subject",
						"topic", topic, "subject", subject, "err", err)
				}
			}
		},
	}, nil
}
