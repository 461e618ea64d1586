package outboxcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/brokers"
)

// brokerFlags are --broker, --route, the TLS flags and every broker's own flags, which
// internal/brokers defines: `outbox relay` picks the broker by the scheme of --broker.
type brokerFlags struct {
	url, route string
	tls        brokers.TLSFiles
	options    map[*brokers.Broker]*brokers.Options
	ce         cloudEventsFlags
}

// cloudEventsFlags are --cloudevents and --cloudevents-source.
type cloudEventsFlags struct{ mode, source string }

// config returns the CloudEvents settings, nil when --cloudevents is none; a mode it
// does not know is left for Validate to name.
func (c cloudEventsFlags) config() *outbox.CloudEventsConfig {
	mode := map[string]outbox.CloudEventsMode{"binary": outbox.CloudEventsBinary, "structured": outbox.CloudEventsStructured}[c.mode]
	if c.mode == "none" || c.mode == "" {
		return nil
	}
	return &outbox.CloudEventsConfig{Mode: mode, Source: c.source}
}

func addBrokerFlags(fs *flag.FlagSet) *brokerFlags {
	b := &brokerFlags{options: map[*brokers.Broker]*brokers.Options{}}
	fs.StringVar(&b.url, "broker", brokerDefault, "broker `URL`: "+brokers.Examples()+".\nCredentials in it never appear in output.")
	fs.StringVar(&b.route, "route", outbox.RouteTopic, "destination `template` over {topic}, {aggregate_type}, {event_type} and {key}\n(events.{topic}; outbox.event.{aggregate_type} is Debezium's layout)")
	fs.StringVar(&b.ce.mode, "cloudevents", "none", "publish every message as a CloudEvent: `mode` binary (attributes as headers, ce-id, ...)\nor structured (one JSON event as the payload); none: as written")
	fs.StringVar(&b.ce.source, "cloudevents-source", "", "with --cloudevents: the events' source attribute, a URI `reference` naming the\nservice that writes them (/billing)")
	b.tls.Flags(fs)
	for _, k := range brokers.All() {
		b.options[k] = k.Flags(fs)
	}
	return b
}

// check checks the common flags and the chosen broker's, before anything connects, and
// returns the destination to open.
func (b *brokerFlags) check(log *slog.Logger, sec *secrets) (*brokers.Dest, error) {
	k, err := brokers.ForURL(b.url)
	if err != nil {
		return nil, brokerUsage(err)
	}
	tls, err := b.tls.Config()
	if err != nil {
		return nil, brokerUsage(err)
	}
	d, err := b.options[k].Check(b.url, brokers.Settings{Route: b.route, TLS: tls, Log: log, Secrets: brokerSecretsOf{sec},
		CloudEvents: b.ce.config()})
	return d, brokerUsage(err)
}

// brokerUsage makes a *brokers.SettingError a usage error (exit status 2); other errors
// pass unchanged.
func brokerUsage(err error) error {
	var se *brokers.SettingError
	if errors.As(err, &se) {
		return &usageError{msg: se.Error()}
	}
	return err
}

// brokerSecretsOf gives internal/brokers the command's secrets, so that the credentials
// a broker learns beyond --broker (a password read from a file, a URL a password was
// put into) are kept out of all output.
type brokerSecretsOf struct{ s *secrets }

func (b brokerSecretsOf) Opaque(setting, value string) { b.s.addOpaque(setting, value) }
func (b brokerSecretsOf) URL(url string)               { b.s.addBroker(url) }

// open connects to the destination check returned.
func (b *brokerFlags) open(ctx context.Context, d *brokers.Dest) (*brokers.Opened, error) {
	opened, err := d.Open(ctx)
	var se *brokers.SettingError
	switch {
	case errors.As(err, &se):
		return nil, brokerUsage(err)
	case err != nil:
		return nil, fmt.Errorf("connect to %s at %s: %w", d.Broker().Name, brokers.Redact(b.url), err)
	}
	return opened, nil
}
