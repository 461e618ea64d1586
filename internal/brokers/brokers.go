// Package brokers knows every broker the outbox binary publishes to: its name, the URL
// schemes it serves, an example URL, its settings and how to open its outbox publisher
// from a URL and those settings. `outbox relay` turns the settings into flags, `outbox
// bench` opens its relays' publishers here, and a relay with several destinations opens
// one per destination from its config: each broker's options, checks and error messages
// are written once, in its own file (nats.go, amqp.go, ...), which registers it.
//
// A setting is named after its broker ("nats-create-stream"), and the same name is the
// CLI's flag, its environment variable and its config key; errors name a setting as a
// flag ("--nats-create-stream: ..."), as the CLI's config file does. A setting that
// holds a secret has a name ending in -password, -secret or -token: the CLI scrubs such
// values from all output by that name, and Open registers them with Settings.Secrets.
package brokers

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/outboxkit/outbox"
)

// A Broker is one broker a publisher can be opened for. Brokers are registered when
// the program starts and never change after: a Broker is safe for concurrent use.
type Broker struct {
	Name    string   // for help and errors: "NATS JetStream"
	Label   string   // for metrics and traces: "nats", "webhook"
	Schemes []string // URL schemes it serves: "nats", "tls"
	Example string   // a URL, for help and errors

	// CloudEventsPrefix is the prefix of CloudEvents attribute headers in binary mode in
	// the broker's protocol binding; empty: outbox.CloudEventsPrefixDefault ("ce-").
	CloudEventsPrefix string

	// settings registers the broker's own settings on fs as flags, each named after
	// the broker, and returns where their values land.
	settings func(fs *flag.FlagSet) options
}

// options are a broker's settings, parsed.
type options interface {
	// check validates the settings before anything connects; its errors are
	// *SettingError.
	check(d *dest) error
	// open connects to the broker and returns a publisher ready for a relay.
	open(ctx context.Context, d *dest) (*Opened, error)
}

// dest is one destination being opened: a URL and the common settings.
type dest struct {
	url string
	Settings
}

// log is the destination's logger, or one that drops everything.
func (d *dest) log() *slog.Logger {
	if d.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return d.Log
}

// Settings are what every broker takes besides its URL. Open and Check copy them; the
// Options map and TLS configuration are read, never changed.
type Settings struct {
	// Route is the destination template over the message's fields. Defaults to
	// outbox.RouteTopic.
	Route string
	// TLS, when set, is the TLS configuration to reach the broker with. Defaults to
	// none: a broker then uses TLS only when its URL's scheme asks for it, with the
	// system's CAs.
	TLS *tls.Config
	// Log receives what the broker's client library logs and what opening does
	// (a stream created, a topology declared). Defaults to dropping it.
	Log *slog.Logger
	// Secrets, when set, is told every credential a broker learns beyond what its
	// URL shows, before any output could carry it. Defaults to none: for a caller
	// whose output carries no broker errors.
	Secrets Secrets
	// CloudEvents, when set, publishes every message as a CloudEvent
	// (outbox.WithCloudEvents); its Prefix is the broker's binding's
	// (Broker.CloudEventsPrefix).
	CloudEvents *outbox.CloudEventsConfig
	// Options are the broker's own settings by name ("rabbitmq-exchange": {"events"}),
	// applied over their defaults, or over the flags they are bound to (Broker.Flags).
	// A setting that is not a list takes one value.
	Options map[string][]string
}

// Secrets keeps credentials out of a program's output. Implementations are called from
// Check only.
type Secrets interface {
	// Opaque registers a secret that no structure carries (a signing secret, a
	// password read from a file), named after its setting.
	Opaque(setting, value string)
	// URL registers the credentials of a broker URL (one a password was put into).
	URL(url string)
}

// Opened is a connected broker's publisher and what comes with it. The publisher is
// safe for concurrent use, as outbox.Publisher requires; Close is called once, after
// the last Publish.
type Opened struct {
	Publisher outbox.Publisher
	// Close closes the publisher and its connection.
	Close func()
	// CheckTopics, when set, is given the topics that have pending messages before a
	// relay starts, and logs a warning for each that the broker cannot take (no stream
	// or queue for it, say), so that the log says at once what to fix.
	CheckTopics func(ctx context.Context, log *slog.Logger, topics []string)
}

// SettingError is a setting whose value is wrong, found before anything connects (or
// refused by the publisher's config validation). Its message names the setting as a
// flag; the CLI reports it as a usage error. It is a value, safe to share.
type SettingError struct{ msg string }

func (e *SettingError) Error() string { return e.msg }

func settingErrorf(format string, args ...any) error {
	return &SettingError{msg: fmt.Sprintf(format, args...)}
}

// configError names settings, not Go fields, in an outbox.ConfigError of a publisher's
// Config; fields maps the field names to setting names. Other errors pass unchanged.
func configError(err error, fields map[string]string) error {
	var ce *outbox.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	if name, ok := fields[ce.Field]; ok {
		return settingErrorf("--%s: %s", name, ce.Reason)
	}
	return &SettingError{msg: err.Error()}
}

