package outboxwebhook

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
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/outboxkit/outbox"
)

// Config configures a Publisher.
type Config struct {
	// URL is the endpoint base, http:// or https://. A message goes to URL with its
	// route's destination appended as a path segment (see Route). User information in it
	// (https://user:password@host/) is sent as HTTP basic authentication, and a query
	// (?token=...) is kept on every request; neither ever appears in an error, nor does
	// the path (it may hold a token, as in /services/T000/B000/<token>): errors, logs and
	// dead letters' last_error show the scheme and host only. Ping checks
	// this URL. Required (Dial takes it as its argument).
	URL string

	// Route maps a message to the URL it is posted to, by an outbox.ParseRoute template.
	// A template that starts with http:// or https:// is a whole URL whose scheme and host
	// are written out: placeholders may fill only its path and query
	// ("https://hooks.example/in/{aggregate_type}"). Any other template is a path appended
	// to URL's path with one slash between ("{topic}" posts a message with topic
	// "order.placed" to <URL>/order.placed). Either way, a placeholder's value is escaped
	// whole (every byte but letters, digits and "-._~"), so that a message's fields can
	// never choose the host, add path segments or a query: a topic "a/b" goes to
	// <URL>/a%2Fb, and a value "." or ".." is refused. To post every message to one URL,
	// give that URL as the Route. Defaults to "{topic}".
	Route string

	// Secrets sign every request, one HMAC-SHA256 signature per secret in the
	// Outbox-Signature header (see Sign). Give two during a rotation. Use 32 random
	// bytes or more per secret. Required unless Unsigned.
	Secrets [][]byte

	// Unsigned sends requests without an Outbox-Signature header, for receivers that
	// authenticate the publisher otherwise (mutual TLS, basic authentication in URL).
	// Defaults to false: Secrets are required.
	Unsigned bool

	// Timeout bounds one request, from sending it to reading the answer's status. A
	// request that times out fails as an outage: the receiver may have stored it. Zero
	// means 10s (TimeoutDefault); a negative value means no limit but Publish's ctx.
	Timeout time.Duration

	// MaxConcurrency caps the requests in flight over all concurrent Publish calls; the
	// messages of a batch are sent at once up to that cap. Dial's client keeps as many
	// idle connections per host, so that the next batch finds them open. Defaults to 64
	// (MaxConcurrencyDefault).
	MaxConcurrency int

	// TLS configures Dial's client: a custom root CA, a client certificate for mutual
	// TLS. Nil means the system's roots. New refuses it: configure TLS on the client's
	// transport instead.
	TLS *tls.Config
}

// Defaults of Config.
const (
	TimeoutDefault        = 10 * time.Second
	MaxConcurrencyDefault = 64
)

// maxRetryAfter caps how long a Retry-After makes a Publisher leave a host alone, so
// that a misconfigured receiver cannot stop the relay for days.
const maxRetryAfter = 5 * time.Minute

const userAgent = "outboxwebhook (github.com/outboxkit/outbox)"

func (c Config) withDefaults() Config {
	c.Timeout = cmp.Or(c.Timeout, TimeoutDefault)
	c.MaxConcurrency = cmp.Or(c.MaxConcurrency, MaxConcurrencyDefault)
	return c
}

// Validate reports the first problem of c as an *outbox.ConfigError naming the field,
// as New and Dial would (Dial fills URL first).
func (c Config) Validate() error {
	_, _, err := c.parse()
	return err
}

// parse validates c and returns its URL and route.
func (c Config) parse() (*url.URL, *outbox.Route, error) {
	if c.URL == "" {
		return nil, nil, &outbox.ConfigError{Field: "URL", Reason: "required: the receiver's endpoint, http://... or https://..."}
	}
	base, err := url.Parse(c.URL)
	if err != nil {
		// url.Parse's error quotes the URL, with its credentials.
		return nil, nil, &outbox.ConfigError{Field: "URL", Reason: "not a valid URL"}
	}
	if base.Scheme != "http" && base.Scheme != "https" || base.Host == "" {
		return nil, nil, &outbox.ConfigError{Field: "URL", Reason: fmt.Sprintf("%s: want http://host/... or https://host/...", redactURL(base))}
	}
	route, err := outbox.ParseRoute(c.Route)
	if err != nil {
		var ce *outbox.ConfigError
		if errors.As(err, &ce) {
			return nil, nil, &outbox.ConfigError{Field: "Route", Reason: ce.Reason}
		}
		return nil, nil, err
	}
	if err := checkRoute(base, route); err != nil {
		return nil, nil, &outbox.ConfigError{Field: "Route", Reason: fmt.Sprintf("%q does not form URLs: %v", route, err)}
	}
	switch {
	case len(c.Secrets) == 0 && !c.Unsigned:
		return nil, nil, &outbox.ConfigError{Field: "Secrets", Reason: "required to sign requests (or set Unsigned for a receiver that authenticates the publisher otherwise)"}
	case len(c.Secrets) > 0 && c.Unsigned:
		return nil, nil, &outbox.ConfigError{Field: "Unsigned", Reason: "set together with Secrets: choose one"}
	}
	for i, s := range c.Secrets {
		if len(s) == 0 {
			return nil, nil, &outbox.ConfigError{Field: fmt.Sprintf("Secrets[%d]", i), Reason: "empty"}
		}
	}
	if c.MaxConcurrency < 0 {
		return nil, nil, &outbox.ConfigError{Field: "MaxConcurrency", Reason: "must not be negative"}
	}
	return base, route, nil
}

