package outboxamqp

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox/internal/reconnect"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
)

// Config configures a Publisher. The zero value is usable: every message goes through the
// default exchange to the queue named by its topic.
type Config struct {
	// Exchange is the exchange every message is published to. Defaults to "", the default
	// exchange, which routes a message to the queue whose name is its routing key. The
	// exchange is one name, not a template: publishing to a missing exchange closes the
	// channel and fails every message in flight on it, so an exchange per message would
	// let one bad message stall the whole relay. Route the routing key instead, through a
	// topic exchange.
	Exchange string

	// Route is the routing key template (see outbox.ParseRoute): "{topic}", or
	// "{aggregate_type}.{event_type}" for a topic exchange whose queues bind patterns such
	// as "order.*". Defaults to "{topic}".
	Route string

	// Priority gives a message its AMQP priority (honoured by queues declared with
	// x-max-priority). It is called from several goroutines at once. Defaults to the
	// message's Outbox-Priority header (HeaderPriority), a number from 0 to 255, and to no
	// priority when the message has none.
	Priority func(*outbox.Message) uint8

	// MaxChannels caps the channels the publisher keeps open; each concurrent Publish call
	// uses one, and calls beyond it wait for a free one. Defaults to 32.
	MaxChannels int

	// MaxMessageSize is the largest body Publish sends; a larger message is rejected
	// without being sent (ErrTooLarge). Set it to no more than the server's
	// max_message_size: RabbitMQ answers a larger message by closing the channel, which
	// fails every message in flight as an outage, over and over. Defaults to 16 MiB, the
	// default of RabbitMQ 4 (RabbitMQ 3.x defaults to 128 MiB).
	MaxMessageSize int

	// TLS configures the TLS connection Dial makes for an amqps:// URL: custom root CAs,
	// client certificates for the EXTERNAL mechanism, a server name. Defaults to the
	// system roots and the URL's host name. Dial refuses a TLS config with an amqp:// URL,
	// which would send credentials in the clear.
	TLS *tls.Config
}

// Defaults of Config.
const (
	MaxChannelsDefault    = 32
	MaxMessageSizeDefault = 16 << 20
)

// HeaderPriority is the message header that sets a message's AMQP priority when
// Config.Priority is nil: a decimal number from 0 to 255. Write it with the event
// (Message.Headers) to make the producer, not the relay's configuration, decide what is
// urgent. A value that is not such a number fails the message as a rejection
// (ErrBadProperty).
const HeaderPriority = "Outbox-Priority"

// CloudEventsPrefix is the prefix of the CloudEvents attribute headers in binary content
// mode that the CloudEvents AMQP binding names (outbox.CloudEventsConfig.Prefix).
const CloudEventsPrefix = "cloudEvents:"

// shortstrMax is the longest AMQP short string: routing keys, exchange names,
// message_id, content_type, type and header names are short strings.
const shortstrMax = 255

func (c Config) withDefaults() Config {
	c.Route = cmp.Or(c.Route, outbox.RouteTopic)
	c.MaxChannels = cmp.Or(c.MaxChannels, MaxChannelsDefault)
	c.MaxMessageSize = cmp.Or(c.MaxMessageSize, MaxMessageSizeDefault)
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
	if len(c.Exchange) > shortstrMax {
		return nil, &outbox.ConfigError{Field: "Exchange", Reason: fmt.Sprintf("%d bytes is over AMQP's limit of %d", len(c.Exchange), shortstrMax)}
	}
	route, err := outbox.ParseRoute(c.Route)
	if err != nil {
		var ce *outbox.ConfigError
		if errors.As(err, &ce) {
			return nil, &outbox.ConfigError{Field: "Route", Reason: ce.Reason}
		}
		return nil, err
	}
	// Every routing key starts with the template's literal text: a template whose
	// example is already too long makes every message a rejection.
	if ex := route.Example(); len(ex) > shortstrMax {
		return nil, &outbox.ConfigError{Field: "Route", Reason: fmt.Sprintf("%q forms routing keys such as %q, over AMQP's limit of %d bytes", c.Route, ex, shortstrMax)}
	}
	switch {
	case c.MaxChannels < 0:
		return nil, &outbox.ConfigError{Field: "MaxChannels", Reason: "must not be negative"}
	case c.MaxChannels > 2047:
		return nil, &outbox.ConfigError{Field: "MaxChannels", Reason: fmt.Sprintf("%d is over RabbitMQ's default channel_max of 2047", c.MaxChannels)}
	case c.MaxMessageSize < 0:
		return nil, &outbox.ConfigError{Field: "MaxMessageSize", Reason: "must not be negative"}
	}
	return route, nil
}

