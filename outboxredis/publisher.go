package outboxredis

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox"
)

// Config configures a Publisher. The zero value is usable.
type Config struct {
	// Route maps a message to the stream it is added to (see outbox.ParseRoute): Redis
	// takes any non-empty key as a stream name. Defaults to "{topic}".
	Route string

	// MaxLen caps the length of every stream the publisher adds to: each XADD trims the
	// stream with MAXLEN ~ MaxLen, which drops the oldest entries in whole radix tree
	// nodes (100 entries by default), so a stream may hold somewhat more than MaxLen.
	// Trimming also drops entries no consumer has read yet: size it for the longest
	// consumer outage. Defaults to 0: no trimming.
	MaxLen int64

	// MaxLenExact trims to exactly MaxLen entries (MAXLEN = MaxLen), which costs more
	// per XADD. Needs MaxLen. Defaults to false: approximate trimming.
	MaxLenExact bool

	// DedupWindow, when positive, makes publishing idempotent for that long: a Lua script
	// adds the entry and records the message's dedup key in a marker key that expires
	// after DedupWindow, and a message whose marker exists is confirmed without a second
	// entry. A marker costs about 150 bytes plus its name's length of Redis memory for the
	// window's length; see the package documentation. Needs Redis 7 or later. Defaults to
	// 0: plain XADD, consumers drop duplicates by the dedup key.
	DedupWindow time.Duration

	// WaitReplicas, when positive, confirms a message only once that many replicas
	// acknowledged it (WAIT after each pipeline). Defaults to 0: the primary's reply
	// confirms.
	WaitReplicas int

	// WaitTimeout bounds each WAIT; when it passes with fewer than WaitReplicas
	// replicas acknowledging, the pipeline's messages fail as outages (they are on the
	// primary: the retry adds second copies). It must be below the client's ReadTimeout.
	// Defaults to 1s.
	WaitTimeout time.Duration

	// TLS, for Dial only, is the TLS configuration of the connections (custom root CAs,
	// client certificates). It is used whatever the URL's scheme; rediss:// alone uses
	// the system's roots. ServerName defaults to the URL's host. Defaults to nil.
	TLS *tls.Config

	// Cluster, for Dial only, connects to a Redis Cluster: the URL names one seed node,
	// and more may follow as addr query parameters (redis://h1:6379?addr=h2:6379).
	// Defaults to false: a single server.
	Cluster bool
}

// WaitTimeoutDefault is the default of Config.WaitTimeout.
const WaitTimeoutDefault = time.Second

func (c Config) withDefaults() Config {
	c.Route = cmp.Or(c.Route, outbox.RouteTopic)
	c.WaitTimeout = cmp.Or(c.WaitTimeout, WaitTimeoutDefault)
	return c
}

// Validate returns a *outbox.ConfigError naming the first invalid field, or nil. New and
// Dial call it; a command can call it to refuse a configuration before connecting.
func (c Config) Validate() error {
	bad := func(field, reason string) error { return &outbox.ConfigError{Field: field, Reason: reason} }
	switch {
	case c.MaxLen < 0:
		return bad("MaxLen", "must not be negative")
	case c.MaxLenExact && c.MaxLen == 0:
		return bad("MaxLenExact", "needs MaxLen")
	case c.DedupWindow < 0:
		return bad("DedupWindow", "must not be negative")
	case c.DedupWindow > 0 && c.DedupWindow < time.Millisecond:
		return bad("DedupWindow", "must be at least 1ms: markers expire in whole milliseconds")
	case c.WaitReplicas < 0:
		return bad("WaitReplicas", "must not be negative")
	case c.WaitTimeout < 0:
		return bad("WaitTimeout", "must not be negative")
	case c.WaitTimeout > 0 && c.WaitTimeout < time.Millisecond:
		return bad("WaitTimeout", "must be at least 1ms: WAIT takes whole milliseconds, and 0 would block forever")
	}
	if _, err := outbox.ParseRoute(c.Route); err != nil {
		var ce *outbox.ConfigError
		if errors.As(err, &ce) {
			return bad("Route", ce.Reason)
		}
		return bad("Route", err.Error())
	}
	return nil
}

// Publisher adds outbox messages to Redis streams. It implements outbox.Publisher and
// outbox.Pinger. It is safe for concurrent use.
type Publisher struct {
	client redis.UniversalClient
	cfg    Config
	route  *outbox.Route
	owned  bool // Dial made client: Close closes it

	// perMaster is set when WAIT must follow the writes on each master's own
	// connection: a cluster client with Config.WaitReplicas.
	perMaster *redis.ClusterClient

	closeOnce sync.Once
	closed    chan struct{}
}

