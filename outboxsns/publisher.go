package outboxsns

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"
	smithy "github.com/aws/smithy-go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/awsdial"
	"github.com/outboxkit/outbox/outboxsqs"
)

// Config configures a Publisher. The zero value is usable.
type Config struct {
	// Route maps a message to its topic: a template over the message's topic, aggregate
	// type, event type and key (see outbox.ParseRoute) that gives a topic name
	// ("orders", "orders.fifo"), found in the account and region with ListTopics once and
	// cached, or a topic ARN ("arn:aws:sns:eu-west-1:123456789012:{topic}"), whose
	// placeholders may fill only the name. A name ending in ".fifo" is a FIFO topic.
	// Defaults to "{topic}".
	Route string

	// MaxMessageBytes is the largest message Publish sends, counted as SNS counts it
	// (message plus attribute names, types and values), and the largest total of one
	// PublishBatch call. A larger message is rejected without being sent. Defaults to
	// 262144 (256 KiB, MaxMessageBytesDefault), SNS's limit.
	MaxMessageBytes int

	// MaxInflight caps the PublishBatch calls in flight at once, over all concurrent
	// Publish calls. Defaults to 32 (MaxInflightDefault).
	MaxInflight int
}

// Defaults of Config.
const (
	MaxMessageBytesDefault = 256 << 10
	MaxInflightDefault     = 32
)

// maxBatchEntries is the number of entries SNS allows in one PublishBatch call.
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

func (c Config) validate() (*outbox.Route, error) {
	switch {
	case c.MaxMessageBytes < 0 || c.MaxMessageBytes > MaxMessageBytesDefault:
		return nil, &outbox.ConfigError{Field: "MaxMessageBytes", Reason: fmt.Sprintf("must lie between 0 and %d, SNS's limit", MaxMessageBytesDefault)}
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
	ex := route.Example()
	if _, reason := checkTopic(ex); reason != "" {
		return nil, &outbox.ConfigError{Field: "Route", Reason: fmt.Sprintf("%q does not form valid topic names or ARNs: %s", route.String(), reason)}
	}
	if t := route.String(); isARN(t) && strings.Contains(t, "{") && strings.LastIndexByte(t, ':') > strings.IndexByte(t, '{') {
		return nil, &outbox.ConfigError{Field: "Route", Reason: fmt.Sprintf("%q: placeholders may fill only the topic name, after the ARN's last colon (arn:aws:sns:eu-west-1:123456789012:{topic})", t)}
	}
	return route, nil
}

func isARN(s string) bool { return strings.HasPrefix(s, "arn:") }

// checkTopic returns the topic name of dest, a name or an ARN, and why it is not a valid
// one, or "": 1 to 256 ASCII letters, digits, - and _, and a ".fifo" suffix on a FIFO
// topic.
func checkTopic(dest string) (name, reason string) {
	name = dest
	if isARN(dest) {
		parts := strings.Split(dest, ":")
		if len(parts) != 6 || parts[2] != "sns" || parts[3] == "" || parts[4] == "" {
			return "", "a topic ARN is arn:PARTITION:sns:REGION:ACCOUNT:NAME"
		}
		name = parts[5]
	}
	base := strings.TrimSuffix(name, ".fifo")
	if len(base) == 0 || len(name) > 256 {
		return "", fmt.Sprintf("topic name %q is not 1 to 256 characters long", name)
	}
	for _, r := range base {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return "", fmt.Sprintf("topic name %q holds %q: only ASCII letters, digits, - and _ are allowed (and a .fifo suffix)", name, r)
		}
	}
	return name, ""
}

// ErrClosed is matched (errors.Is) by the outages of a Publisher that was closed.
var ErrClosed = errors.New("outboxsns: publisher closed")

// ErrNoTopic is matched (errors.Is) by the outage reported for a topic that does not
// exist (or that the credentials may not see): a configuration problem that would
// otherwise dead-letter every message routed there.
var ErrNoTopic = errors.New("outboxsns: topic does not exist")

// ErrTooLarge is matched (errors.Is) by the rejection of a message larger than
// Config.MaxMessageBytes, which Publish does not send.
var ErrTooLarge = errors.New("outboxsns: message too large")

