package outboxcli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/outboxkit/outbox"
)

// A brokerKind is one broker the CLI publishes to. Each lives in its own broker_*.go
// file, which registers it from init: the commands that talk to brokers (relay, bench)
// pick the kind by the scheme of --broker.
type brokerKind struct {
	name    string   // for help and errors: "NATS JetStream"
	schemes []string // URL schemes it serves: "nats"
	example string   // a --broker value, for help and errors

	// flags registers the broker's own flags on fs, each named after the broker
	// ("nats-create-stream"). A flag holding a secret has a name ending in -password,
	// -secret or -token, so that its value is scrubbed from all output; a secret read
	// from a file, or a password put into the URL, is registered through
	// brokerSettings.secrets.
	flags func(fs *flag.FlagSet) brokerOptions
}

// brokerOptions is a broker's parsed flags.
type brokerOptions interface {
	// check validates the broker's flags before anything connects; its errors are
	// usage errors (exit status 2).
	check(s *brokerSettings) error
	// open connects to the broker and returns a publisher ready for the relay.
	open(ctx context.Context, s *brokerSettings) (*openedBroker, error)
}

// brokerSettings are the flags common to every broker.
type brokerSettings struct {
	url   string      // --broker
	route string      // --route
	tls   *tls.Config // from --broker-tls-*; nil when none is given
	log   *slog.Logger
	// secrets keeps the credentials the broker's flags add (a password read from a
	// file, a password put into the URL) out of all output.
	secrets *secrets
}

// openedBroker is a connected broker.
type openedBroker struct {
	publisher outbox.Publisher
	close     func()
	// check, when set, is given the topics that have pending messages before the relay
	// starts, and logs a warning for each that the broker cannot take (no stream or
	// queue for it, say), so that the log says at once what to fix.
	check func(ctx context.Context, log *slog.Logger, topics []string)
}

var brokerKinds []*brokerKind

func registerBroker(k *brokerKind) {
	brokerKinds = append(brokerKinds, k)
	slices.SortFunc(brokerKinds, func(a, b *brokerKind) int { return strings.Compare(a.schemes[0], b.schemes[0]) })
}

// brokerFlags are --broker, --route, the TLS flags and every broker's own flags.
type brokerFlags struct {
	url, route             string
	tlsCA, tlsCert, tlsKey string
	tlsServerName          string
	options                map[*brokerKind]brokerOptions
}

func addBrokerFlags(fs *flag.FlagSet) *brokerFlags {
	b := &brokerFlags{options: map[*brokerKind]brokerOptions{}}
	fs.StringVar(&b.url, "broker", brokerDefault, "broker `URL`: "+brokerExamples()+".\nCredentials in it never appear in output.")
	fs.StringVar(&b.route, "route", outbox.RouteTopic, "destination `template` over {topic}, {aggregate_type}, {event_type} and {key}\n(events.{topic}; outbox.event.{aggregate_type} is Debezium's layout)")
	fs.StringVar(&b.tlsCA, "broker-tls-ca", "", "PEM `file` of the CA certificates that sign the broker's certificate (default: the system's)")
	fs.StringVar(&b.tlsCert, "broker-tls-cert", "", "PEM `file` of a client certificate for the broker (with --broker-tls-key)")
	fs.StringVar(&b.tlsKey, "broker-tls-key", "", "PEM `file` of the client certificate's private key")
	fs.StringVar(&b.tlsServerName, "broker-tls-server-name", "", "`name` to verify the broker's certificate against, when it differs from the URL's host")
	for _, k := range brokerKinds {
		b.options[k] = k.flags(fs)
	}
	return b
}

func brokerExamples() string {
	var ex []string
	for _, k := range brokerKinds {
		ex = append(ex, k.example)
	}
	return strings.Join(ex, ", ")
}

