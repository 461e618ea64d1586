package brokers

import (
	"context"
	"flag"
	"strings"
	"time"

	"github.com/outboxkit/outbox/outboxwebhook"
)

// Webhook is HTTP webhooks, through outboxwebhook. The URL is the endpoint base: the
// route appends a path to it ({topic} posts to <url>/<topic>), or gives a whole http(s)
// URL.
var Webhook = register(&Broker{
	Name:    "HTTP webhook",
	Label:   "webhook",
	Schemes: []string{"http", "https"},
	Example: "https://hooks.example.com/outbox",
	settings: func(fs *flag.FlagSet) options {
		o := &webhookOptions{}
		fs.Var(&o.secrets, "webhook-secret", "`secret` that signs every webhook (HMAC-SHA256 in the Outbox-Signature header); repeat it to\nsign with the new and the old secret during a rotation (comma-separated in the environment)")
		fs.StringVar(&o.secretFile, "webhook-secret-file", "", "`file` holding the webhook secrets, one per line (like --webhook-secret; surrounding\nwhite space is ignored)")
		fs.BoolVar(&o.cfg.Unsigned, "webhook-unsigned", false, "send webhooks without a signature, to a receiver that authenticates the relay otherwise\n(mutual TLS with --broker-tls-cert, basic authentication in --broker)")
		fs.DurationVar(&o.cfg.Timeout, "webhook-timeout", outboxwebhook.TimeoutDefault, "how long one webhook request may take; one that times out is sent again later")
		fs.IntVar(&o.cfg.MaxConcurrency, "webhook-max-concurrency", outboxwebhook.MaxConcurrencyDefault, "at most `n` webhook requests in flight at once, over all batches (and as many idle\nconnections kept per host)")
		return o
	},
})

type webhookOptions struct {
	cfg        outboxwebhook.Config
	secrets    list
	secretFile string
}

// webhookConfigSettings names the setting of each outboxwebhook.Config field.
var webhookConfigSettings = map[string]string{"URL": "broker", "Route": "route",
	"Secrets": "webhook-secret", "Unsigned": "webhook-unsigned",
	"Timeout": "webhook-timeout", "MaxConcurrency": "webhook-max-concurrency"}

func (o *webhookOptions) check(d *dest) error {
	if d.TLS != nil && !strings.HasPrefix(d.url, "https://") {
		return settingErrorf("--broker-tls-*: TLS needs an https:// --broker URL, not %s", Redact(d.url))
	}
	secrets := []string(o.secrets)
	switch {
	case len(o.secrets) > 0 && o.secretFile != "":
		return settingErrorf("--webhook-secret and --webhook-secret-file: give one")
	case o.secretFile != "":
		raw, err := readSecretFile(d.Secrets, "webhook-secret-file", o.secretFile)
		if err != nil {
			return err
		}
		for line := range strings.SplitSeq(raw, "\n") {
			if line = strings.TrimSpace(line); line != "" {
				secrets = append(secrets, line)
			}
		}
	}
	if len(secrets) == 0 && !o.cfg.Unsigned {
		return settingErrorf("--webhook-secret: required to sign webhooks (or --webhook-secret-file; --webhook-unsigned for a receiver that authenticates the relay otherwise)")
	}
	o.cfg.Secrets = nil
	for _, secret := range secrets {
		if d.Secrets != nil {
			d.Secrets.Opaque("webhook-secret", secret)
		}
		o.cfg.Secrets = append(o.cfg.Secrets, []byte(secret))
	}
	// The query and path of the URL, which often carry the receiver's token, are
	// credentials of the URL, which the CLI keeps out of the output by structure.
	o.cfg.Route = d.Route
	o.cfg.TLS = d.TLS
	cfg := o.cfg
	cfg.URL = d.url
	return configError(cfg.Validate(), webhookConfigSettings)
}

func (o *webhookOptions) open(ctx context.Context, d *dest) (*Opened, error) {
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	pub, err := outboxwebhook.Dial(dctx, d.url, o.cfg) // o.cfg was validated by check
	if err != nil {
		return nil, err
	}
	return &Opened{Publisher: pub, Close: pub.Close}, nil
}
