package outboxnats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/textproto"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/outboxkit/outbox/internal/reconnect"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
)

// Config configures a Publisher. The zero value is usable.
type Config struct {
	// Route maps a message to its subject: a template over the message's topic,
	// aggregate type, event type and key (see outbox.ParseRoute), such as
	// "events.{topic}" or outbox.RouteDebezium. Defaults to "{topic}".
	Route string

	// MaxPending caps async publishes awaiting a PubAck on the connection, over all
	// concurrent Publish calls: a batch larger than that waits for the first PubAcks
	// before it sends the rest. Defaults to 4000 (MaxPendingDefault).
	MaxPending int
}

// MaxPendingDefault is the default of Config.MaxPending, the default of nats.go too.
const MaxPendingDefault = 4000

// pendingAckTimeout is how long a JetStream context made by Dial keeps waiting for a
// PubAck nobody waits for any more (the Publish call gave up on its ctx): it bounds the
// memory and the pending slots such orphans hold.
const pendingAckTimeout = time.Minute

func (c Config) withDefaults() Config {
	c.MaxPending = cmp.Or(c.MaxPending, MaxPendingDefault)
	return c
}

// Validate checks c as New and Dial do, without connecting: a *outbox.ConfigError names
// the field at fault.
func (c Config) Validate() error {
	_, err := c.validate()
	return err
}

// validate checks c and parses its route.
func (c Config) validate() (*outbox.Route, error) {
	if c.MaxPending < 0 {
		return nil, &outbox.ConfigError{Field: "MaxPending", Reason: "must not be negative"}
	}
	route, err := outbox.ParseRoute(c.Route)
	if err != nil {
		return nil, &outbox.ConfigError{Field: "Route", Reason: err.(*outbox.ConfigError).Reason}
	}
	// The template's fixed parts are in every subject: a bad one would make every
	// message a rejection and dead-letter the whole outbox, so refuse it here.
	if reason := checkSubject(route.Example()); reason != "" {
		return nil, &outbox.ConfigError{Field: "Route", Reason: fmt.Sprintf("%q does not form valid subjects: %s", c.Route, reason)}
	}
	return route, nil
}

// Publisher publishes outbox messages to JetStream. It implements outbox.Publisher and
// outbox.Pinger. It is safe for concurrent use.
type Publisher struct {
	route *outbox.Route
	js    jetstream.JetStream
	nc    *nats.Conn
	cfg   Config
	owned bool // Dial made nc: Close closes it

	// reconnected receives a value after each reconnection of a connection Dial made;
	// nil for New's.
	reconnected chan struct{}

	// slots holds one token per message awaiting its PubAck (Config.MaxPending).
	slots chan struct{}

	closeOnce sync.Once
	closed    chan struct{}
}

var (
	_ outbox.Publisher   = (*Publisher)(nil)
	_ outbox.Pinger      = (*Publisher)(nil)
	_ outbox.Reconnector = (*Publisher)(nil)
)

// New returns a Publisher that publishes through js. The caller keeps owning js's
// connection: Close does not close it.
//
// js's own limit on pending async publishes (jetstream.WithPublishAsyncMaxPending,
// 4000 by default) applies next to Config.MaxPending; give js a
// jetstream.WithPublishAsyncTimeout so that PubAcks a cancelled Publish no longer
// waits for do not hold their slot forever.
func New(js jetstream.JetStream, cfg Config) (*Publisher, error) {
	if js == nil {
		return nil, errors.New("outboxnats: New: nil JetStream")
	}
	route, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Publisher{
		route:  route,
		js:     js,
		nc:     js.Conn(),
		cfg:    cfg,
		slots:  make(chan struct{}, cfg.MaxPending),
		closed: make(chan struct{}),
	}, nil
}

// Dial connects to url (nats://host:port, credentials may be in the URL; several URLs
// may be given separated by commas), reconnecting forever with backoff, and returns a
// publisher that owns the connection: Close closes it. Dial fails if no server answers at
// first; once connected, the connection survives any outage.
//
// Dial's defaults can be overridden by opts, which are applied after them: reconnect
// forever with exponential backoff from 25 ms to 100 ms plus jitter, so that a relay
// paused by an outage resumes within about a quarter second of the server's return (the
// publisher reports each reconnection to the relay: outbox.Reconnector), no reconnect buffer
// (a publish while disconnected fails at once as an outage instead of queueing), a ping
// every 10 s so that a dead connection is noticed within about 30 s. The connect timeout
// is ctx's deadline when it has one (nats.go's 2 s otherwise). Credentials never appear in
// the errors Dial returns.
func Dial(ctx context.Context, url string, cfg Config, opts ...nats.Option) (*Publisher, error) {
	if _, err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("outboxnats: connect to %s: %w", redactURL(url), err)
	}
	reconnected := make(chan struct{}, 1)
	defaults := []nats.Option{
		nats.Name("outboxnats"),
		nats.MaxReconnects(-1),
		nats.CustomReconnectDelay(reconnect.Delay),
		nats.ReconnectHandler(func(*nats.Conn) {
			select {
			case reconnected <- struct{}{}:
			default: // one value pending is enough
			}
		}),
		nats.ReconnectBufSize(-1),
		nats.PingInterval(10 * time.Second),
		nats.MaxPingsOutstanding(3),
	}
	if d, ok := ctx.Deadline(); ok {
		defaults = append(defaults, nats.Timeout(max(time.Until(d), time.Millisecond)))
	}
	nc, err := nats.Connect(url, append(defaults, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("outboxnats: connect to %s: %w", redactURL(url), err)
	}
	if err := ctx.Err(); err != nil {
		nc.Close()
		return nil, fmt.Errorf("outboxnats: connect to %s: %w", redactURL(url), err)
	}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(cfg.MaxPending),
		jetstream.WithPublishAsyncTimeout(pendingAckTimeout))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("outboxnats: %w", err)
	}
	p, err := New(js, cfg)
	if err != nil {
		nc.Close()
		return nil, err
	}
	p.owned = true
	p.reconnected = reconnected
	return p, nil
}