// ErrInvalidTopic is matched (errors.Is) by the rejection of a message whose route gives
// no valid topic name or ARN.
var ErrInvalidTopic = errors.New("outboxsns: invalid topic")

// Publisher publishes outbox messages to Amazon SNS topics, standard and FIFO. It
// implements outbox.Publisher and outbox.Pinger, and is safe for concurrent use.
type Publisher struct {
	client *sns.Client
	route  *outbox.Route
	cfg    Config
	slots  chan struct{} // one token per PublishBatch call in flight

	mu     sync.Mutex
	topics map[string]*topicARN // by name

	lastTopic atomic.Pointer[string] // the ARN of the last successful send, for Ping

	life *awsdial.Life
}

// topicARN is a topic name's ARN, looked up once: done is closed when arn or err is set.
type topicARN struct {
	done chan struct{}
	arn  string
	err  error
}

var (
	_ outbox.Publisher = (*Publisher)(nil)
	_ outbox.Pinger    = (*Publisher)(nil)
)

// New returns a Publisher that sends through client. The client's retryer, region,
// credentials and endpoint apply; Close leaves the client as it is.
func New(client *sns.Client, cfg Config) (*Publisher, error) {
	if client == nil {
		return nil, errors.New("outboxsns: New: nil client")
	}
	route, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Publisher{client: client, route: route, cfg: cfg, slots: make(chan struct{}, cfg.MaxInflight),
		topics: map[string]*topicARN{}, life: awsdial.NewLife()}, nil
}

// Dial makes an SNS client from rawURL and returns a publisher that uses it. The URL is
// "sns://" with optional query parameters region, endpoint (an emulator or a VPC
// endpoint, "http://127.0.0.1:4566") and profile, such as "sns://?region=eu-west-1".
// Credentials come from the AWS SDK's default chain, never from the URL; optFns, applied
// last, override any of it. Dial checks that SNS answers (Ping) and fails if it does not;
// a missing topic does not fail it.
func Dial(ctx context.Context, rawURL string, cfg Config, optFns ...func(*config.LoadOptions) error) (*Publisher, error) {
	if _, err := cfg.validate(); err != nil {
		return nil, err
	}
	params, err := awsdial.Parse("sns", rawURL)
	if err != nil {
		return nil, err
	}
	awsCfg, err := params.Load(ctx, optFns...)
	if err != nil {
		return nil, fmt.Errorf("outboxsns: load AWS configuration: %w", err)
	}
	client := sns.NewFromConfig(awsCfg, func(o *sns.Options) {
		if params.Endpoint != "" {
			o.BaseEndpoint = aws.String(params.Endpoint)
		}
		o.HTTPClient = outboxsqs.BufferRequests(o.HTTPClient)
	})
	p, err := New(client, cfg)
	if err != nil {
		return nil, err
	}
	if err := p.Ping(ctx); err != nil && !errors.Is(err, ErrNoTopic) {
		p.Close()
		return nil, fmt.Errorf("outboxsns: connect: %w", err)
	}
	return p, nil
}

// ParseURL reads a "sns://?region=...&endpoint=...&profile=..." URL. Its errors
// are *outbox.ConfigError values of the field "url".
func ParseURL(rawURL string) (region, endpoint, profile string, err error) {
	p, err := awsdial.Parse("sns", rawURL)
	return p.Region, p.Endpoint, p.Profile, err
}

// Client returns the SNS client the publisher sends through.
func (p *Publisher) Client() *sns.Client { return p.client }

// Close makes Publish and Ping return outages (errors.Is(err, ErrClosed)) from now on and
// cancels the calls in flight. Closing twice is safe.
func (p *Publisher) Close() { p.life.Close() }

// callCtx returns ctx, cancelled also when the publisher is closed.
func (p *Publisher) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return p.life.CallCtx(ctx)
}

// ctxOutage is the outage of a call that ctx ended: the caller's deadline or Close.
func (p *Publisher) ctxOutage(ctx context.Context, dest string) error {
	return p.life.Outage(ctx, "outboxsns", "topic", dest, ErrClosed)
}