// Publisher posts outbox messages to a webhook receiver. It implements outbox.Publisher
// and outbox.Pinger. It is safe for concurrent use.
type Publisher struct {
	client    *http.Client
	transport *http.Transport // made by Dial: Close closes its idle connections
	cfg       Config
	base      *url.URL
	route     *outbox.Route
	now       func() time.Time

	// slots holds one token per request in flight (Config.MaxConcurrency).
	slots chan struct{}

	holdMu sync.Mutex
	holds  map[string]time.Time // host -> not before, from a Retry-After

	mu       sync.Mutex // orders calls.Add against Close
	calls    sync.WaitGroup
	closeCtx context.Context
	closeFn  context.CancelCauseFunc
}

var (
	_ outbox.Publisher = (*Publisher)(nil)
	_ outbox.Pinger    = (*Publisher)(nil)
)

// New returns a Publisher that sends with a copy of client: its transport, proxy,
// TLS settings and Timeout apply, but redirects are never followed (see the package
// documentation). The caller keeps owning client's transport: Close does not close its
// connections. Tune the transport for the load: http.DefaultTransport keeps only two
// idle connections per host, so a batch sent with more concurrency than that opens new
// ones every time; NewTransport returns one tuned as Dial's. New contacts nobody.
func New(client *http.Client, cfg Config) (*Publisher, error) {
	if client == nil {
		return nil, errors.New("outboxwebhook: New: nil http.Client (Dial makes one)")
	}
	if cfg.TLS != nil {
		return nil, &outbox.ConfigError{Field: "TLS", Reason: "New sends with the caller's http.Client: set TLS on its transport, or use Dial"}
	}
	c := *client
	c.CheckRedirect = noRedirects
	return newPublisher(&c, nil, cfg)
}