// Publisher publishes outbox messages to RabbitMQ with publisher confirms. It implements
// outbox.Publisher and outbox.Pinger. It is safe for concurrent use.
type Publisher struct {
	cfg   Config
	route *outbox.Route
	slots chan struct{} // one token per channel in use (Config.MaxChannels)

	// Set by Dial: the publisher owns its connection and dials it again when it breaks.
	owned bool
	url   string // with credentials; never printed
	safe  string // url redacted, for errors
	// back receives a value when the connection is back: dialled again, or no longer
	// blocked by the broker (outbox.Reconnector).
	back chan struct{}

	frameMax atomic.Int64 // the connection's negotiated frame size; 0 means no limit

	mu      sync.Mutex
	conn    *amqp.Connection // nil while there is none (reconnecting, lost, closed)
	connErr error            // why conn is nil
	blocked string           // the broker's reason while it blocks publishers, else ""
	idle    []*confirmChannel

	closeOnce sync.Once
	closed    chan struct{}
	watching  sync.WaitGroup // the connection watcher
}

var (
	_ outbox.Publisher   = (*Publisher)(nil)
	_ outbox.Pinger      = (*Publisher)(nil)
	_ outbox.Reconnector = (*Publisher)(nil)
)

// errClosed is the cause of every outage after Close.
var errClosed = errors.New("outboxamqp: publisher closed")

// New returns a Publisher that publishes on conn, opening its own channels. The caller
// keeps owning conn: Close closes the publisher's channels, not conn, and when conn
// breaks every Publish fails as an outage until the caller gives the relay a new
// publisher. Use Dial for a publisher that reconnects by itself.
//
// New refuses a connection with the client's automatic recovery (amqp.Config.Recovery):
// recovery reopens channels behind the publisher's back and restarts their delivery
// tags, which would let a new message's confirm stand for an old one.
func New(conn *amqp.Connection, cfg Config) (*Publisher, error) {
	if conn == nil {
		return nil, errors.New("outboxamqp: New: nil connection")
	}
	if conn.IsRecoveryEnabled() {
		return nil, errors.New("outboxamqp: New: the connection has automatic recovery enabled (amqp.Config.Recovery): " +
			"publisher confirms cannot survive it; use a connection without it, or Dial, which reconnects by itself")
	}
	route, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	p := newPublisher(cfg.withDefaults(), route)
	p.setConn(conn)
	p.watching.Add(1)
	go func() {
		defer p.watching.Done()
		p.watch(conn)
	}()
	return p, nil
}

func newPublisher(cfg Config, route *outbox.Route) *Publisher {
	return &Publisher{
		cfg:    cfg,
		route:  route,
		slots:  make(chan struct{}, cfg.MaxChannels),
		closed: make(chan struct{}),
	}
}