// Ping checks that SNS answers: the attributes of the route's topic when it has no
// placeholders (so a missing topic is reported), else of the topic last sent to, else
// ListTopics. Its errors are outages. Without a deadline on ctx it gives up after 5 s.
func (p *Publisher) Ping(ctx context.Context) error {
	ctx, cancel := p.life.PingCtx(ctx)
	defer cancel()
	if p.life.Closed() {
		return outbox.Outage(fmt.Errorf("outboxsns: ping: %w", ErrClosed))
	}
	if dest, ok := p.route.Static(); ok {
		_, err := p.topicARN(ctx, dest)
		return err
	}
	var err error
	if last := p.lastTopic.Load(); last != nil {
		_, err = p.client.GetTopicAttributes(ctx, &sns.GetTopicAttributesInput{TopicArn: last})
	} else {
		_, err = p.client.ListTopics(ctx, &sns.ListTopicsInput{})
	}
	if err != nil {
		return outbox.Outage(fmt.Errorf("outboxsns: ping: %w", err))
	}
	return nil
}

// CheckTopic reports whether the topic m is routed to exists: nil, the rejection Publish
// would return for m, or an outage (ErrNoTopic for a missing topic). It is for start-up
// checks such as the warnings `outbox relay` logs for pending messages.
func (p *Publisher) CheckTopic(ctx context.Context, m *outbox.Message) error {
	dest, _, err := p.destination(m)
	if err != nil {
		return err
	}
	ctx, cancel := p.callCtx(ctx)
	defer cancel()
	_, err = p.topicARN(ctx, dest)
	return err
}

// destination returns m's topic as the route gives it (a name or ARN) and its name, or
// the rejection of m.
func (p *Publisher) destination(m *outbox.Message) (dest, name string, err error) {
	dest, err = p.route.Destination(m)
	if err != nil {
		return "", "", err
	}
	// A message's fields never choose the account or the region: a route of names gives
	// names, and a route of ARNs fills only the topic name after its fixed part.
	static := p.route.String()
	if !isARN(static) && isARN(dest) || isARN(static) && strings.Count(dest, ":") != 5 {
		return "", "", fmt.Errorf("outboxsns: route %q gives %q for topic %q: a message's fields may name a topic, not an ARN: %w", static, dest, m.Topic, ErrInvalidTopic)
	}
	name, reason := checkTopic(dest)
	if reason != "" {
		return "", "", fmt.Errorf("outboxsns: route %q gives %q for topic %q: %s: %w", static, dest, m.Topic, reason, ErrInvalidTopic)
	}
	return dest, name, nil
}

// topicARN returns the ARN of dest, a topic name or ARN: an ARN is checked with
// GetTopicAttributes, a name is looked up in ListTopics; both once. Failures are not
// cached: a topic created later is found.
func (p *Publisher) topicARN(ctx context.Context, dest string) (string, error) {
	p.mu.Lock()
	t, ok := p.topics[dest]
	if !ok {
		t = &topicARN{done: make(chan struct{})}
		p.topics[dest] = t
	}
	p.mu.Unlock()
	if ok {
		select {
		case <-t.done:
			return t.arn, t.err
		case <-ctx.Done():
			return "", p.ctxOutage(ctx, dest)
		}
	}
	t.arn, t.err = p.lookup(ctx, dest)
	if t.err != nil && ctx.Err() != nil {
		t.err = p.ctxOutage(ctx, dest)
	}
	if t.err != nil {
		p.mu.Lock()
		delete(p.topics, dest)
		p.mu.Unlock()
	}
	close(t.done)
	return t.arn, t.err
}

func (p *Publisher) lookup(ctx context.Context, dest string) (string, error) {
	if isARN(dest) {
		if _, err := p.client.GetTopicAttributes(ctx, &sns.GetTopicAttributesInput{TopicArn: aws.String(dest)}); err != nil {
			return "", classify(err, dest)
		}
		return dest, nil
	}
	pages := sns.NewListTopicsPaginator(p.client, &sns.ListTopicsInput{})
	for pages.HasMorePages() {
		out, err := pages.NextPage(ctx)
		if err != nil {
			return "", classify(err, dest)
		}
		for _, t := range out.Topics {
			if arn := aws.ToString(t.TopicArn); arn[strings.LastIndexByte(arn, ':')+1:] == dest {
				return arn, nil
			}
		}
	}
	return "", noTopic(dest, nil)
}

