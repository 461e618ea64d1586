package outboxsqs

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	smithy "github.com/aws/smithy-go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/awsdial"
)

// Config configures a Publisher. The zero value is usable.
type Config struct {
	// Route maps a message to its queue: a template over the message's topic, aggregate
	// type, event type and key (see outbox.ParseRoute) that gives a queue name
	// ("orders", "orders.fifo") or a queue URL
	// ("https://sqs.eu-west-1.amazonaws.com/123456789012/orders"). A name is resolved to
	// its URL with GetQueueUrl once and cached. A name ending in ".fifo" is a FIFO queue.
	// Defaults to "{topic}".
	Route string

	// MaxMessageBytes is the largest message Publish sends, counted as SQS counts it
	// (body plus attribute names, types and values), and the largest total of one
	// SendMessageBatch call. A larger message is rejected without being sent. Defaults to
	// 262144 (256 KiB, MaxMessageBytesDefault), the limit SQS has long had; AWS accepts
	// up to 1 MiB (1048576) since 2025: raise it when your queues' MaximumMessageSize
	// allows.
	MaxMessageBytes int

	// MaxInflight caps the SendMessageBatch calls in flight at once, over all
	// concurrent Publish calls. A batch of n messages for one queue needs ceil(n/10)
	// calls. Defaults to 32 (MaxInflightDefault).
	MaxInflight int

	// TLS configures HTTPS for the client that Dial makes: a custom CA
	// (RootCAs), client certificates. Nil means the system's roots. New ignores it: the
	// client given to New brings its own HTTP client.
	TLS *tls.Config
}

// Defaults of Config.
const (
	MaxMessageBytesDefault = 256 << 10
	MaxInflightDefault     = 32
)

// maxBatchEntries is the number of entries SQS allows in one SendMessageBatch call.
const maxBatchEntries = 10

func (c Config) withDefaults() Config {
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, MaxMessageBytesDefault)
	c.MaxInflight = cmp.Or(c.MaxInflight, MaxInflightDefault)
	return c
}

// Validate checks c as New and Dial do, without connecting. Its errors are
// *outbox.ConfigError values naming the field.
func (c Config) Validate() error {
	_, err := c.validate()
	return err
}

// validate checks c and parses its route.
func (c Config) validate() (*outbox.Route, error) {
	switch {
	case c.MaxMessageBytes < 0:
		return nil, &outbox.ConfigError{Field: "MaxMessageBytes", Reason: "must not be negative"}
	case c.MaxMessageBytes > 0 && c.MaxMessageBytes < 1024:
		return nil, &outbox.ConfigError{Field: "MaxMessageBytes", Reason: fmt.Sprintf("%d is below 1024, the smallest MaximumMessageSize of an SQS queue", c.MaxMessageBytes)}
	case c.MaxInflight < 0:
		return nil, &outbox.ConfigError{Field: "MaxInflight", Reason: "must not be negative"}
	}
	route, err := outbox.ParseRoute(c.Route)
	if err != nil {
		var ce *outbox.ConfigError
		if errors.As(err, &ce) {
			return nil, &outbox.ConfigError{Field: "Route", Reason: ce.Reason}
		}
		return nil, &outbox.ConfigError{Field: "Route", Reason: err.Error()}
	}
	// The template's fixed parts are in every queue name: a bad one would make every
	// message a rejection and dead-letter the whole outbox, so refuse it here.
	if _, reason := checkQueue(route.Example()); reason != "" {
		return nil, &outbox.ConfigError{Field: "Route", Reason: fmt.Sprintf("%q does not form valid queue names or URLs: %s", route.String(), reason)}
	}
	if t := route.String(); isURL(t) && strings.Contains(t, "{") && strings.LastIndexByte(t, '/') > strings.IndexByte(t, '{') {
		return nil, &outbox.ConfigError{Field: "Route", Reason: fmt.Sprintf("%q: placeholders may fill only the queue name, after the URL's last slash (https://sqs.eu-west-1.amazonaws.com/123456789012/{topic})", t)}
	}
	return route, nil
}

// urlRoute returns, for a route that gives queue URLs, the part of every URL before the
// queue name (scheme, host and account); "" for a route that gives queue names.
func urlRoute(route *outbox.Route) string {
	t := route.String()
	if !isURL(t) {
		return ""
	}
	return t[:strings.LastIndexByte(t, '/')+1]
}