var (
	_ outbox.Publisher = (*Publisher)(nil)
	_ outbox.Pinger    = (*Publisher)(nil)
)

// New returns a Publisher that sends through client: a *redis.Client (a single server,
// or a Sentinel-managed primary from redis.NewFailoverClient), a *redis.ClusterClient or
// a *redis.Ring. The caller keeps owning client: Close does not close it.
//
// Give client ContextTimeoutEnabled: go-redis otherwise ignores ctx deadlines for socket
// reads and writes, and a Publish could outlast its ctx by the client's ReadTimeout. With
// Config.WaitReplicas, a *redis.Ring is refused (its shards are not a cluster: WAIT
// cannot follow a pipeline split across them), and the client's ReadTimeout must exceed
// Config.WaitTimeout.
func New(client redis.UniversalClient, cfg Config) (*Publisher, error) {
	if client == nil {
		return nil, errors.New("outboxredis: New: nil client")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	p := &Publisher{
		client: client,
		cfg:    cfg,
		route:  outbox.MustParseRoute(cfg.Route),
		closed: make(chan struct{}),
	}
	if cfg.WaitReplicas > 0 {
		var readTimeout time.Duration
		switch c := client.(type) {
		case *redis.Client:
			readTimeout = c.Options().ReadTimeout
		case *redis.ClusterClient:
			readTimeout = c.Options().ReadTimeout
			p.perMaster = c
		case *redis.Ring:
			return nil, &outbox.ConfigError{Field: "WaitReplicas", Reason: "not supported with a *redis.Ring: use a *redis.ClusterClient or one *redis.Client per primary"}
		}
		if readTimeout > 0 && readTimeout <= cfg.WaitTimeout {
			return nil, &outbox.ConfigError{Field: "WaitTimeout", Reason: fmt.Sprintf(
				"%v is not below the client's ReadTimeout of %v: WAIT blocks up to WaitTimeout, so raise the ReadTimeout or lower WaitTimeout", cfg.WaitTimeout, readTimeout)}
		}
	}
	return p, nil
}

// Dial connects to url and returns a Publisher that owns the connections: Close closes
// them. The URL is go-redis's: redis://[user:password@]host:port[/db][?option=value]
// (read_timeout, pool_size, ...), rediss:// for TLS, unix:///path.sock; with
// Config.Cluster, the seed nodes of a Redis Cluster. Dial fails unless the server
// answers a PING within ctx.
//
// The client Dial makes honours ctx deadlines on every call (ContextTimeoutEnabled),
// names itself "outboxredis" in CLIENT LIST unless the URL sets client_name, and fails
// fast: it dials once per attempt and retries a failed command once (max_retries in the
// URL overrides that; longer retries inside the client hide short outages from the
// relay and hold its Publish calls). Connections are redialled on demand: after an
// outage the relay's Ping reconnects, paced by the relay's outage backoff. Credentials
// never appear in the errors Dial returns.
func Dial(ctx context.Context, url string, cfg Config) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	client, err := newClient(url, cfg)
	if err != nil {
		return nil, fmt.Errorf("outboxredis: %s: %w", redactURL(url), err)
	}
	if err := client.Ping(ctx).Err(); err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("outboxredis: connect to %s: %w", redactURL(url), err)
	}
	p, err := New(client, cfg)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	p.owned = true
	return p, nil
}