var all []*Broker

// register adds b to the registry; each broker's file calls it for its package variable.
func register(b *Broker) *Broker {
	all = append(all, b)
	slices.SortFunc(all, func(a, b *Broker) int { return strings.Compare(a.Schemes[0], b.Schemes[0]) })
	return b
}

// All returns every broker, by first scheme.
func All() []*Broker { return slices.Clone(all) }

// Examples returns every broker's example URL, for help and errors.
func Examples() string {
	var ex []string
	for _, b := range all {
		ex = append(ex, b.Example)
	}
	return strings.Join(ex, ", ")
}

// ForURL returns the broker that serves url's scheme (the first URL's, for a
// comma-separated list). Its errors never show the URL's credentials.
func ForURL(brokerURL string) (*Broker, error) {
	first, _, _ := strings.Cut(brokerURL, ",")
	u, err := url.Parse(strings.TrimSpace(first))
	if err != nil || u.Scheme == "" {
		return nil, settingErrorf("--broker: %s is not a broker URL: want one of %s", Redact(first), Examples())
	}
	for _, b := range all {
		if slices.Contains(b.Schemes, u.Scheme) {
			return b, nil
		}
	}
	return nil, settingErrorf("--broker: unknown scheme %q: want one of %s", u.Scheme, Examples())
}

// Open opens a publisher to the broker url names, with settings s: it is Check and
// Dest.Open in one, for a caller that has nothing to do in between.
func Open(ctx context.Context, brokerURL string, s Settings) (*Opened, error) {
	b, err := ForURL(brokerURL)
	if err != nil {
		return nil, err
	}
	d, err := b.Flags(flag.NewFlagSet(b.Name, flag.ContinueOnError)).Check(brokerURL, s)
	if err != nil {
		return nil, err
	}
	return d.Open(ctx)
}

// Options are one broker's own settings, bound to flags. An Options is not safe for
// concurrent use.
type Options struct {
	broker *Broker
	fs     *flag.FlagSet
	names  map[string]bool // the settings of this broker among fs's flags
	opts   options
}

// Flags registers b's own settings on fs, as flags named after the broker, and returns
// them: the CLI parses its command line, environment and config file into them.
func (b *Broker) Flags(fs *flag.FlagSet) *Options {
	before := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { before[f.Name] = true })
	o := &Options{broker: b, fs: fs, names: map[string]bool{}, opts: b.settings(fs)}
	fs.VisitAll(func(f *flag.Flag) {
		if !before[f.Name] {
			o.names[f.Name] = true
		}
	})
	return o
}

// Check applies s.Options and validates the settings for brokerURL without
// connecting, and returns the destination to open. Its errors are *SettingError where
// a setting is wrong. Check is called once per Options.
func (o *Options) Check(brokerURL string, s Settings) (*Dest, error) {
	if b, err := ForURL(brokerURL); err != nil {
		return nil, err
	} else if b != o.broker {
		return nil, settingErrorf("--broker: %s is a %s URL, not %s", Redact(brokerURL), b.Name, o.broker.Name)
	}
	if s.Route == "" {
		s.Route = outbox.RouteTopic
	}
	if _, err := outbox.ParseRoute(s.Route); err != nil {
		return nil, configError(err, map[string]string{"route": "route"})
	}
	if ce := s.CloudEvents; ce != nil {
		if err := ce.Validate(); err != nil {
			return nil, configError(err, map[string]string{"CloudEvents.Mode": "cloudevents", "CloudEvents.Source": "cloudevents-source"})
		}
	}
	d := &dest{url: brokerURL, Settings: s}
	for _, name := range slices.Sorted(maps.Keys(s.Options)) {
		if err := o.set(d, name, s.Options[name]); err != nil {
			return nil, err
		}
	}
	if err := o.opts.check(d); err != nil {
		return nil, err
	}
	return &Dest{broker: o.broker, opts: o.opts, d: d}, nil
}

// set gives the setting name the values vals.
func (o *Options) set(d *dest, name string, vals []string) error {
	if !o.names[name] {
		return settingErrorf("%s has no setting %q", o.broker.Name, name)
	}
	f := o.fs.Lookup(name)
	if _, isList := f.Value.(interface{ IsList() }); !isList && len(vals) != 1 {
		return settingErrorf("--%s takes one value, not %d", name, len(vals))
	}
	for _, v := range vals {
		if IsSecret(name) && d.Secrets != nil {
			d.Secrets.Opaque(name, v)
		}
		if err := f.Value.Set(v); err != nil {
			return settingErrorf("--%s: %v", name, err)
		}
	}
	return nil
}

// IsSecret reports whether a setting holds a secret, by its name: one ending in
// -password, -secret or -token. The CLI applies the same rule to every flag it has.
func IsSecret(name string) bool {
	return strings.HasSuffix(name, "-password") || strings.HasSuffix(name, "-secret") || strings.HasSuffix(name, "-token")
}

// A Dest is a checked destination, ready to open; it holds the Options it was checked
// with, so it is opened once and not used concurrently.
type Dest struct {
	broker *Broker
	opts   options
	d      *dest
}