// ErrClosed is matched (errors.Is) by the outages of a Publisher that was closed.
var ErrClosed = errors.New("outboxsqs: publisher closed")

// Publisher publishes outbox messages to Amazon SQS queues. It implements
// outbox.Publisher and outbox.Pinger. It is safe for concurrent use.
type Publisher struct {
	client *sqs.Client
	route  *outbox.Route
	cfg    Config

	// conns are the connections of the HTTP client Dial made, which Close closes.
	conns *connSet

	// slots holds one token per SendMessageBatch call in flight (Config.MaxInflight).
	slots chan struct{}

	mu     sync.Mutex
	queues map[string]*queueURL // by queue name

	// lastQueue is the queue name or URL of the last successful send, which Ping checks
	// when the route has placeholders.
	lastQueue atomic.Pointer[string]

	life      *awsdial.Life
	closeOnce sync.Once
}

// queueURL is a queue name's URL, resolved once: done is closed when url or err is set.
type queueURL struct {
	done chan struct{}
	url  string
	err  error
}

var (
	_ outbox.Publisher = (*Publisher)(nil)
	_ outbox.Pinger    = (*Publisher)(nil)
)

// New returns a Publisher that sends through client. The client's retryer, region,
// credentials and endpoint apply; Close leaves the client as it is.
func New(client *sqs.Client, cfg Config) (*Publisher, error) {
	if client == nil {
		return nil, errors.New("outboxsqs: New: nil client")
	}
	route, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Publisher{
		client: client,
		route:  route,
		cfg:    cfg,
		slots:  make(chan struct{}, cfg.MaxInflight),
		queues: map[string]*queueURL{},
		life:   awsdial.NewLife(),
	}, nil
}

// Dial makes an SQS client from rawURL and returns a publisher that owns it. The URL is
// "sqs://" with optional query parameters:
//
//	region    the AWS region ("eu-west-1"); default: the SDK's (AWS_REGION, the profile)
//	endpoint  the service endpoint, for emulators and VPC endpoints ("http://127.0.0.1:4566")
//	profile   the shared configuration profile to load
//
// such as "sqs://?region=eu-west-1". Credentials come from the SDK's default chain
// (environment, shared files, SSO, web identity, container and instance roles), never
// from the URL; optFns, applied last, override any of it (config.WithCredentialsProvider,
// config.WithRetryMaxAttempts, ...). The HTTP client keeps up to Config.MaxInflight
// connections alive and uses Config.TLS (a CA bundle named by AWS_CA_BUNDLE or the
// profile is added to it). The SDK's standard retryer retries throttled,
// failed and unanswered calls up to 3 times with backoff; there is no connection to keep:
// each call finds or makes one.
//
// Dial checks that SQS answers (Ping) and fails if it does not. A missing queue does
// not fail it: Publish reports it as an outage naming the queue (CheckQueue tells at
// start-up), so that a relay started before its queues pauses instead of exiting.
func Dial(ctx context.Context, rawURL string, cfg Config, optFns ...func(*config.LoadOptions) error) (*Publisher, error) {
	if _, err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	params, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}

	conns := &connSet{conns: map[*trackedConn]struct{}{}}
	httpClient := awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
		tr.MaxIdleConnsPerHost = cfg.MaxInflight
		if cfg.TLS != nil {
			tr.TLSClientConfig = cfg.TLS.Clone()
			if cfg.TLS.RootCAs != nil {
				// The SDK appends AWS_CA_BUNDLE's certificates to it: not to the caller's.
				tr.TLSClientConfig.RootCAs = cfg.TLS.RootCAs.Clone()
			}
		}
		tr.DialContext = conns.dialer(tr.DialContext)
	})
	opts := []func(*config.LoadOptions) error{config.WithHTTPClient(httpClient)}
	if params.Region != "" {
		opts = append(opts, config.WithRegion(params.Region))
	}
	if params.Profile != "" {
		opts = append(opts, config.WithSharedConfigProfile(params.Profile))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, append(opts, optFns...)...)
	if err != nil {
		return nil, fmt.Errorf("outboxsqs: load AWS configuration for %s: %w", redactURL(rawURL), err)
	}
	client := sqs.NewFromConfig(awsCfg, func(o *sqs.Options) {
		if params.Endpoint != "" {
			o.BaseEndpoint = aws.String(params.Endpoint)
		}
		o.HTTPClient = BufferRequests(o.HTTPClient)
	})
	p, err := New(client, cfg)
	if err != nil {
		return nil, err
	}
	p.conns = conns
	if err := p.Ping(ctx); err != nil && !errors.Is(err, ErrNoQueue) {
		p.Close()
		return nil, fmt.Errorf("outboxsqs: connect to %s: %w", redactURL(rawURL), err)
	}
	return p, nil
}

