package brokers

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox/outboxredis"
)

// Redis is Redis Streams, through outboxredis.
var Redis = register(&Broker{
	Name:    "Redis Streams",
	Label:   "redis",
	Schemes: []string{"redis", "rediss"},
	Example: "redis://127.0.0.1:6379",
	settings: func(fs *flag.FlagSet) options {
		o := &redisOptions{}
		fs.Int64Var(&o.cfg.MaxLen, "redis-maxlen", 0, "trim every stream to about this many `entries` as messages are added (XADD MAXLEN ~);\nentries no consumer has read are trimmed too (default: no trimming)")
		fs.BoolVar(&o.cfg.MaxLenExact, "redis-maxlen-exact", false, "trim to exactly --redis-maxlen entries (MAXLEN =), at a higher cost per message")
		fs.DurationVar(&o.cfg.DedupWindow, "redis-dedup-window", 0, "add each message at most once within this `duration`, by a dedup marker key per message\nchecked in a Lua script (Redis 7+; costs memory per message for the window; default: off,\nconsumers drop duplicates by the h:Outbox-Dedup-Key field)")
		fs.IntVar(&o.cfg.WaitReplicas, "redis-wait-replicas", 0, "confirm a message only once `n` replicas have it (WAIT); default: the primary's reply confirms")
		fs.DurationVar(&o.cfg.WaitTimeout, "redis-wait-timeout", outboxredis.WaitTimeoutDefault, "how long WAIT waits for --redis-wait-replicas; when it passes, the messages are retried")
		fs.BoolVar(&o.cfg.Cluster, "redis-cluster", false, "--broker is a seed node of a Redis Cluster (more seeds: ?addr=host:port&addr=...)")
		fs.StringVar(&o.password, "redis-password", "", "Redis `password` (with the user of --broker, if any), instead of one in the URL")
		fs.StringVar(&o.passwordFile, "redis-password-file", "", "`file` holding the Redis password (like --redis-password)")
		return o
	},
})

type redisOptions struct {
	cfg                    outboxredis.Config
	password, passwordFile string

	url string // the URL with the password settings applied
}

// redisConfigSettings names the setting of each outboxredis.Config field.
var redisConfigSettings = map[string]string{"Route": "route", "MaxLen": "redis-maxlen",
	"MaxLenExact": "redis-maxlen-exact", "DedupWindow": "redis-dedup-window",
	"WaitReplicas": "redis-wait-replicas", "WaitTimeout": "redis-wait-timeout"}

func (o *redisOptions) check(d *dest) error {
	o.cfg.Route = d.Route
	o.cfg.TLS = d.TLS
	if err := o.cfg.Validate(); err != nil {
		return configError(err, redisConfigSettings)
	}
	if d.TLS != nil && !strings.HasPrefix(d.url, "rediss://") {
		return settingErrorf("--broker-tls-*: TLS needs a rediss:// --broker URL, not %s", Redact(d.url))
	}
	password := o.password
	switch {
	case o.password != "" && o.passwordFile != "":
		return settingErrorf("--redis-password and --redis-password-file: give one")
	case o.passwordFile != "":
		var err error
		if password, err = readSecretFile(d.Secrets, "redis-password-file", o.passwordFile); err != nil {
			return err
		}
	}
	o.url = d.url
	if password != "" {
		u, err := url.Parse(d.url)
		if err != nil {
			return settingErrorf("--broker: %s is not a Redis URL", Redact(d.url))
		}
		u.User = url.UserPassword(u.User.Username(), password) // a nil User has no name
		o.url = u.String()
		secretURL(d.Secrets, o.url) // the password is in the user information now
	}
	return nil
}

func (o *redisOptions) open(ctx context.Context, d *dest) (*Opened, error) {
	redis.SetLogger(redisLog{d.log()})
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	pub, err := outboxredis.Dial(dctx, o.url, o.cfg) // o.cfg was validated by check
	if err != nil {
		return nil, err
	}
	return &Opened{
		Publisher:   pub,
		Close:       pub.Close,
		CheckTopics: checkTopics(pub.CheckStream, "pending messages cannot be added to their stream: the relay retries them, then dead-letters them"),
	}, nil
}

// redisLog takes go-redis's own log lines (a failed dial, a connection retired), which it
// would otherwise print to the process's stderr unstructured and unscrubbed, into the
// destination's logger, at debug level: the relay logs the outages they come with.
// go-redis has one logger for the whole process, so the last destination opened sets
// it.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}