// Dial returns a Publisher posting to the endpoint base (Config.URL, which may be left
// empty) with an HTTP client of its own, tuned for the relay's load: as many idle
// connections per host as Config.MaxConcurrency, HTTP/2 when the receiver offers it over
// TLS, Config.TLS, the proxy of the environment (HTTPS_PROXY, NO_PROXY). Close closes its
// connections. Dial checks with Ping that the receiver answers, bounded by ctx and the
// Timeout, and fails with an outage if it does not; the endpoint's credentials never
// appear in its errors. There is no connection to keep up: net/http dials as requests
// need connections, so after an outage the next request simply dials again.
func Dial(ctx context.Context, endpoint string, cfg Config) (*Publisher, error) {
	if cfg.URL != "" && cfg.URL != endpoint {
		return nil, &outbox.ConfigError{Field: "URL", Reason: "differs from Dial's endpoint: leave it empty"}
	}
	cfg.URL = endpoint
	t := NewTransport(cfg)
	p, err := newPublisher(&http.Client{Transport: t, CheckRedirect: noRedirects}, t, cfg)
	if err != nil {
		return nil, err
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// NewTransport returns the transport Dial sends with, for cfg: Config.TLS, as many idle
// connections per host as Config.MaxConcurrency, HTTP/2 when the receiver offers it over
// TLS, the proxy of the environment. Give it to New inside a client of your own to wrap
// it (a RoundTripper adding an Authorization header, say) without losing the tuning.
func NewTransport(cfg Config) *http.Transport {
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       cfg.TLS.Clone(),
		TLSHandshakeTimeout:   10 * time.Second,
		ForceAttemptHTTP2:     true,
		MaxIdleConnsPerHost:   cmp.Or(cfg.MaxConcurrency, MaxConcurrencyDefault),
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}

func newPublisher(client *http.Client, t *http.Transport, cfg Config) (*Publisher, error) {
	base, route, err := cfg.parse()
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	closeCtx, closeFn := context.WithCancelCause(context.Background())
	return &Publisher{
		client:    client,
		transport: t,
		cfg:       cfg,
		base:      base,
		route:     route,
		now:       time.Now,
		slots:     make(chan struct{}, cfg.MaxConcurrency),
		holds:     map[string]time.Time{},
		closeCtx:  closeCtx,
		closeFn:   closeFn,
	}, nil
}

// noRedirects makes the client return a redirect as the answer: a 301, 302 or 303 would
// turn the POST into a GET without its body, and any redirect would send signed events
// to an address nobody configured.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// Close cancels the requests in flight (their messages fail as outages: the receiver may
// have them or not, and the relay sends them again), waits until every Publish and Ping
// call has returned, and closes the idle connections of a client that Dial made. Later
// calls fail with ErrClosed as an outage. Closing twice is safe.
func (p *Publisher) Close() {
	p.mu.Lock()
	p.closeFn(ErrClosed)
	p.mu.Unlock()
	p.calls.Wait()
	if p.transport != nil {
		p.transport.CloseIdleConnections()
	}
}

// begin registers a Publish or Ping call. It returns ctx merged with Close (whose cause
// is then ErrClosed) and the function that ends the call, or an outage after Close.
func (p *Publisher) begin(ctx context.Context) (context.Context, func(), error) {
	p.mu.Lock()
	if p.closeCtx.Err() != nil {
		p.mu.Unlock()
		return nil, nil, outbox.Outage(ErrClosed)
	}
	p.calls.Add(1)
	p.mu.Unlock()
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(p.closeCtx, func() { cancel(ErrClosed) })
	return ctx, func() {
		stop()
		cancel(nil)
		p.calls.Done()
	}, nil
}

// ctxOutage is the outage of a call whose ctx is done.
func ctxOutage(ctx context.Context) error {
	if context.Cause(ctx) == ErrClosed {
		return outbox.Outage(ErrClosed)
	}
	return outbox.Outage(fmt.Errorf("outboxwebhook: publish: %w", ctx.Err()))
}

// Ping sends HEAD to Config.URL. Any answer but 5xx, 408 or 429 proves the receiver up,
// a 401 or 405 included (a receiver need not serve HEAD, nor unsigned requests). Its
// errors are outages. A Retry-After that the receiver sent for its host holds Ping back
// too, so the relay does not resume before the receiver asked it to.
func (p *Publisher) Ping(ctx context.Context) error {
	ctx, end, err := p.begin(ctx)
	if err != nil {
		return err
	}
	defer end()
	if err := p.held(p.base); err != nil {
		return err
	}
	rctx, cancel := p.requestContext(ctx)
	defer cancel()
	req, err := newHTTPRequest(rctx, http.MethodHead, p.base, nil)
	if err != nil {
		return outbox.Outage(err)
	}
	req.Header.Set("User-Agent", userAgent)
	resp, err := p.client.Do(req)
	if err != nil {
		return transportError(ctx, rctx, http.MethodHead, p.base, p.cfg.Timeout, err)
	}
	if !pingOutage(resp.StatusCode) {
		drain(resp)
		return nil
	}
	return p.fail(resp, true)
}

func (p *Publisher) requestContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if p.cfg.Timeout < 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, p.cfg.Timeout)
}