// newClient makes the client Dial owns. go-redis's URL parsing errors do not repeat the
// password, but url.Parse's do: those are replaced.
func newClient(rawURL string, cfg Config) (redis.UniversalClient, error) {
	if _, err := url.Parse(rawURL); err != nil {
		return nil, errors.New("invalid URL")
	}
	// WAIT blocks the pipeline's read up to WaitTimeout: give the read that much more.
	readTimeout := func(d time.Duration) time.Duration {
		if cfg.WaitReplicas == 0 || d < 0 {
			return d
		}
		return max(cmp.Or(d, 3*time.Second), cfg.WaitTimeout+3*time.Second)
	}
	// Fail fast: one dial, one retry of a command (for a pooled connection the server
	// closed), so that an outage reaches the relay, which pauses and pings, instead of
	// being retried inside the client for seconds.
	if cfg.Cluster {
		opts, err := redis.ParseClusterURL(rawURL)
		if err != nil {
			return nil, err
		}
		opts.ContextTimeoutEnabled = true
		opts.ClientName = cmp.Or(opts.ClientName, "outboxredis")
		opts.ReadTimeout = readTimeout(opts.ReadTimeout)
		opts.MaxRetries = cmp.Or(opts.MaxRetries, 1)
		opts.DialerRetries = 1
		if cfg.TLS != nil {
			opts.TLSConfig = tlsFor(cfg.TLS, opts.Addrs[0])
		}
		return redis.NewClusterClient(opts), nil
	}
	opts, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	opts.ContextTimeoutEnabled = true
	opts.ClientName = cmp.Or(opts.ClientName, "outboxredis")
	opts.ReadTimeout = readTimeout(opts.ReadTimeout)
	opts.MaxRetries = cmp.Or(opts.MaxRetries, 1)
	opts.DialerRetries = 1
	if cfg.TLS != nil {
		opts.TLSConfig = tlsFor(cfg.TLS, opts.Addr)
	}
	return redis.NewClient(opts), nil
}

// tlsFor returns c with ServerName set to addr's host when c has none.
func tlsFor(c *tls.Config, addr string) *tls.Config {
	if c.ServerName != "" {
		return c
	}
	c = c.Clone()
	if host, _, err := net.SplitHostPort(addr); err == nil {
		c.ServerName = host
	} else {
		c.ServerName = addr
	}
	return c
}

// redactURL hides the user information of a Redis URL (the password, and the user name
// with it) and returns a placeholder for text that is not a URL.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(invalid URL)"
	}
	if u.User != nil {
		u.User = url.User("REDACTED")
	}
	return u.String()
}

// Close closes the client if Dial made it, and makes later Publish and Ping calls fail as
// outages. Closing twice is safe. Publish calls in flight finish (with an outage when
// their client was closed under them).
func (p *Publisher) Close() {
	p.closeOnce.Do(func() {
		close(p.closed)
		if p.owned {
			_ = p.client.Close() // only ever says it was closed already
		}
	})
}

// Ping checks that the server answers (any node of a cluster). Its errors are outages.
// Without a deadline on ctx it gives up after 5 s.
func (p *Publisher) Ping(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	if p.isClosed() {
		return outbox.Outage(fmt.Errorf("outboxredis: ping: %w", redis.ErrClosed))
	}
	if err := p.client.Ping(ctx).Err(); err != nil {
		return outbox.Outage(fmt.Errorf("outboxredis: ping: %w", err))
	}
	return nil
}

// CheckStream reports whether m's stream can take entries, for a start-up check of the
// topics the relay will publish: it returns m's rejection when the route cannot map m,
// and an error naming the key when the key exists and holds another type than a stream
// (every message routed there would be rejected with WRONGTYPE and dead-lettered). A
// stream that does not exist yet is fine: XADD creates it.
func (p *Publisher) CheckStream(ctx context.Context, m *outbox.Message) error {
	stream, err := p.route.Destination(m)
	if err != nil {
		return fmt.Errorf("outboxredis: %w", err)
	}
	typ, err := p.client.Type(ctx, stream).Result()
	if err != nil {
		return fmt.Errorf("outboxredis: check stream %q: %w", stream, err)
	}
	if typ != "none" && typ != "stream" {
		return fmt.Errorf("outboxredis: the key %q holds a %s, not a stream: messages routed there are rejected (WRONGTYPE); delete or rename the key, or change the route", stream, typ)
	}
	return nil
}

func (p *Publisher) isClosed() bool {
	select {
	case <-p.closed:
		return true
	default:
		return false
	}
}

// send is one message of a batch on its way: its command and, once run, its result.
type send struct {
	i      int    // index in the batch
	stream string // destination
	args   []any  // the command: XADD ... or EVAL ...
	err    error
}