// kind returns the broker kind that serves --broker's scheme.
func (b *brokerFlags) kind() (*brokerKind, error) {
	first, _, _ := strings.Cut(b.url, ",")
	u, err := url.Parse(strings.TrimSpace(first))
	if err != nil || u.Scheme == "" {
		return nil, usageErrorf("--broker: %s is not a broker URL: want one of %s", redactBroker(first), brokerExamples())
	}
	for _, k := range brokerKinds {
		if slices.Contains(k.schemes, u.Scheme) {
			return k, nil
		}
	}
	return nil, usageErrorf("--broker: unknown scheme %q: want one of %s", u.Scheme, brokerExamples())
}

// settings checks the common flags and the chosen broker's, before anything connects.
func (b *brokerFlags) settings(log *slog.Logger, sec *secrets) (*brokerKind, *brokerSettings, error) {
	k, err := b.kind()
	if err != nil {
		return nil, nil, err
	}
	if _, err := outbox.ParseRoute(b.route); err != nil {
		return nil, nil, flagError(err, map[string]string{"route": "route"})
	}
	s := &brokerSettings{url: b.url, route: b.route, log: log, secrets: sec}
	if s.tls, err = b.tlsConfig(); err != nil {
		return nil, nil, err
	}
	if err := b.options[k].check(s); err != nil {
		return nil, nil, err
	}
	return k, s, nil
}

// open connects to the broker settings chose.
func (b *brokerFlags) open(ctx context.Context, k *brokerKind, s *brokerSettings) (*openedBroker, error) {
	return b.options[k].open(ctx, s)
}

// tlsConfig builds the TLS configuration of the --broker-tls-* flags, or nil when none
// is given (a broker then uses TLS only when its URL scheme asks for it, with the
// system's CAs).
func (b *brokerFlags) tlsConfig() (*tls.Config, error) {
	if b.tlsCA == "" && b.tlsCert == "" && b.tlsKey == "" && b.tlsServerName == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: b.tlsServerName}
	if b.tlsCA != "" {
		pem, err := os.ReadFile(b.tlsCA)
		if err != nil {
			return nil, usageErrorf("--broker-tls-ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usageErrorf("--broker-tls-ca: %s holds no PEM certificate", b.tlsCA)
		}
		cfg.RootCAs = pool
	}
	if (b.tlsCert == "") != (b.tlsKey == "") {
		return nil, usageErrorf("--broker-tls-cert and --broker-tls-key: give both or neither")
	}
	if b.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(b.tlsCert, b.tlsKey)
		if err != nil {
			// The error names the files, never their contents.
			return nil, usageErrorf("--broker-tls-cert/--broker-tls-key: %v", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// readSecretFile reads a secret from path (trailing newlines dropped) and registers it
// for scrubbing. flagName names the flag in errors.
func readSecretFile(s *brokerSettings, flagName, path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", usageErrorf("--%s: %v", flagName, err)
	}
	secret := strings.TrimRight(string(raw), "\r\n")
	if secret == "" {
		return "", usageErrorf("--%s: %s is empty", flagName, path)
	}
	s.secrets.addOpaque(flagName, secret)
	return secret, nil
}

// isSecretFlag reports whether a flag holds a secret by its name.
func isSecretFlag(name string) bool {
	return strings.HasSuffix(name, "-password") || strings.HasSuffix(name, "-secret") || strings.HasSuffix(name, "-token")
}

// connectError wraps a failure to reach the broker.
func connectError(k *brokerKind, s *brokerSettings, err error) error {
	return fmt.Errorf("connect to %s at %s: %w", k.name, redactBroker(s.url), err)
}

// checkTopics returns an openedBroker.check that runs check on a message of each topic and
// logs warning, with the topic and the error, for those it fails. outbox.ErrUnroutable
// means that the route needs more than the topic: such messages are checked one by one
// when they are published.
func checkTopics(check func(context.Context, *outbox.Message) error, warning string) func(context.Context, *slog.Logger, []string) {
	return func(ctx context.Context, log *slog.Logger, topics []string) {
		for _, topic := range topics {
			if err := check(ctx, &outbox.Message{Topic: topic}); err != nil && !errors.Is(err, outbox.ErrUnroutable) {
				log.Warn(warning, "topic", topic, "err", err)
			}
		}
	}
}