// Dial connects to rawURL (amqp://user:password@host:5672/vhost, or amqps:// with
// Config.TLS) and returns a publisher that owns the connection: Close closes it. Dial
// fails if the broker does not answer at first; once connected, the publisher dials
// again whenever the connection breaks, with exponential backoff from 25 ms to 100 ms
// plus jitter, and Publish fails at once as an outage while it is down. It tells the
// relay when the connection is back (outbox.Reconnector), so that a relay paused by the
// outage resumes at once. The connect timeout
// is ctx's deadline when it has one, 30 s otherwise. Credentials never appear in the
// errors Dial returns.
func Dial(ctx context.Context, rawURL string, cfg Config) (*Publisher, error) {
	route, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	safe := RedactURL(rawURL)
	if cfg.TLS != nil && !strings.HasPrefix(strings.ToLower(strings.TrimSpace(rawURL)), "amqps://") {
		return nil, &outbox.ConfigError{Field: "TLS", Reason: fmt.Sprintf("set, but %s is not an amqps:// URL", safe)}
	}
	p := newPublisher(cfg.withDefaults(), route)
	p.owned, p.url, p.safe = true, rawURL, safe
	p.back = make(chan struct{}, 1)

	timeout := 30 * time.Second
	if d, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(d), time.Millisecond)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("outboxamqp: connect to %s: %w", safe, err)
	}
	conn, err := p.dial(timeout)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("outboxamqp: connect to %s: %w", safe, err)
	}
	p.setConn(conn)
	p.watching.Add(1)
	go p.maintain(conn)
	return p, nil
}

// dial makes one connection attempt.
func (p *Publisher) dial(timeout time.Duration) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("outboxamqp")
	cfg := amqp.Config{
		Heartbeat:  10 * time.Second,
		Properties: props,
		Dial:       amqp.DefaultDial(timeout),
	}
	if p.cfg.TLS != nil {
		cfg.TLSClientConfig = p.cfg.TLS.Clone() // the client writes ServerName into it
	}
	conn, err := amqp.DialConfig(p.url, cfg)
	if err != nil {
		return nil, fmt.Errorf("outboxamqp: connect to %s: %w", p.safe, scrubErr(err))
	}
	return conn, nil
}

// scrubErr keeps the URL's credentials out of err: the client's URL parsing errors are
// *url.Error, whose text quotes the whole URL.
func scrubErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("invalid URL: %w", ue.Err)
	}
	return err
}

// RedactURL hides the user information of an AMQP URL (both user name and password), for
// logs and errors.
func RedactURL(s string) string {
	if u, err := url.Parse(s); err == nil {
		if u.User != nil {
			u.User = url.User("REDACTED")
		}
		return u.String()
	}
	if i := strings.LastIndex(s, "@"); i >= 0 {
		scheme, _, ok := strings.Cut(s[:i], "://")
		if ok {
			return scheme + "://REDACTED" + s[i:]
		}
		return "REDACTED" + s[i:]
	}
	return s
}

// maintain watches the owned connection and dials a new one whenever it breaks, until
// Close.
func (p *Publisher) maintain(conn *amqp.Connection) {
	defer p.watching.Done()
	for {
		if !p.watch(conn) {
			return
		}
		for attempt := 0; ; attempt++ {
			select {
			case <-p.closed:
				return
			case <-time.After(reconnect.Delay(attempt)):
			}
			c, err := p.dial(10 * time.Second)
			if err != nil {
				p.mu.Lock()
				p.connErr = fmt.Errorf("reconnecting (attempt %d): %w", attempt+1, err)
				p.mu.Unlock()
				continue
			}
			if !p.setConn(c) {
				_ = c.Close()
				return
			}
			p.notifyBack()
			conn = c
			break
		}
	}
}

// notifyBack reports that the connection is back to the relay (Reconnected), if Dial
// made it.
func (p *Publisher) notifyBack() {
	if p.back == nil {
		return
	}
	select {
	case p.back <- struct{}{}:
	default: // one value pending is enough
	}
}

// Reconnected implements outbox.Reconnector: the channel receives a value each time the
// connection Dial made is dialled again or the broker stops blocking publishers. It is
// nil for a publisher made by New, which never reconnects.
func (p *Publisher) Reconnected() <-chan struct{} { return p.back }

// setConn makes conn the publisher's connection; false if the publisher is closed.
func (p *Publisher) setConn(conn *amqp.Connection) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.closed:
		return false
	default:
	}
	p.conn, p.connErr, p.blocked = conn, nil, ""
	p.frameMax.Store(int64(max(conn.Config.FrameSize, 0)))
	return true
}