// Publish implements outbox.Publisher. It posts the messages of batch concurrently, up to
// Config.MaxConcurrency requests in flight over all calls, and returns when every one has
// been answered, has failed or ctx is done: nil when every message was answered with a
// 2xx, otherwise a slice of len(batch) with nil for those. See the package documentation
// for which failures are outages.
func (p *Publisher) Publish(ctx context.Context, batch []*outbox.Message) []error {
	if len(batch) == 0 {
		return nil
	}
	errs := make([]error, len(batch))
	ctx, end, err := p.begin(ctx)
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	defer end()

	var wg sync.WaitGroup
	next := make(chan int, len(batch))
	for i := range batch {
		next <- i
	}
	close(next)
	for range min(len(batch), p.cfg.MaxConcurrency) {
		wg.Go(func() {
			for i := range next {
				errs[i] = p.send(ctx, batch[i])
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return errs
		}
	}
	return nil
}

// send posts m and classifies the outcome. An outage of the receiver (no answer, 5xx,
// 429, a Retry-After holding its host back) is an outage of that destination only, so
// that the relay holds back the messages to it and goes on with the other hosts; a
// closed publisher or a cancelled Publish stays an outage of the whole relay.
func (p *Publisher) send(ctx context.Context, m *outbox.Message) error {
	u, err := p.post(ctx, m)
	var oe *outbox.OutageError
	if u == nil || ctx.Err() != nil || errors.Is(err, ErrClosed) || !errors.As(err, &oe) {
		return err
	}
	return outbox.DestinationOutage(u.Scheme+"://"+u.Host, oe.Err)
}

// post posts m and returns its URL (nil when it has none) and the outcome.
func (p *Publisher) post(ctx context.Context, m *outbox.Message) (*url.URL, error) {
	if ctx.Err() != nil {
		return nil, ctxOutage(ctx) // do not send what nobody waits for
	}
	u, err := p.target(m)
	if err != nil {
		return nil, err
	}
	if err := p.held(u); err != nil {
		return u, err
	}
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return u, ctxOutage(ctx)
	}
	defer func() { <-p.slots }()

	rctx, cancel := p.requestContext(ctx)
	defer cancel()
	req, err := p.newRequest(rctx, u, m)
	if err != nil {
		return u, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return u, transportError(ctx, rctx, http.MethodPost, u, p.cfg.Timeout, err)
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		drain(resp)
		return u, nil
	}
	return u, p.fail(resp, statusOutage(resp.StatusCode))
}

// fail turns an answer that is not a success into a *StatusError, wrapped as an outage
// when outage is set; an outage's Retry-After holds its host back.
func (p *Publisher) fail(resp *http.Response, outage bool) error {
	e := statusError(resp, p.now())
	if !outage {
		return e
	}
	if e.RetryAfter > 0 {
		p.hold(resp.Request.URL.Host, e.RetryAfter)
	}
	return outbox.Outage(e)
}

// hold leaves host alone for d, at most maxRetryAfter.
func (p *Publisher) hold(host string, d time.Duration) {
	until := p.now().Add(min(d, maxRetryAfter))
	p.holdMu.Lock()
	defer p.holdMu.Unlock()
	if until.After(p.holds[host]) {
		p.holds[host] = until
	}
}

// held returns an outage while u's host is held back by a Retry-After.
func (p *Publisher) held(u *url.URL) error {
	p.holdMu.Lock()
	until, ok := p.holds[u.Host]
	if ok && !p.now().Before(until) {
		delete(p.holds, u.Host)
		ok = false
	}
	p.holdMu.Unlock()
	if !ok {
		return nil
	}
	return outbox.Outage(fmt.Errorf("outboxwebhook: %s asked (Retry-After) not to be sent anything before %s", u.Host, until.UTC().Format(time.RFC3339)))
}

// Request builds the signed request Publish sends for m, with ctx: the URL of its route,
// its payload as the body, its headers (its own and the Outbox-* ones), Content-Type,
// Idempotency-Key and Outbox-Signature (signed now). It returns the rejection of m when
// m can never be sent (no route, a header that HTTP cannot carry). Tests and benchmarks
// use it to send exactly what the relay would.
func (p *Publisher) Request(ctx context.Context, m *outbox.Message) (*http.Request, error) {
	u, err := p.target(m)
	if err != nil {
		return nil, err
	}
	return p.newRequest(ctx, u, m)
}

func (p *Publisher) newRequest(ctx context.Context, u *url.URL, m *outbox.Message) (*http.Request, error) {
	req, err := newHTTPRequest(ctx, http.MethodPost, u, bytes.NewReader(m.Payload))
	if err != nil {
		return nil, err
	}
	h := req.Header
	h.Set("User-Agent", userAgent)
	var bad error
	m.WireHeaders(func(k, v string) {
		if bad == nil {
			if reason := checkHeader(k, v); reason != "" {
				bad = fmt.Errorf("outboxwebhook: message %s: header %q cannot travel in an HTTP request: %s", m.ID, k, reason)
			}
		}
		h.Set(k, v)
	})
	if bad != nil {
		return nil, bad
	}
	key := m.DedupID()
	h.Set(HeaderIdempotencyKey, key)
	if len(p.cfg.Secrets) > 0 {
		h.Set(HeaderSignature, Sign(p.cfg.Secrets, Signed{Time: p.now(), Method: req.Method, Target: u.RequestURI(),
			ID: m.ID.String(), Key: key, Body: m.Payload}))
	}
	return req, nil
}

// newHTTPRequest is http.NewRequestWithContext for a URL of this package; its error does
// not quote the URL unredacted.
func newHTTPRequest(ctx context.Context, method string, u *url.URL, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("outboxwebhook: %s %s: %w", method, redactURL(u), err)
	}
	return req, nil
}

