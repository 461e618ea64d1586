package outboxcli

import (
	"context"
	"flag"
	"strings"
	"time"

	"github.com/outboxkit/outbox/outboxwebhook"
)

func init() {
	registerBroker(&brokerKind{
		name:    "HTTP webhook",
		schemes: []string{"http", "https"},
		example: "https://hooks.example.com/outbox",
		flags: func(fs *flag.FlagSet) brokerOptions {
			o := &webhookOptions{}
			fs.Var(&o.secrets, "webhook-secret", "`secret` that signs every webhook (HMAC-SHA256 in the Outbox-Signature header); repeat it to\nsign with the new and the old secret during a rotation (comma-separated in the environment)")
			fs.StringVar(&o.secretFile, "webhook-secret-file", "", "`file` holding the webhook secrets, one per line (like --webhook-secret; surrounding\nwhite space is ignored)")
			fs.BoolVar(&o.cfg.Unsigned, "webhook-unsigned", false, "send webhooks without a signature, to a receiver that authenticates the relay otherwise\n(mutual TLS with --broker-tls-cert, basic authentication in --broker)")
			fs.DurationVar(&o.cfg.Timeout, "webhook-timeout", outboxwebhook.TimeoutDefault, "how long one webhook request may take; one that times out is sent again later")
			fs.IntVar(&o.cfg.MaxConcurrency, "webhook-max-concurrency", outboxwebhook.MaxConcurrencyDefault, "at most `n` webhook requests in flight at once, over all batches (and as many idle\nconnections kept per host)")
			return o
		},
	})
}

// webhookOptions are the webhook flags. --broker is the endpoint base: --route appends
// a path to it ({topic} posts to <broker>/<topic>), or gives a whole http(s) URL.
type webhookOptions struct {
	cfg        outboxwebhook.Config
	secrets    stringList
	secretFile string
}

// webhookConfigFlags names the flag of each outboxwebhook.Config field.
var webhookConfigFlags = map[string]string{"URL": "broker", "Route": "route",
	"Secrets": "webhook-secret", "Unsigned": "webhook-unsigned",
	"Timeout": "webhook-timeout", "MaxConcurrency": "webhook-max-concurrency"}

func (o *webhookOptions) check(s *brokerSettings) error {
	if s.tls != nil && !strings.HasPrefix(s.url, "https://") {
		return usageErrorf("--broker-tls-*: TLS needs an https:// --broker URL, not %s", redactBroker(s.url))
	}
	secrets := []string(o.secrets)
	switch {
	case len(o.secrets) > 0 && o.secretFile != "":
		return usageErrorf("--webhook-secret and --webhook-secret-file: give one")
	case o.secretFile != "":
		raw, err := readSecretFile(s, "webhook-secret-file", o.secretFile)
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
		return usageErrorf("--webhook-secret: required to sign webhooks (or --webhook-secret-file; --webhook-unsigned for a receiver that authenticates the relay otherwise)")
	}
	o.cfg.Secrets = nil
	for _, secret := range secrets {
		s.secrets.addOpaque("webhook-secret", secret)
		o.cfg.Secrets = append(o.cfg.Secrets, []byte(secret))
	}
	// The query and path of --broker, which often carry the receiver's token, are
	// credentials of the URL (brokerSecrets), kept out of the output by structure.
	o.cfg.Route = s.route
	o.cfg.TLS = s.tls
	cfg := o.cfg
	cfg.URL = s.url
	return flagError(cfg.Validate(), webhookConfigFlags)
}

func (o *webhookOptions) open(ctx context.Context, s *brokerSettings) (*openedBroker, error) {
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	pub, err := outboxwebhook.Dial(dctx, s.url, o.cfg) // o.cfg was validated by check
	if err != nil {
		return nil, err
	}
	return &openedBroker{publisher: pub, close: pub.Close}, nil
}