// watch follows conn's blocked state until conn closes (true) or the publisher does
// (false).
func (p *Publisher) watch(conn *amqp.Connection) bool {
	closes := conn.NotifyClose(make(chan *amqp.Error, 1))
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	for {
		select {
		case b, ok := <-blocks:
			if !ok {
				blocks = nil
				continue
			}
			p.mu.Lock()
			unblocked := false
			if p.conn == conn {
				unblocked = p.blocked != "" && !b.Active
				p.blocked = ""
				if b.Active {
					p.blocked = cmp.Or(b.Reason, "unknown reason")
				}
			}
			p.mu.Unlock()
			if unblocked {
				p.notifyBack()
			}
		case e := <-closes:
			var cause error = amqp.ErrClosed
			if e != nil {
				cause = e
			}
			p.mu.Lock()
			if p.conn == conn {
				p.conn, p.blocked = nil, ""
				p.connErr = fmt.Errorf("connection lost: %w", cause)
				if !p.owned {
					p.connErr = fmt.Errorf("connection closed (New: the caller owns the connection and must replace the publisher): %w", cause)
				}
			}
			idle := p.idle
			p.idle = nil
			p.mu.Unlock()
			for _, c := range idle {
				c.close()
			}
			return true
		case <-p.closed:
			return false
		}
	}
}

// Close makes Publish and Ping fail as outages from now on, makes Publish calls still
// waiting for confirms return at once (their unconfirmed messages as outages: the relay
// publishes them again), and closes the publisher's channels, and the connection if Dial
// made it. It waits for a reconnection attempt in progress to end (10 s at most).
// Closing twice, or concurrently with Publish, is safe.
func (p *Publisher) Close() {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		close(p.closed)
		conn, idle := p.conn, p.idle
		p.conn, p.idle, p.connErr = nil, nil, errClosed
		p.mu.Unlock()
		if p.owned && conn != nil {
			_ = conn.CloseDeadline(time.Now().Add(5 * time.Second))
		}
		for _, c := range idle {
			c.close()
		}
		p.watching.Wait()
	})
}

// Ping checks that the broker answers on the connection (it opens and closes a channel)
// and, when Config.Exchange is set, that the exchange exists. Its errors are outages.
// Without a deadline on ctx it gives up after 5 s.
func (p *Publisher) Ping(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	conn, err := p.current()
	if err != nil {
		return outbox.Outage(fmt.Errorf("outboxamqp: ping: %w", err))
	}
	done := make(chan error, 1)
	go func() {
		ch, err := conn.Channel()
		if err != nil {
			done <- err
			return
		}
		if p.cfg.Exchange != "" {
			if err := ch.ExchangeDeclarePassive(p.cfg.Exchange, "", false, false, false, false, nil); err != nil {
				done <- fmt.Errorf("%s: %w", exchangeName(p.cfg.Exchange), err)
				return
			}
		}
		done <- ch.Close()
	}()
	select {
	case err = <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		return outbox.Outage(fmt.Errorf("outboxamqp: ping: %w", err))
	}
	return nil
}