// parseURL reads an "sqs://?region=...&endpoint=...&profile=..." URL.
func parseURL(rawURL string) (awsdial.Params, error) { return awsdial.Parse("sqs", rawURL) }

// redactURL hides user information and the endpoint's, should either carry any.
func redactURL(s string) string { return awsdial.Redact(s) }

// Client returns the SQS client the publisher sends through: the one given to New, or
// the one Dial made, for other calls with the same settings (creating queues,
// receiving). Close closes a Dial-made client's connections.
func (p *Publisher) Client() *sqs.Client { return p.client }

// Close makes Publish and Ping return outages (errors.Is(err, ErrClosed)) from now on,
// cancels the calls in flight (their messages' outcome is unknown: they are outages and
// the relay sends them again) and, for a publisher made by Dial, closes its
// connections. Closing twice is safe.
func (p *Publisher) Close() {
	p.closeOnce.Do(func() {
		p.life.Close()
		if p.conns != nil {
			p.conns.close()
		}
	})
}

// Ping checks that SQS answers: GetQueueUrl of the route's queue when it has no
// placeholders (so a missing queue is reported), else of the queue last sent to, else
// ListQueues. An access-denied answer counts as an answer: Publish reports what the
// credentials may not do. Its errors are outages. Without a deadline on ctx it gives up
// after 5 s.
func (p *Publisher) Ping(ctx context.Context) error {
	ctx, cancel := p.life.PingCtx(ctx)
	defer cancel()
	if p.life.Closed() {
		return outbox.Outage(fmt.Errorf("outboxsqs: ping: %w", ErrClosed))
	}
	dest, ok := p.route.Static()
	if !ok {
		if last := p.lastQueue.Load(); last != nil {
			dest = *last
		}
	}
	var err error
	if dest == "" {
		_, err = p.client.ListQueues(ctx, &sqs.ListQueuesInput{MaxResults: aws.Int32(1)})
	} else {
		err = p.lookup(ctx, dest)
	}
	switch {
	case err == nil || accessDenied(err):
		return nil
	case p.life.Closed():
		err = ErrClosed
	case dest != "":
		err = classify(err, dest)
	}
	return outbox.Outage(fmt.Errorf("outboxsqs: ping: %w", err))
}

// CheckQueue reports whether the queue m is routed to exists: nil, the rejection Publish
// would return for m (no route, an invalid queue), or an outage (*NoQueueError for a
// missing queue, network errors). Publish needs no such check; it is for start-up
// checks such as the warnings `outbox relay` logs for pending messages.
func (p *Publisher) CheckQueue(ctx context.Context, m *outbox.Message) error {
	dest, _, err := p.destination(m)
	if err != nil {
		return err
	}
	ctx, cancel := p.callCtx(ctx)
	defer cancel()
	if err := p.lookup(ctx, dest); err != nil && !accessDenied(err) {
		if ctx.Err() != nil {
			return p.ctxOutage(ctx, dest)
		}
		return lookupError(err, dest)
	}
	return nil
}

// lookup asks SQS for the URL of dest, a queue name or URL (GetQueueUrl).
func (p *Publisher) lookup(ctx context.Context, dest string) error {
	in := &sqs.GetQueueUrlInput{QueueName: aws.String(dest)}
	if isURL(dest) {
		account, name := urlAccountAndName(dest)
		in = &sqs.GetQueueUrlInput{QueueName: aws.String(name), QueueOwnerAWSAccountId: account}
	}
	_, err := p.client.GetQueueUrl(ctx, in)
	return err
}