// Reconnected implements outbox.Reconnector: the channel receives a value after each
// reconnection of the connection Dial made. It is nil for a publisher made by New, whose
// connection is the caller's (nats.ReconnectHandler is the caller's to set).
func (p *Publisher) Reconnected() <-chan struct{} { return p.reconnected }

// redactURL hides the user information of every URL of a comma-separated list: with
// token authentication the token is the user name, so url.URL.Redacted is not enough.
func redactURL(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if u, err := url.Parse(p); err == nil && u.User != nil {
			u.User = url.User("REDACTED")
			p = u.String()
		} else if i := strings.LastIndex(p, "@"); err != nil && i >= 0 {
			scheme, _, ok := strings.Cut(p[:i], "://")
			if ok {
				scheme += "://"
			} else {
				scheme = ""
			}
			p = scheme + "REDACTED" + p[i:]
		}
		parts[i] = p
	}
	return strings.Join(parts, ",")
}

// Close closes the connection if Dial made it, and makes Publish calls still waiting for
// PubAcks return outages at once. Closing twice is safe. It does not wait for pending
// PubAcks: the relay publishes those messages again (JetStream drops the duplicates).
func (p *Publisher) Close() {
	p.closeOnce.Do(func() {
		close(p.closed)
		if p.owned {
			p.nc.Close()
		}
	})
}

// Ping checks that the server answers and that JetStream is enabled for the account. Its
// errors are outages. Without a deadline on ctx it gives up after 5 s.
func (p *Publisher) Ping(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	if err := p.connErr(); err != nil {
		return outbox.Outage(fmt.Errorf("outboxnats: ping: %w", err))
	}
	if err := p.nc.FlushWithContext(ctx); err != nil {
		return outbox.Outage(fmt.Errorf("outboxnats: ping: %w", err))
	}
	if _, err := p.js.AccountInfo(ctx); err != nil {
		return outbox.Outage(fmt.Errorf("outboxnats: ping: JetStream account info: %w", err))
	}
	return nil
}

// connErr says why the connection cannot publish now, or nil.
func (p *Publisher) connErr() error {
	select {
	case <-p.closed:
		return nats.ErrConnectionClosed
	default:
	}
	switch p.nc.Status() {
	case nats.CONNECTED:
		return nil
	case nats.CLOSED:
		return nats.ErrConnectionClosed
	case nats.RECONNECTING:
		return nats.ErrConnectionReconnecting
	case nats.DRAINING_PUBS, nats.DRAINING_SUBS:
		return nats.ErrConnectionDraining
	default:
		return nats.ErrDisconnected
	}
}

// inflight is a message sent and awaiting its PubAck.
type inflight struct {
	i       int
	subject string
	f       jetstream.PubAckFuture
}