// target returns the URL m is posted to.
func (p *Publisher) target(m *outbox.Message) (*url.URL, error) {
	dest, err := p.route.DestinationEscaped(m, escapeValue)
	if err != nil {
		return nil, err // a *outbox.RouteError, a rejection
	}
	u, err := resolve(p.base, dest, p.route)
	if err != nil {
		return nil, fmt.Errorf("outboxwebhook: message %s: route %q gives no URL: %w", m.ID, p.route, err)
	}
	return u, nil
}

// checkRoute refuses a route whose messages could choose where they go: a whole-URL
// template whose scheme and host are not written out before its first placeholder.
func checkRoute(base *url.URL, route *outbox.Route) error {
	tmpl := route.String()
	if literal, _, placeholder := strings.Cut(tmpl, "{"); placeholder && hasHTTPScheme(tmpl) {
		_, afterScheme, _ := strings.Cut(literal, "://")
		if !strings.Contains(afterScheme, "/") {
			return errors.New("placeholders may fill a whole URL's path and query only: write out its scheme, host and the slash that starts the path (https://hooks.example/{topic})")
		}
	}
	_, err := resolve(base, route.Example(), route)
	return err
}

// resolve returns the URL of dest, a route's destination with its placeholders escaped:
// dest itself when the route is a whole URL (its scheme and host are the template's), or
// else base with dest appended to its path.
func resolve(base *url.URL, dest string, route *outbox.Route) (*url.URL, error) {
	if hasHTTPScheme(route.String()) {
		u, err := url.Parse(dest)
		switch {
		case err != nil:
			return nil, errors.New("not a valid URL") // url.Parse's error quotes the URL
		case u.Host == "":
			return nil, errors.New("the URL has no host")
		}
		u.Fragment, u.RawFragment = "", ""
		return u, checkSegments(u.EscapedPath())
	}
	escaped := strings.TrimPrefix(dest, "/") // its placeholders' values are escaped
	if _, static := route.Static(); static {
		escaped = (&url.URL{Path: escaped}).EscapedPath() // literal text, as written
	}
	if err := checkSegments(escaped); err != nil {
		return nil, err
	}
	u := *base
	u.RawPath = strings.TrimSuffix(base.EscapedPath(), "/") + "/" + escaped
	var err error
	if u.Path, err = url.PathUnescape(u.RawPath); err != nil {
		return nil, fmt.Errorf("path %q is not valid: %v", u.RawPath, err)
	}
	return &u, nil
}

// checkSegments refuses a path with a "." or ".." segment, which would step out of the
// path it was given.
func checkSegments(path string) error {
	for seg := range strings.SplitSeq(path, "/") {
		if seg == "." || seg == ".." {
			return fmt.Errorf("path %q has a %q segment, which would step out of the URL's path", path, seg)
		}
	}
	return nil
}

// escapeValue escapes a placeholder's value whole for a URL: every byte but ASCII
// letters, digits and "-._~" (RFC 3986's unreserved characters) as %XX.
func escapeValue(v string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(v))
	for i := range len(v) {
		switch c := v[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '.', c == '_', c == '~':
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		}
	}
	return b.String()
}

func hasHTTPScheme(s string) bool {
	for _, scheme := range []string{"http://", "https://"} {
		if len(s) >= len(scheme) && strings.EqualFold(s[:len(scheme)], scheme) {
			return true
		}
	}
	return false
}

// hopHeaders are managed by the HTTP client and the connection; a message may not set
// them.
var hopHeaders = map[string]bool{
	"Connection": true, "Content-Length": true, "Host": true, "Keep-Alive": true,
	"Proxy-Connection": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// credentialHeaders carry credentials: a message may not set them, or it would replace
// the configured ones (net/http sends the URL's user information only when the request
// has no Authorization header).
var credentialHeaders = map[string]bool{"Authorization": true, "Proxy-Authorization": true, "Cookie": true}

// checkHeader returns why a header cannot travel in an HTTP request, or "".
func checkHeader(name, value string) string {
	if name == "" {
		return "empty name"
	}
	for i, r := range name {
		if r >= utf8.RuneSelf || !isTokenChar(byte(r)) {
			return fmt.Sprintf("the name has %q at byte %d, which is not a token character", r, i)
		}
	}
	if hopHeaders[http.CanonicalHeaderKey(name)] {
		return "it is managed by the HTTP connection"
	}
	if credentialHeaders[http.CanonicalHeaderKey(name)] {
		return "credentials come from the publisher's configuration (the URL's user information), never from a message"
	}
	for i := range len(value) {
		if c := value[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return fmt.Sprintf("the value has control character %q at byte %d", c, i)
		}
	}
	return ""
}

// isTokenChar reports whether c may appear in a header name (RFC 9110 tchar).
func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