func accessDenied(err error) bool {
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch normalizeCode(apiErr.ErrorCode()) {
	case "AccessDenied", "AccessDeniedException":
		return true
	}
	return false
}

// callCtx returns ctx, cancelled also when the publisher is closed.
func (p *Publisher) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return p.life.CallCtx(ctx)
}

// Publish implements outbox.Publisher. It groups the batch by queue and sends each
// queue's messages in SendMessageBatch calls of up to 10 entries and
// Config.MaxMessageBytes, all calls at once (at most Config.MaxInflight in flight over
// all Publish calls). It returns nil when SQS accepted every message, otherwise a slice
// of len(batch) with nil for the accepted ones. See the package documentation for which
// errors are outages.
func (p *Publisher) Publish(ctx context.Context, batch []*outbox.Message) []error {
	if len(batch) == 0 {
		return nil
	}
	errs := make([]error, len(batch))
	if err := p.stopped(ctx); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	ctx, cancel := p.callCtx(ctx)
	defer cancel()

	byQueue := map[string][]entry{}
	for i, m := range batch {
		e, dest, err := p.entry(m)
		if err != nil {
			errs[i] = err
			continue
		}
		e.i = i
		e.req.Id = aws.String(strconv.Itoa(i))
		byQueue[dest] = append(byQueue[dest], e)
	}
	var wg sync.WaitGroup
	for dest, entries := range byQueue {
		wg.Go(func() { p.sendQueue(ctx, dest, entries, errs) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return errs
		}
	}
	return nil
}

// stopped returns the outage that ends a Publish before it sends anything, or nil.
func (p *Publisher) stopped(ctx context.Context) error {
	if p.life.Closed() {
		return outbox.Outage(fmt.Errorf("outboxsqs: publish: %w", ErrClosed))
	}
	if err := ctx.Err(); err != nil {
		return outbox.Outage(fmt.Errorf("outboxsqs: publish: %w", err))
	}
	return nil
}

// entry encodes m for its queue, or returns the rejection of m: no route, no valid
// queue, too large.
func (p *Publisher) entry(m *outbox.Message) (entry, string, error) {
	dest, name, err := p.destination(m)
	if err != nil {
		return entry{}, "", err
	}
	req, size, err := encode(m, isFIFO(name))
	if err != nil {
		return entry{}, "", err
	}
	if size > p.cfg.MaxMessageBytes {
		return entry{}, "", fmt.Errorf("outboxsqs: message for queue %q is %d bytes (body %d, attributes %d), over the limit of %d bytes (Config.MaxMessageBytes): %w",
			dest, size, len(*req.MessageBody), size-len(*req.MessageBody), p.cfg.MaxMessageBytes, ErrTooLarge)
	}
	return entry{req: req, size: size}, dest, nil
}

// destination returns m's queue, as the route gives it (a name or URL) and its name,
// or the rejection of m.
func (p *Publisher) destination(m *outbox.Message) (dest, name string, err error) {
	dest, err = p.route.Destination(m)
	if err != nil {
		return "", "", err
	}
	// A message's fields never choose the account or the endpoint: a route of names gives
	// names, and a route of URLs fills only the queue name after its fixed part.
	if prefix := urlRoute(p.route); prefix == "" && isURL(dest) {
		return "", "", fmt.Errorf("outboxsqs: route %q gives %q for topic %q: a message's fields may name a queue, not a queue URL: %w", p.route.String(), dest, m.Topic, ErrInvalidQueue)
	} else if prefix != "" && strings.Contains(dest[len(prefix):], "/") {
		return "", "", fmt.Errorf("outboxsqs: route %q gives %q for topic %q: a message's fields may fill the queue name only: %w", p.route.String(), dest, m.Topic, ErrInvalidQueue)
	}
	name, reason := checkQueue(dest)
	if reason != "" {
		return "", "", fmt.Errorf("outboxsqs: route %q gives %q for topic %q: %s: %w", p.route.String(), dest, m.Topic, reason, ErrInvalidQueue)
	}
	return dest, name, nil
}

// Entry returns the SendMessageBatch entry Publish sends for m (without its Id) and the
// queue name or URL the route gives, or the rejection of m. Tests and benchmarks use it
// to send exactly what the relay would.
func (p *Publisher) Entry(m *outbox.Message) (types.SendMessageBatchRequestEntry, string, error) {
	e, dest, err := p.entry(m)
	return e.req, dest, err
}

// sendQueue resolves dest and sends entries there in batches, all at once, recording each
// entry's outcome in errs.
func (p *Publisher) sendQueue(ctx context.Context, dest string, entries []entry, errs []error) {
	url, err := p.queueURL(ctx, dest)
	if err != nil {
		for _, e := range entries {
			errs[e.i] = err
		}
		return
	}
	var wg sync.WaitGroup
	start, total := 0, 0
	for i, e := range entries {
		if i-start == maxBatchEntries || (i > start && total+e.size > p.cfg.MaxMessageBytes) {
			chunk := entries[start:i]
			wg.Go(func() { p.sendBatch(ctx, dest, url, chunk, errs) })
			start, total = i, 0
		}
		total += e.size
	}
	chunk := entries[start:]
	wg.Go(func() { p.sendBatch(ctx, dest, url, chunk, errs) })
	wg.Wait()
}

// sendBatch sends one SendMessageBatch call (awsdial.Batch: a call SQS refuses as a whole
// for its contents is sent again entry by entry).
func (p *Publisher) sendBatch(ctx context.Context, dest, url string, chunk []entry, errs []error) {
	awsdial.Batch[entry]{
		Slots:    p.slots,
		Outage:   func(ctx context.Context) error { return p.ctxOutage(ctx, dest) },
		Classify: func(err error) error { return classify(err, dest) },
		Record:   func(e entry, err error) { errs[e.i] = err },
		Call: func(ctx context.Context, chunk []entry) ([]error, error) {
			reqs := make([]types.SendMessageBatchRequestEntry, len(chunk))
			for i, e := range chunk {
				reqs[i] = e.req
			}
			out, err := p.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: reqs})
			if err != nil {
				return nil, err
			}
			p.lastQueue.Store(&dest)
			done := make(map[string]error, len(chunk))
			for _, s := range out.Successful {
				done[aws.ToString(s.Id)] = nil
			}
			for _, f := range out.Failed {
				done[aws.ToString(f.Id)] = entryError(dest, f)
			}
			results := make([]error, len(chunk))
			for i, e := range chunk {
				err, ok := done[*e.req.Id]
				if !ok {
					err = outbox.Outage(fmt.Errorf("outboxsqs: queue %q: SendMessageBatch returned no result for entry %s", dest, *e.req.Id))
				}
				results[i] = err
			}
			return results, nil
		},
	}.Send(ctx, chunk)
}