// Declare declares t (see Topology.Declare) on a channel of its own, for a service that
// declares its topology at start-up. Its errors are not classified: run it before the
// relay starts.
func (p *Publisher) Declare(ctx context.Context, t *Topology) error {
	conn, err := p.current()
	if err != nil {
		return fmt.Errorf("outboxamqp: declare: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("outboxamqp: declare: open a channel: %w", err)
	}
	defer ch.Close()
	return t.Declare(ctx, ch)
}

// CheckRoute reports whether m's destination exists, for a start-up check of the topics
// the relay will publish: with the default exchange, the queue named by m's routing key
// (without it RabbitMQ returns m as unroutable); with Config.Exchange, the exchange (its
// bindings cannot be seen over AMQP). It returns m's rejection when m cannot be built
// (no routing key, ...), and an error naming the queue or exchange when it is missing.
func (p *Publisher) CheckRoute(ctx context.Context, m *outbox.Message) error {
	key, _, err := p.Publishing(m)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	conn, err := p.current()
	if err != nil {
		return fmt.Errorf("outboxamqp: check route: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("outboxamqp: check route: open a channel: %w", err)
	}
	defer ch.Close()
	if p.cfg.Exchange == "" {
		if _, err := ch.QueueDeclarePassive(key, false, false, false, false, nil); err != nil {
			return fmt.Errorf("outboxamqp: the default exchange routes %q to the queue of that name, which does not exist (RabbitMQ returns such messages as unroutable): %w", key, err)
		}
		return nil
	}
	if err := ch.ExchangeDeclarePassive(p.cfg.Exchange, "", false, false, false, false, nil); err != nil {
		return fmt.Errorf("outboxamqp: %s does not exist: %w", exchangeName(p.cfg.Exchange), err)
	}
	return nil
}

// current returns the connection to publish on, or why there is none.
func (p *Publisher) current() (*amqp.Connection, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.conn == nil:
		return nil, p.connErr
	case p.blocked != "":
		return nil, fmt.Errorf("the broker blocks publishers (%s): a memory or disk alarm, clears when the broker has room again", p.blocked)
	}
	return p.conn, nil
}

// acquire takes a channel slot and returns an open confirm channel, idle or new.
func (p *Publisher) acquire(ctx context.Context) (*confirmChannel, error) {
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.closed:
		return nil, errClosed
	}
	conn, err := p.current()
	if err != nil {
		<-p.slots
		return nil, err
	}
	p.mu.Lock()
	for len(p.idle) > 0 {
		c := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if c.conn == conn && c.usable() {
			p.mu.Unlock()
			return c, nil
		}
		go c.close()
	}
	p.mu.Unlock()
	c, err := openConfirmChannel(conn)
	if err != nil {
		<-p.slots
		return nil, err
	}
	return c, nil
}

// release gives c back to the pool when reusable, else closes it, and frees its slot.
func (p *Publisher) release(c *confirmChannel, reusable bool) {
	p.mu.Lock()
	if reusable && p.conn == c.conn {
		p.idle = append(p.idle, c)
		c = nil
	}
	p.mu.Unlock()
	if c != nil {
		go c.close()
	}
	<-p.slots
}