// Broker returns the broker the destination is on.
func (d *Dest) Broker() *Broker { return d.broker }

// Open connects to the broker. Its errors are *SettingError when the publisher refuses
// a setting, and otherwise what connecting returned; they do not name the broker or
// its URL, which the caller knows.
func (d *Dest) Open(ctx context.Context) (*Opened, error) {
	opened, err := d.opts.open(ctx, d.d)
	if err != nil || d.d.CloudEvents == nil {
		return opened, err
	}
	ce := *d.d.CloudEvents
	ce.Prefix = d.broker.CloudEventsPrefix
	if opened.Publisher, err = outbox.WithCloudEvents(opened.Publisher, ce); err != nil {
		opened.Close()
		return nil, settingErrorf("--cloudevents: %v", err)
	}
	return opened, nil
}

// TLSFiles are the TLS settings of a broker connection, as files: --broker-tls-*. Its
// flags are written while the command line is parsed, then only read.
type TLSFiles struct{ CA, Cert, Key, ServerName string }

// Flags registers the --broker-tls-* flags on fs.
func (t *TLSFiles) Flags(fs *flag.FlagSet) {
	fs.StringVar(&t.CA, "broker-tls-ca", "", "PEM `file` of the CA certificates that sign the broker's certificate (default: the system's)")
	fs.StringVar(&t.Cert, "broker-tls-cert", "", "PEM `file` of a client certificate for the broker (with --broker-tls-key)")
	fs.StringVar(&t.Key, "broker-tls-key", "", "PEM `file` of the client certificate's private key")
	fs.StringVar(&t.ServerName, "broker-tls-server-name", "", "`name` to verify the broker's certificate against, when it differs from the URL's host")
}

// Config builds the TLS configuration of the files, or nil when none is given (a
// broker then uses TLS only when its URL scheme asks for it, with the system's CAs).
func (t *TLSFiles) Config() (*tls.Config, error) {
	if *t == (TLSFiles{}) {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return nil, settingErrorf("--broker-tls-ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, settingErrorf("--broker-tls-ca: %s holds no PEM certificate", t.CA)
		}
		cfg.RootCAs = pool
	}
	if (t.Cert == "") != (t.Key == "") {
		return nil, settingErrorf("--broker-tls-cert and --broker-tls-key: give both or neither")
	}
	if t.Cert != "" {
		cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			// The error names the files, never their contents.
			return nil, settingErrorf("--broker-tls-cert/--broker-tls-key: %v", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// readSecretFile reads a secret from path (trailing newlines dropped) and registers it
// with secrets (which may be nil). setting names the setting in errors.
func readSecretFile(secrets Secrets, setting, path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", settingErrorf("--%s: %v", setting, err)
	}
	secret := strings.TrimRight(string(raw), "\r\n")
	if secret == "" {
		return "", settingErrorf("--%s: %s is empty", setting, path)
	}
	if secrets != nil {
		secrets.Opaque(setting, secret)
	}
	return secret, nil
}

// secretURL registers a URL that a password was put into with secrets, which may be
// nil.
func secretURL(secrets Secrets, u string) {
	if secrets != nil {
		secrets.URL(u)
	}
}

// checkTopics returns an Opened.CheckTopics that runs check on a message of each topic
// and logs warning, with the topic and the error, for those it fails.
// outbox.ErrUnroutable means that the route needs more than the topic: such messages
// are checked one by one when they are published.
func checkTopics(check func(context.Context, *outbox.Message) error, warning string) func(context.Context, *slog.Logger, []string) {
	return func(ctx context.Context, log *slog.Logger, topics []string) {
		for _, topic := range topics {
			if err := check(ctx, &outbox.Message{Topic: topic}); err != nil && !errors.Is(err, outbox.ErrUnroutable) {
				log.Warn(warning, "topic", topic, "err", err)
			}
		}
	}
}

// list is a setting that may be given several times; the CLI splits its value from the
// environment at commas.
type list []string

func (l *list) String() string { return strings.Join(*l, ",") }

func (l *list) Set(s string) error {
	if s == "" {
		return errors.New("empty value")
	}
	*l = append(*l, s)
	return nil
}

// IsList marks the setting as one that takes several values.
func (l *list) IsList() {}

// withEndpoint returns rawURL with its endpoint query parameter set to endpoint, an
// http:// or https:// URL given by the flag --name-endpoint (the AWS brokers), or rawURL
// unchanged when endpoint is empty.
func withEndpoint(rawURL, endpoint, name string) (string, error) {
	if endpoint == "" {
		return rawURL, nil
	}
	e, err := url.Parse(endpoint)
	if err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" {
		return "", settingErrorf("--%s-endpoint: %q is not an http:// or https:// URL", name, endpoint)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", settingErrorf("--broker: %s is not a %s:// URL", Redact(rawURL), name)
	}
	q := u.Query()
	if q.Has("endpoint") {
		return "", settingErrorf("--%s-endpoint and the endpoint parameter of --broker: give one", name)
	}
	q.Set("endpoint", endpoint)
	u.RawQuery = q.Encode()
	return u.String(), nil
}