// ctxOutage is the outage of a call that ctx ended: the caller's deadline or Close.
func (p *Publisher) ctxOutage(ctx context.Context, dest string) error {
	return p.life.Outage(ctx, "outboxsqs", "queue", dest, ErrClosed)
}

// queueURL returns the URL of dest, a queue name or URL, resolving a name with
// GetQueueUrl once. Failures are not cached: a queue created later is found.
func (p *Publisher) queueURL(ctx context.Context, dest string) (string, error) {
	if isURL(dest) {
		return dest, nil
	}
	p.mu.Lock()
	q, ok := p.queues[dest]
	if !ok {
		q = &queueURL{done: make(chan struct{})}
		p.queues[dest] = q
	}
	p.mu.Unlock()
	if ok {
		select {
		case <-q.done:
			return q.url, q.err
		case <-ctx.Done():
			return "", p.ctxOutage(ctx, dest)
		}
	}
	out, err := p.client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(dest)})
	switch {
	case err != nil && ctx.Err() != nil:
		q.err = p.ctxOutage(ctx, dest)
	case err != nil:
		q.err = lookupError(err, dest)
	default:
		q.url = aws.ToString(out.QueueUrl)
	}
	if q.err != nil {
		p.mu.Lock()
		delete(p.queues, dest)
		p.mu.Unlock()
	}
	close(q.done)
	return q.url, q.err
}

func isURL(dest string) bool {
	return strings.HasPrefix(dest, "https://") || strings.HasPrefix(dest, "http://")
}

func isFIFO(name string) bool { return strings.HasSuffix(name, ".fifo") }