// Publish implements outbox.Publisher. It sends the whole batch as one pipeline (one per
// cluster node), followed by WAIT when Config.WaitReplicas is set, and returns nil when
// every message was added, otherwise a slice of len(batch) with nil for the added ones.
// See the package documentation for which errors are outages.
func (p *Publisher) Publish(ctx context.Context, batch []*outbox.Message) []error {
	if len(batch) == 0 {
		return nil
	}
	errs := make([]error, len(batch))
	failed := false
	fail := func(i int, err error) {
		errs[i] = err
		failed = true
	}
	var stop error
	if err := ctx.Err(); err != nil {
		stop = outbox.Outage(fmt.Errorf("outboxredis: publish: %w", err))
	} else if p.isClosed() {
		stop = outbox.Outage(fmt.Errorf("outboxredis: publish: %w", redis.ErrClosed))
	}
	if stop != nil {
		for i := range batch {
			fail(i, stop)
		}
		return errs
	}

	all := make([]send, 0, len(batch))
	for i, m := range batch {
		stream, err := p.route.Destination(m)
		if err != nil {
			fail(i, fmt.Errorf("outboxredis: %w", err))
			continue
		}
		all = append(all, send{i: i, stream: stream, args: p.command(stream, m)})
	}
	sends := make([]*send, len(all))
	for k := range all {
		sends[k] = &all[k]
	}
	if p.perMaster != nil {
		p.execPerMaster(ctx, sends)
	} else {
		p.exec(ctx, p.client, sends)
	}
	for _, s := range sends {
		if s.err != nil {
			fail(s.i, s.err)
		}
	}
	if !failed {
		return nil
	}
	return errs
}

// execPerMaster runs one pipeline per cluster master, concurrently, each followed by its
// WAIT on the same connection: WAIT counts the replicas that have every write its own
// connection made.
func (p *Publisher) execPerMaster(ctx context.Context, sends []*send) {
	byMaster := map[*redis.Client][]*send{}
	for _, s := range sends {
		c, err := p.perMaster.MasterForKey(ctx, s.stream)
		if err != nil {
			s.err = classify(err, s.stream)
			continue
		}
		byMaster[c] = append(byMaster[c], s)
	}
	var wg sync.WaitGroup
	for c, ss := range byMaster {
		wg.Go(func() { p.exec(ctx, c, ss) })
	}
	wg.Wait()
}

// exec runs sends as one pipeline on c and records each one's result in it.
func (p *Publisher) exec(ctx context.Context, c redis.Cmdable, sends []*send) {
	if len(sends) == 0 {
		return
	}
	pipe := c.Pipeline()
	cmds := make([]*redis.Cmd, len(sends))
	for k, s := range sends {
		cmds[k] = pipe.Do(ctx, s.args...)
	}
	var wait *redis.Cmd
	if p.cfg.WaitReplicas > 0 {
		wait = pipe.Do(ctx, "WAIT", p.cfg.WaitReplicas, p.cfg.WaitTimeout.Milliseconds())
	}
	_, _ = pipe.Exec(ctx) // every command carries its own error
	moved := false
	for k, s := range sends {
		if _, err := cmds[k].Text(); err != nil {
			s.err = classify(err, s.stream)
			_, isMoved := redis.IsMovedError(err)
			_, isAsk := redis.IsAskError(err)
			moved = moved || isMoved || isAsk
			continue
		}
		if wait != nil {
			s.err = p.replicated(wait, s.stream)
		}
	}
	if moved && p.perMaster != nil {
		p.perMaster.ReloadState(ctx) // a slot moved away from the master we sent it to
	}
}

// replicated returns nil when WAIT reports Config.WaitReplicas replicas, else an outage
// for a message added to stream.
func (p *Publisher) replicated(wait *redis.Cmd, stream string) error {
	got, err := wait.Int64()
	if err != nil {
		return outbox.Outage(fmt.Errorf("outboxredis: stream %q: WAIT %d: %w", stream, p.cfg.WaitReplicas, err))
	}
	if got < int64(p.cfg.WaitReplicas) {
		return outbox.Outage(fmt.Errorf("outboxredis: stream %q: %d of %d replicas acknowledged within %v: %w",
			stream, got, p.cfg.WaitReplicas, p.cfg.WaitTimeout, ErrNotReplicated))
	}
	return nil
}

// command returns the command that adds m to stream: XADD, or the dedup script.
func (p *Publisher) command(stream string, m *outbox.Message) []any {
	size := 8 + 2*(len(m.Headers)+9)
	var args []any
	if p.cfg.DedupWindow > 0 {
		args = make([]any, 0, size+5)
		args = append(args, "EVAL", dedupScript, 2, stream, dedupMarker(stream, m.DedupID()),
			strconv.FormatInt(p.cfg.DedupWindow.Milliseconds(), 10))
	} else {
		args = make([]any, 0, size)
		args = append(args, "XADD", stream)
	}
	if p.cfg.MaxLen > 0 {
		op := "~"
		if p.cfg.MaxLenExact {
			op = "="
		}
		args = append(args, "MAXLEN", op, p.cfg.MaxLen)
	}
	args = append(args, "*")
	return appendFields(args, m)
}