// Publish implements outbox.Publisher. It sends the whole batch on one channel without
// waiting, then waits for every confirm, or until ctx is done or the publisher closed.
// It returns nil when every message was confirmed and not returned, otherwise a slice of
// len(batch) with nil for the confirmed ones. See the package documentation for which
// errors are outages.
func (p *Publisher) Publish(ctx context.Context, batch []*outbox.Message) []error {
	if len(batch) == 0 {
		return nil
	}
	errs := make([]error, len(batch))
	failAll := func(err error) []error {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	if err := ctx.Err(); err != nil {
		return failAll(outbox.Outage(fmt.Errorf("outboxamqp: publish: %w", err)))
	}
	c, err := p.acquire(ctx)
	if err != nil {
		return failAll(outbox.Outage(fmt.Errorf("outboxamqp: publish: %w", err)))
	}

	b := c.begin(errs)
	for i, m := range batch {
		key, pub, err := p.Publishing(m)
		if err != nil {
			errs[i] = err
			continue
		}
		if err := ctx.Err(); err != nil {
			errs[i] = outbox.Outage(fmt.Errorf("outboxamqp: publish: %w", err)) // not sent
			continue
		}
		if _, err := p.current(); err != nil {
			errs[i] = sendErr(err, p.cfg.Exchange, key) // not sent
			continue
		}
		c.send(i, p.cfg.Exchange, key, &pub)
	}
	c.seal()

	var cause error
	select {
	case <-b.done:
	case <-ctx.Done():
		cause = ctx.Err()
	case <-p.closed:
		cause = errClosed
	}
	if cause != nil {
		cause = outbox.Outage(fmt.Errorf("outboxamqp: waiting for publisher confirms: %w", cause))
	}
	p.release(c, c.finish(cause))

	for _, err := range errs {
		if err != nil {
			return errs
		}
	}
	return nil
}

// Publishing builds what Publish sends for m: the routing key and the AMQP message
// (persistent, mandatory at publish time, message_id set to the dedup key, the content
// type, the event type as the AMQP type, the creation time as the timestamp, the
// priority, and as headers the message's own plus the outbox metadata headers). It
// returns the rejection of m when m can never be published: no routing key (a
// *outbox.RouteError), a field AMQP cannot carry (ErrBadProperty), too large
// (ErrTooLarge). Tests and benchmarks use it to publish exactly what the relay would.
func (p *Publisher) Publishing(m *outbox.Message) (routingKey string, pub amqp.Publishing, err error) {
	key, err := p.route.Destination(m)
	if err != nil {
		return "", pub, err
	}
	bad := func(what string, args ...any) (string, amqp.Publishing, error) {
		return "", amqp.Publishing{}, fmt.Errorf("outboxamqp: message %s with routing key %q: %s: %w", m.ID, key, fmt.Sprintf(what, args...), ErrBadProperty)
	}
	if len(key) > shortstrMax {
		return bad("the routing key is %d bytes, over AMQP's limit of %d", len(key), shortstrMax)
	}
	if len(m.Payload) > p.cfg.MaxMessageSize {
		return "", pub, fmt.Errorf("outboxamqp: message %s with routing key %q: the body is %d bytes, over the limit of %d (Config.MaxMessageSize): %w",
			m.ID, key, len(m.Payload), p.cfg.MaxMessageSize, ErrTooLarge)
	}

	var priority uint8
	if p.cfg.Priority != nil {
		priority = p.cfg.Priority(m)
	} else if v, ok := m.Headers[HeaderPriority]; ok {
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 8)
		if err != nil {
			return bad("header %s is %q, not a number from 0 to 255", HeaderPriority, v)
		}
		priority = uint8(n)
	}

	headers := make(amqp.Table, len(m.Headers)+9)
	var badName string
	m.WireHeaders(func(k, v string) {
		if len(k) > shortstrMax {
			badName = k
		}
		headers[k] = v
	})
	if badName != "" {
		return bad("header name %.40q... is %d bytes, over AMQP's limit of %d", badName, len(badName), shortstrMax)
	}
	pub = amqp.Publishing{
		Headers:      headers,
		ContentType:  m.ContentType,
		DeliveryMode: amqp.Persistent,
		Priority:     priority,
		MessageId:    m.DedupID(),
		Timestamp:    m.CreatedAt,
		Type:         m.EventType,
		Body:         m.Payload,
	}
	for _, f := range []struct{ name, v string }{{"message_id (dedup key)", pub.MessageId}, {"content type", pub.ContentType}, {"type (event type)", pub.Type}} {
		if len(f.v) > shortstrMax {
			return bad("the %s is %d bytes, over AMQP's limit of %d", f.name, len(f.v), shortstrMax)
		}
	}
	if limit := int(p.frameMax.Load()); limit > 0 {
		if size := headerFrameSize(&pub); size > limit {
			return "", amqp.Publishing{}, fmt.Errorf("outboxamqp: message %s with routing key %q: its properties and headers take %d bytes, over the connection's frame size of %d: %w",
				m.ID, key, size, limit, ErrTooLarge)
		}
	}
	return key, pub, nil
}

// headerFrameSize is the size of the content header frame the client writes for pub: it
// must fit one frame, or RabbitMQ closes the connection.
func headerFrameSize(pub *amqp.Publishing) int {
	const (
		frameOverhead = 7 + 1         // type, channel, size; end octet
		headerFixed   = 2 + 2 + 8 + 2 // class, weight, body size, property flags
	)
	n := frameOverhead + headerFixed
	shortstr := func(s string) {
		if s != "" {
			n += 1 + len(s)
		}
	}
	shortstr(pub.ContentType)
	shortstr(pub.MessageId)
	shortstr(pub.Type)
	if len(pub.Headers) > 0 {
		n += 4
		for k, v := range pub.Headers {
			s, _ := v.(string)
			n += 1 + len(k) + 1 + 4 + len(s)
		}
	}
	if pub.DeliveryMode > 0 {
		n++
	}
	if pub.Priority > 0 {
		n++
	}
	if !pub.Timestamp.IsZero() {
		n += 8
	}
	return n
}