// Publish implements outbox.Publisher. It sends the whole batch without waiting (at most
// Config.MaxPending messages awaiting a PubAck at once), then waits for every PubAck or
// until ctx is done. It returns nil when every message was acked, otherwise a slice of
// len(batch) with nil for the acked ones. See the package documentation for which errors
// are outages.
func (p *Publisher) Publish(ctx context.Context, batch []*outbox.Message) []error {
	if len(batch) == 0 {
		return nil
	}
	var errs []error
	fail := func(i int, err error) {
		if errs == nil {
			errs = make([]error, len(batch))
		}
		errs[i] = err
	}

	if err := ctx.Err(); err != nil {
		err = ctxOutage(err)
		for i := range batch {
			fail(i, err)
		}
		return errs
	}
	if err := p.connErr(); err != nil {
		err = outbox.Outage(fmt.Errorf("outboxnats: publish: %w", err))
		for i := range batch {
			fail(i, err)
		}
		return errs
	}

	pending := make([]inflight, 0, len(batch))
	next := 0 // pending[next:] still await their PubAck
	await := func() {
		fl := pending[next]
		next++
		err := p.await(ctx, fl)
		<-p.slots
		if err != nil {
			fail(fl.i, err)
		}
	}

	for i, m := range batch {
		msg, err := p.Msg(m)
		if err != nil {
			fail(i, err)
			continue
		}
		if err := ctx.Err(); err != nil {
			fail(i, ctxOutage(err)) // do not send what nobody will wait for
			continue
		}
		// Take a pending slot. When none is free, make one by waiting for our own oldest
		// PubAck; only when we hold none do we wait for other callers to free one.
		acquired := p.trySlot()
		for !acquired && next < len(pending) {
			await()
			acquired = p.trySlot()
		}
		if !acquired {
			select {
			case p.slots <- struct{}{}:
				acquired = true
			case <-ctx.Done():
			case <-p.closed:
			}
		}
		if !acquired {
			if err := ctx.Err(); err != nil {
				fail(i, ctxOutage(err))
			} else {
				fail(i, outbox.Outage(fmt.Errorf("outboxnats: publish: %w", nats.ErrConnectionClosed)))
			}
			continue
		}

		opts := []jetstream.PublishOpt{jetstream.WithMsgID(m.DedupID())}
		if d, ok := ctx.Deadline(); ok {
			// nats.go's own pending limit (a shared JetStream context) stalls this long.
			if wait := time.Until(d); wait > 0 {
				opts = append(opts, jetstream.WithStallWait(wait))
			}
		}
		f, err := p.js.PublishMsgAsync(msg, opts...)
		if err != nil {
			<-p.slots
			fail(i, classify(err, msg.Subject))
			continue
		}
		pending = append(pending, inflight{i: i, subject: msg.Subject, f: f})
	}
	for next < len(pending) {
		await()
	}
	return errs
}

// trySlot takes a pending slot if one is free.
func (p *Publisher) trySlot() bool {
	select {
	case p.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

// await waits for fl's PubAck, or until ctx is done or the publisher closed.
func (p *Publisher) await(ctx context.Context, fl inflight) error {
	// A result that is already there wins over a ctx that is done too.
	select {
	case <-fl.f.Ok():
		return nil
	case err := <-fl.f.Err():
		return classify(err, fl.subject)
	default:
	}
	select {
	case <-fl.f.Ok():
		return nil
	case err := <-fl.f.Err():
		return classify(err, fl.subject)
	case <-ctx.Done():
		return outbox.Outage(fmt.Errorf("outboxnats: waiting for the PubAck of subject %q: %w", fl.subject, ctx.Err()))
	case <-p.closed:
		return outbox.Outage(fmt.Errorf("outboxnats: waiting for the PubAck of subject %q: %w", fl.subject, nats.ErrConnectionClosed))
	}
}

func ctxOutage(err error) error {
	return outbox.Outage(fmt.Errorf("outboxnats: publish: %w", err))
}

// Subject returns the subject m goes to, or the rejection of m when the route cannot map
// it or the result is not a valid subject.
func (p *Publisher) Subject(m *outbox.Message) (string, error) {
	subject, err := p.route.Destination(m)
	if err != nil {
		return "", fmt.Errorf("outboxnats: %w", err)
	}
	if reason := checkSubject(subject); reason != "" {
		return "", outbox.Permanent(fmt.Errorf("outboxnats: invalid subject %q for topic %q: %s: %w", subject, m.Topic, reason, nats.ErrBadSubject))
	}
	return subject, nil
}

// Msg builds the NATS message Publish sends for m: subject, headers (the message's own and
// the outbox metadata headers) and payload; Nats-Msg-Id is added at publish time. It
// returns the rejection of m when m can never be published (invalid subject, too large).
// Tests and benchmarks use it to publish exactly what the relay would.
func (p *Publisher) Msg(m *outbox.Message) (*nats.Msg, error) {
	subject, err := p.Subject(m)
	if err != nil {
		return nil, err
	}

	h := make(nats.Header, len(m.Headers)+9)
	m.WireHeaders(h.Set)

	// The server's max_payload bounds headers and payload together. A message over it
	// can never be accepted, so reject it here instead of sending it. WithMsgID adds the
	// Nats-Msg-Id header later: count it now.
	size := len(m.Payload) + headerSize(h, jetstream.MsgIDHeader, m.DedupID())
	if limit := p.nc.MaxPayload(); limit > 0 && int64(size) > limit {
		return nil, outbox.Permanent(fmt.Errorf("outboxnats: message for subject %q is %d bytes (payload %d, headers %d), over the server's max_payload of %d bytes: %w",
			subject, size, len(m.Payload), size-len(m.Payload), limit, nats.ErrMaxPayload))
	}
	return &nats.Msg{Subject: subject, Header: h, Data: m.Payload}, nil
}

// headerSize is the encoded size of h plus one more header extraK: extraV, as nats.go
// computes it ("NATS/1.0\r\n", "Key: value\r\n" per value, "\r\n").
func headerSize(h nats.Header, extraK, extraV string) int {
	n := len("NATS/1.0\r\n") + len("\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(textproto.TrimString(v)) + len(": \r\n")
		}
	}
	return n + len(extraK) + len(textproto.TrimString(extraV)) + len(": \r\n")
}