// noTopic is the outage of a missing topic: of this destination only, so that the relay
// holds back its messages and goes on.
func noTopic(dest string, err error) error {
	name, _ := checkTopic(dest)
	create := "aws sns create-topic --name " + name
	if strings.HasSuffix(name, ".fifo") {
		create += " --attributes FifoTopic=true"
	}
	e := fmt.Errorf("%w: %q: create it (for example: %s) or fix the publisher's Route", ErrNoTopic, dest, create)
	if err != nil {
		e = fmt.Errorf("%w (%w)", e, err)
	}
	return outbox.DestinationOutage("topic "+dest, e)
}

// entry is one message encoded for PublishBatch, with its size as SNS counts it.
type entry struct {
	i    int
	req  types.PublishBatchRequestEntry
	size int
}

// Entry returns the PublishBatch entry Publish sends for m (without its Id) and the
// topic name or ARN the route gives, or the rejection of m.
func (p *Publisher) Entry(m *outbox.Message) (types.PublishBatchRequestEntry, string, error) {
	e, dest, err := p.entry(m)
	return e.req, dest, err
}

// entry lays m out as outboxsqs does (a raw delivery to an SQS queue decodes with
// outboxsqs.Decode), with the FIFO fields on a FIFO topic.
func (p *Publisher) entry(m *outbox.Message) (entry, string, error) {
	dest, name, err := p.destination(m)
	if err != nil {
		return entry{}, "", err
	}
	body, layout, err := outboxsqs.Layout(m)
	if err != nil {
		return entry{}, "", err
	}
	attrs := make(map[string]types.MessageAttributeValue, len(layout))
	for k, v := range layout {
		attrs[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	req := types.PublishBatchRequestEntry{Message: aws.String(body), MessageAttributes: attrs}
	if strings.HasSuffix(name, ".fifo") {
		req.MessageDeduplicationId = aws.String(outboxsqs.FIFOID(m.DedupID()))
		req.MessageGroupId = aws.String(outboxsqs.FIFOGroup(m))
	}
	size := outboxsqs.LayoutSize(body, layout)
	if size > p.cfg.MaxMessageBytes {
		return entry{}, "", fmt.Errorf("outboxsns: message for topic %q is %d bytes with its attributes, over the limit of %d bytes (Config.MaxMessageBytes): %w",
			dest, size, p.cfg.MaxMessageBytes, ErrTooLarge)
	}
	return entry{req: req, size: size}, dest, nil
}

// Publish implements outbox.Publisher. It groups the batch by topic and sends each
// topic's messages in PublishBatch calls of up to 10 entries and Config.MaxMessageBytes,
// all calls at once (at most Config.MaxInflight in flight over all Publish calls). It
// returns nil when SNS accepted every message, otherwise a slice of len(batch) with nil
// for the accepted ones.
func (p *Publisher) Publish(ctx context.Context, batch []*outbox.Message) []error {
	if len(batch) == 0 {
		return nil
	}
	errs := make([]error, len(batch))
	fail := func(err error) []error {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	if p.life.Closed() {
		return fail(outbox.Outage(fmt.Errorf("outboxsns: publish: %w", ErrClosed)))
	}
	if err := ctx.Err(); err != nil {
		return fail(outbox.Outage(fmt.Errorf("outboxsns: publish: %w", err)))
	}
	ctx, cancel := p.callCtx(ctx)
	defer cancel()
	byTopic := map[string][]entry{}
	for i, m := range batch {
		e, dest, err := p.entry(m)
		if err != nil {
			errs[i] = err
			continue
		}
		e.i = i
		e.req.Id = aws.String(fmt.Sprint(i))
		byTopic[dest] = append(byTopic[dest], e)
	}
	var wg sync.WaitGroup
	for dest, entries := range byTopic {
		wg.Go(func() { p.sendTopic(ctx, dest, entries, errs) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return errs
		}
	}
	return nil
}

// sendTopic resolves dest and sends entries there in batches, all at once.
func (p *Publisher) sendTopic(ctx context.Context, dest string, entries []entry, errs []error) {
	arn, err := p.topicARN(ctx, dest)
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
			wg.Go(func() { p.sendBatch(ctx, dest, arn, chunk, errs) })
			start, total = i, 0
		}
		total += e.size
	}
	chunk := entries[start:]
	wg.Go(func() { p.sendBatch(ctx, dest, arn, chunk, errs) })
	wg.Wait()
}

// sendBatch sends one PublishBatch call (awsdial.Batch: a call SNS refuses as a whole for
// its contents is sent again entry by entry).
func (p *Publisher) sendBatch(ctx context.Context, dest, arn string, chunk []entry, errs []error) {
	awsdial.Batch[entry]{
		Slots:  p.slots,
		Outage: func(ctx context.Context) error { return p.ctxOutage(ctx, dest) },
		Classify: func(err error) error {
			err = classify(err, dest)
			if errors.Is(err, ErrNoTopic) {
				p.forget(dest) // looked up again next time: it may be created, or come back
			}
			return err
		},
		Record: func(e entry, err error) { errs[e.i] = err },
		Call: func(ctx context.Context, chunk []entry) ([]error, error) {
			reqs := make([]types.PublishBatchRequestEntry, len(chunk))
			for i, e := range chunk {
				reqs[i] = e.req
			}
			out, err := p.client.PublishBatch(ctx, &sns.PublishBatchInput{TopicArn: aws.String(arn), PublishBatchRequestEntries: reqs})
			if err != nil {
				return nil, err
			}
			p.lastTopic.Store(&arn)
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
					err = outbox.Outage(fmt.Errorf("outboxsns: topic %q: PublishBatch returned no result for entry %s", dest, *e.req.Id))
				}
				results[i] = err
			}
			return results, nil
		},
	}.Send(ctx, chunk)
}