// urlAccountAndName splits a queue URL's path ("/123456789012/orders").
func urlAccountAndName(queueURL string) (account *string, name string) {
	u, err := url.Parse(queueURL)
	if err != nil {
		return nil, ""
	}
	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	name = parts[len(parts)-1]
	if len(parts) >= 2 && parts[len(parts)-2] != "" {
		account = aws.String(parts[len(parts)-2])
	}
	return account, name
}

// queueName returns the name of a queue given by name or URL.
func queueName(dest string) string {
	if isURL(dest) {
		_, name := urlAccountAndName(dest)
		return name
	}
	return dest
}

// checkQueue returns dest's queue name and "", or why dest is neither a valid queue name
// nor a queue URL. SQS queue names have 1 to 80 characters, letters, digits, hyphens and
// underscores, and a FIFO queue's name ends in ".fifo" (counted in the 80).
func checkQueue(dest string) (name, reason string) {
	if isURL(dest) {
		u, err := url.Parse(dest)
		if err != nil || u.Host == "" {
			return "", "not a valid URL"
		}
		if u.RawQuery != "" || u.Fragment != "" {
			return "", "a queue URL has no query or fragment"
		}
		_, name = urlAccountAndName(dest)
	} else {
		name = dest
	}
	switch {
	case name == "":
		return "", "empty queue name"
	case len(name) > 80:
		return "", fmt.Sprintf("queue name of %d characters is over the limit of 80", len(name))
	}
	base := strings.TrimSuffix(name, ".fifo")
	if base == "" {
		return "", "empty queue name before .fifo"
	}
	for i := 0; i < len(base); i++ {
		c := base[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return "", fmt.Sprintf("queue name %q contains %q; use letters, digits, hyphens and underscores (and a .fifo suffix for FIFO queues)", name, c)
		}
	}
	return name, ""
}

// BufferRequests returns an HTTP client for the SDK that sends through c (a new
// awshttp.BuildableClient when c is nil) and reads each request body into memory
// before sending it. It works around a race in aws-sdk-go-v2 (aws/aws-sdk-go-v2#2737):
// the SDK closes the request body as soon as the response headers arrive, while
// net/http may still read it to check its length; the read fails, net/http closes the
// connection under the response, and the call fails with "use of closed network
// connection" after SQS has done it, so the SDK's retry sends the messages again. Dial's
// client uses it; give it to the client you pass to New:
//
//	client := sqs.NewFromConfig(cfg, func(o *sqs.Options) {
//		o.HTTPClient = outboxsqs.BufferRequests(o.HTTPClient)
//	})
//
// SQS request bodies are small (at most a few MiB), so the copy costs little.
func BufferRequests(c sqs.HTTPClient) sqs.HTTPClient {
	if c == nil {
		c = awshttp.NewBuildableClient()
	}
	return bufferedClient{c}
}

type bufferedClient struct{ c sqs.HTTPClient }

func (b bufferedClient) Do(req *http.Request) (*http.Response, error) {
	if req.Body != nil && req.Body != http.NoBody {
		body, err := io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("outboxsqs: read request body: %w", err)
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	return b.c.Do(req)
}

// connSet tracks the connections of the HTTP client Dial makes, so that Close can close
// them: the SDK's HTTP client does not give access to its transport.
type connSet struct {
	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	closed bool
}

type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// dialer wraps dial so that the connections it makes are tracked and no new one is
// made after close.
func (s *connSet) dialer(dial dialFunc) dialFunc {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			_ = c.Close()
			return nil, ErrClosed
		}
		tc := &trackedConn{Conn: c, set: s}
		s.conns[tc] = struct{}{}
		return tc, nil
	}
}

func (s *connSet) close() {
	s.mu.Lock()
	s.closed = true
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()
	for c := range conns {
		_ = c.Conn.Close()
	}
}

type trackedConn struct {
	net.Conn
	set  *connSet
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.set.mu.Lock()
		delete(c.set.conns, c)
		c.set.mu.Unlock()
	})
	return c.Conn.Close()
}

// lookupError classifies the error of looking dest's queue up. A failed lookup is never a
// message's fault: an outage, of the queue alone when it does not exist.
func lookupError(err error, dest string) error {
	if err = classify(err, dest); !outbox.IsUnavailable(err) {
		err = outbox.Outage(err)
	}
	return err
}