func (p *Publisher) forget(dest string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.topics[dest]; ok {
		select {
		case <-t.done:
			delete(p.topics, dest)
		default:
		}
	}
}

// EntryError is the failure SNS reported for one entry of a PublishBatch call.
type EntryError struct {
	Topic       string
	Code        string
	Message     string
	SenderFault bool // SNS blames the request (the message), not itself
}

func (e *EntryError) Error() string {
	fault := "receiver"
	if e.SenderFault {
		fault = "sender"
	}
	return fmt.Sprintf("outboxsns: topic %q refused the message (%s fault): %s: %s", e.Topic, fault, e.Code, e.Message)
}

func entryError(topic string, f types.BatchResultErrorEntry) error {
	e := &EntryError{Topic: topic, Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}
	if !e.SenderFault || outageCodes[e.Code] {
		return outbox.Outage(e)
	}
	return e
}

var (
	// rejectionCodes concern the messages of the call.
	rejectionCodes = map[string]bool{
		"InvalidParameter": true, "InvalidParameterValue": true, "ParameterValueInvalid": true,
		"ValidationException": true, "BatchRequestTooLong": true,
	}
	// outageCodes are backpressure, service trouble or configuration problems that
	// affect every message, whatever SenderFault says.
	outageCodes = map[string]bool{
		"Throttled": true, "ThrottlingException": true, "Throttling": true,
		"KMSAccessDenied": true, "KMSDisabled": true, "KMSInvalidState": true, "KMSNotFound": true,
		"KMSOptInRequired": true, "KMSThrottling": true,
		"AuthorizationError": true, "AccessDenied": true, "AccessDeniedException": true, "InvalidSecurity": true,
		"InvalidClientTokenId": true, "SignatureDoesNotMatch": true, "ExpiredToken": true,
		"InternalError": true, "InternalFailure": true, "ServiceUnavailable": true,
	}
)

// classify turns the error of a call for topic into an outage or a rejection. A
// rejection of a call that carried several messages does not say which one is at fault:
// Publish then sends them one by one.
func classify(err error, topic string) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return outbox.Outage(fmt.Errorf("outboxsns: topic %q: %w", topic, err))
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		code := apiErr.ErrorCode()
		var nf *types.NotFoundException
		switch {
		case errors.As(err, &nf), code == "NotFound", code == "ResourceNotFound":
			return noTopic(topic, err)
		case rejectionCodes[code]:
			return fmt.Errorf("outboxsns: topic %q refused the message: %w", topic, err)
		}
	}
	return outbox.Outage(fmt.Errorf("outboxsns: topic %q: %w", topic, err))
}
