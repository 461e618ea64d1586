package outboxpubsub

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/outboxkit/outbox"
)

// Config configures a Publisher. The zero value is usable.
type Config struct {
	// Route maps a message to its topic: a template over the message's topic,
	// aggregate type, event type and key (see outbox.ParseRoute) that gives a topic ID
	// ("orders") in the client's project, or a full topic name
	// ("projects/my-project/topics/orders"). Defaults to "{topic}".
	Route string

	// Timeout bounds how long the client tries to publish a message, retries included,
	// before Publish reports it as an outage (PublishSettings.Timeout). Defaults to 10s
	// (TimeoutDefault).
	Timeout time.Duration

	// DelayThreshold is how long the client waits to gather messages into one request
	// (PublishSettings.DelayThreshold). With ordering keys each key is gathered on its
	// own, so every message waits this long. Defaults to 1ms (DelayThresholdDefault).
	DelayThreshold time.Duration

	// Unordered sends messages without an ordering key. By default a message's key is
	// its ordering key, so that subscriptions with message ordering enabled receive a
	// key's messages in the order the outbox wrote them.
	Unordered bool
}

// Defaults of Config.
const (
	TimeoutDefault        = 10 * time.Second
	DelayThresholdDefault = time.Millisecond
)

// Limits of Pub/Sub on one message that Publish checks before sending: a message over
// them is rejected (not an outage) without reaching the server, which would refuse the
// whole request it travels in.
const (
	MaxMessageBytes        = 10_000_000 // data, attribute keys and values, ordering key
	MaxAttributes          = 100
	MaxAttributeKeyBytes   = 256
	MaxAttributeValueBytes = 1024
	MaxOrderingKeyBytes    = 1024
)

func (c Config) withDefaults() Config {
	c.Timeout = cmp.Or(c.Timeout, TimeoutDefault)
	c.DelayThreshold = cmp.Or(c.DelayThreshold, DelayThresholdDefault)
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
	case c.Timeout < 0:
		return nil, &outbox.ConfigError{Field: "Timeout", Reason: "must not be negative"}
	case c.DelayThreshold < 0:
		return nil, &outbox.ConfigError{Field: "DelayThreshold", Reason: "must not be negative"}
	}
	route, err := outbox.ParseRoute(c.Route)
	if err != nil {
		var ce *outbox.ConfigError
		if errors.As(err, &ce) {
			return nil, &outbox.ConfigError{Field: "Route", Reason: ce.Reason}
		}
		return nil, &outbox.ConfigError{Field: "Route", Reason: err.Error()}
	}
	if reason := checkTopic(route.Example()); reason != "" {
		return nil, &outbox.ConfigError{Field: "Route", Reason: fmt.Sprintf("%q does not form valid topic names: %s", route.String(), reason)}
	}
	return route, nil
}

// checkTopic says why t is no topic ID or full topic name, or "" when it is one. An ID
// is 3 to 255 letters, digits and - _ . ~ + %, starting with a letter, and not starting
// with "goog".
func checkTopic(t string) string {
	id := t
	if strings.HasPrefix(t, "projects/") {
		parts := strings.Split(t, "/")
		if len(parts) != 4 || parts[1] == "" || parts[2] != "topics" {
			return "a full topic name is projects/PROJECT/topics/TOPIC"
		}
		id = parts[3]
	}
	switch {
	case len(id) < 3 || len(id) > 255:
		return fmt.Sprintf("topic ID %q is not 3 to 255 characters long", id)
	case !(id[0] >= 'a' && id[0] <= 'z' || id[0] >= 'A' && id[0] <= 'Z'):
		return fmt.Sprintf("topic ID %q does not start with a letter", id)
	case strings.HasPrefix(strings.ToLower(id), "goog"):
		return fmt.Sprintf("topic ID %q starts with goog", id)
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.~+%", r)) {
			return fmt.Sprintf("topic ID %q holds %q: only letters, digits and - _ . ~ + %% are allowed", id, r)
		}
	}
	return ""
}

// ErrClosed is matched (errors.Is) by the outages of a Publisher that was closed.
var ErrClosed = errors.New("outboxpubsub: publisher closed")

// ErrNoTopic is matched (errors.Is) by the outage reported when the route's topic does
// not exist (or the credentials may not see it): a configuration problem that would
// otherwise dead-letter every message routed there.
var ErrNoTopic = errors.New("outboxpubsub: topic does not exist")

// ErrInvalid is matched (errors.Is) by the rejection of a message that breaks a limit of
// Pub/Sub (size, attributes) or whose route gives no valid topic: it is never sent.
var ErrInvalid = errors.New("outboxpubsub: invalid message")

// Publisher publishes outbox messages to Google Cloud Pub/Sub topics through the official
// client. It implements outbox.Publisher and outbox.Pinger, and is safe for concurrent
// use.
type Publisher struct {
	client *pubsub.Client
	owned  bool // Dial made the client: Close closes it
	route  *outbox.Route
	cfg    Config

	mu     sync.Mutex
	topics map[string]*pubsub.Publisher // by topic name or ID as the route gave it
	keys   map[string]*keyState         // ordering keys with messages being published
	closed bool

	lastTopic atomic.Pointer[string] // the topic of the last successful publish, for Ping
}

// keyState counts a key's messages being published, and whether one of them failed: the
// client then pauses the key, and Publish resumes it once none is left (ResumePublish).
type keyState struct {
	pending int
	failed  bool
}

var (
	_ outbox.Publisher = (*Publisher)(nil)
	_ outbox.Pinger    = (*Publisher)(nil)
)

// New returns a Publisher that publishes through client. Close leaves the client open.
func New(client *pubsub.Client, cfg Config) (*Publisher, error) {
	if client == nil {
		return nil, errors.New("outboxpubsub: New: nil client")
	}
	route, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	return &Publisher{client: client, route: route, cfg: cfg.withDefaults(),
		topics: map[string]*pubsub.Publisher{}, keys: map[string]*keyState{}}, nil
}

// Dial makes a Pub/Sub client from rawURL and returns a publisher that owns it. The URL
// is "pubsub://PROJECT" with optional query parameters:
//
//	endpoint  host:port of an emulator (the Pub/Sub emulator, pstest): plain gRPC, no
//	          credentials
//
// such as "pubsub://my-project" or "pubsub://test?endpoint=127.0.0.1:8085". Without an
// endpoint the client reaches Google's service with Application Default Credentials
// (GOOGLE_APPLICATION_CREDENTIALS, the metadata server, gcloud's login), or the emulator
// named by PUBSUB_EMULATOR_HOST, as the client library does; opts, applied last,
// override any of it (option.WithCredentialsFile, option.WithEndpoint for a regional
// endpoint, ...). Credentials never come from the URL.
//
// Dial checks that Pub/Sub answers (Ping) and fails if it does not.
func Dial(ctx context.Context, rawURL string, cfg Config, opts ...option.ClientOption) (*Publisher, error) {
	project, endpoint, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if _, err := cfg.validate(); err != nil {
		return nil, err
	}
	var all []option.ClientOption
	if endpoint != "" {
		all = append(all, option.WithEndpoint(endpoint), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	}
	client, err := pubsub.NewClient(ctx, project, append(all, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("outboxpubsub: client for project %q: %w", project, err)
	}
	p, err := New(client, cfg)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	p.owned = true
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// ParseURL reads a pubsub:// URL: the project, and the emulator's endpoint if the URL
// names one.
func ParseURL(rawURL string) (project, endpoint string, err error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "pubsub" {
		return "", "", errors.New(`outboxpubsub: the URL is "pubsub://PROJECT" with an optional ?endpoint=host:port of an emulator`)
	}
	project = u.Host
	if project == "" {
		return "", "", errors.New(`outboxpubsub: the URL names no project: "pubsub://PROJECT"`)
	}
	q := u.Query()
	for k := range q {
		if k != "endpoint" {
			return "", "", fmt.Errorf("outboxpubsub: unknown URL parameter %q (there is only endpoint)", k)
		}
	}
	return project, q.Get("endpoint"), nil
}

// Client returns the client the publisher publishes through.
func (p *Publisher) Client() *pubsub.Client { return p.client }

// Close flushes and stops the topics' publishers, and closes the client if Dial made it.
// Publish calls after it report ErrClosed as an outage.
func (p *Publisher) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	topics := p.topics
	p.mu.Unlock()
	for _, t := range topics {
		t.Stop()
	}
	if p.owned {
		_ = p.client.Close()
	}
}

// Ping implements outbox.Pinger: it reads the topic of the last successful publish, or of
// the route when it has no placeholders; with neither, it lists one topic of the project.
func (p *Publisher) Ping(ctx context.Context) error {
	topic := ""
	if t := p.lastTopic.Load(); t != nil {
		topic = *t
	} else if static, ok := p.route.Static(); ok {
		topic = static
	}
	var err error
	if topic != "" {
		_, err = p.client.TopicAdminClient.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: p.fullName(topic)})
		if status.Code(err) == codes.NotFound {
			return outbox.Outage(fmt.Errorf("%w: %s", ErrNoTopic, p.fullName(topic)))
		}
	} else {
		it := p.client.TopicAdminClient.ListTopics(ctx, &pubsubpb.ListTopicsRequest{Project: "projects/" + p.client.Project(), PageSize: 1})
		if _, err = it.Next(); errors.Is(err, iterator.Done) {
			err = nil
		}
	}
	if err != nil {
		return outbox.Outage(fmt.Errorf("outboxpubsub: ping: %w", err))
	}
	return nil
}

// fullName is the full name of a topic given as an ID or a full name.
func (p *Publisher) fullName(topic string) string {
	if strings.HasPrefix(topic, "projects/") {
		return topic
	}
	return "projects/" + p.client.Project() + "/topics/" + topic
}

// topic returns the client's publisher for a topic, made on first use.
func (p *Publisher) topic(name string) (*pubsub.Publisher, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, outbox.Outage(ErrClosed)
	}
	t := p.topics[name]
	if t == nil {
		t = p.client.Publisher(name)
		t.EnableMessageOrdering = !p.cfg.Unordered
		t.PublishSettings.Timeout = p.cfg.Timeout
		t.PublishSettings.DelayThreshold = p.cfg.DelayThreshold
		p.topics[name] = t
	}
	return t, nil
}

// Publish implements outbox.Publisher. Each message goes to its route's topic with the
// key as its ordering key; a nil error means the server returned its message id. When a
// message of a key fails, the client pauses the key: the key's later messages in flight
// fail too (as outages: they were not published), and Publish resumes the key once no
// message of it is left in flight, so that the relay's next attempt, which starts again
// from the failed message, goes out in order.
func (p *Publisher) Publish(ctx context.Context, batch []*outbox.Message) []error {
	if len(batch) == 0 {
		return nil
	}
	errs := make([]error, len(batch))
	results := make([]*pubsub.PublishResult, len(batch))
	topics := make([]string, len(batch))
	keys := make([]string, len(batch))
	for i, m := range batch {
		name, err := p.route.Destination(m)
		if err == nil {
			if reason := checkTopic(name); reason != "" {
				err = fmt.Errorf("%w: route gives %q: %s", ErrInvalid, name, reason)
			}
		}
		var msg *pubsub.Message
		if err == nil {
			msg, err = p.encode(m)
		}
		var t *pubsub.Publisher
		if err == nil {
			t, err = p.topic(name)
		}
		if err != nil {
			errs[i] = err
			continue
		}
		topics[i], keys[i] = name, msg.OrderingKey
		p.begin(keys[i])
		results[i] = t.Publish(ctx, msg)
	}
	failed := false
	for i, r := range results {
		if r == nil {
			failed = true
			continue
		}
		_, err := r.Get(ctx)
		if err != nil {
			errs[i] = classify(err, p.fullName(topics[i]))
			failed = true
		} else {
			p.lastTopic.Store(&topics[i])
		}
		p.end(topics[i], keys[i], err != nil)
	}
	if !failed {
		return nil
	}
	return errs
}

// begin counts a message of key being published.
func (p *Publisher) begin(key string) {
	if key == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	k := p.keys[key]
	if k == nil {
		k = &keyState{}
		p.keys[key] = k
	}
	k.pending++
}

// end counts a message of key done, failed or not, and resumes the key on topic once
// its last message in flight is done after one of them failed.
func (p *Publisher) end(topic, key string, failed bool) {
	if key == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	k := p.keys[key]
	k.pending--
	k.failed = k.failed || failed
	if k.pending > 0 {
		return
	}
	delete(p.keys, key)
	if k.failed {
		for _, t := range p.topics {
			t.ResumePublish(key) // the client pauses a key per topic publisher
		}
	}
}

// encode builds m's Pub/Sub message: the payload as data, the headers as attributes, and
// the key as ordering key (its SHA-256 in hex when longer than Pub/Sub allows).
func (p *Publisher) encode(m *outbox.Message) (*pubsub.Message, error) {
	attrs := map[string]string{}
	m.WireHeaders(func(k, v string) { attrs[k] = v })
	size := len(m.Payload)
	if len(attrs) > MaxAttributes {
		return nil, fmt.Errorf("%w: %d attributes, over Pub/Sub's %d", ErrInvalid, len(attrs), MaxAttributes)
	}
	for k, v := range attrs {
		switch {
		case len(k) > MaxAttributeKeyBytes:
			return nil, fmt.Errorf("%w: attribute name %.40q... is %d bytes, over Pub/Sub's %d", ErrInvalid, k, len(k), MaxAttributeKeyBytes)
		case len(v) > MaxAttributeValueBytes:
			return nil, fmt.Errorf("%w: attribute %s is %d bytes, over Pub/Sub's %d", ErrInvalid, k, len(v), MaxAttributeValueBytes)
		case strings.HasPrefix(strings.ToLower(k), "goog"):
			return nil, fmt.Errorf("%w: attribute name %q starts with goog, which Pub/Sub reserves", ErrInvalid, k)
		}
		size += len(k) + len(v)
	}
	msg := &pubsub.Message{Data: m.Payload, Attributes: attrs}
	if !p.cfg.Unordered {
		msg.OrderingKey = OrderingKey(m.Key)
		size += len(msg.OrderingKey)
	}
	if size > MaxMessageBytes {
		return nil, fmt.Errorf("%w: %d bytes with its attributes, over Pub/Sub's %d", ErrInvalid, size, MaxMessageBytes)
	}
	return msg, nil
}

// OrderingKey returns the ordering key a message with key key is published with: the key
// itself, or its lowercase hex SHA-256 when it is longer than MaxOrderingKeyBytes. A
// message without a key has none: it is ordered with respect to no other.
func OrderingKey(key string) string {
	if len(key) <= MaxOrderingKeyBytes {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// classify turns the error of a publish to topic into an outage or a rejection.
func classify(err error, topic string) error {
	var paused pubsub.ErrPublishingPaused
	switch {
	case errors.As(err, &paused):
		return outbox.Outage(fmt.Errorf("outboxpubsub: topic %s: an earlier message of the key failed: %w", topic, err))
	case errors.Is(err, pubsub.ErrPublisherStopped):
		return outbox.Outage(fmt.Errorf("%w: %w", ErrClosed, err))
	case errors.Is(err, pubsub.ErrOversizedMessage):
		return fmt.Errorf("%w: topic %s: %w", ErrInvalid, topic, err)
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return outbox.Outage(fmt.Errorf("outboxpubsub: topic %s: %w", topic, err))
	}
	switch status.Code(err) {
	case codes.InvalidArgument:
		return fmt.Errorf("outboxpubsub: topic %s refused the message: %w", topic, err)
	case codes.NotFound:
		return outbox.DestinationOutage(topic, fmt.Errorf("%w: %s: create it (gcloud pubsub topics create %s) or fix the publisher's Route: %w",
			ErrNoTopic, topic, topic[strings.LastIndexByte(topic, '/')+1:], err))
	}
	return outbox.Outage(fmt.Errorf("outboxpubsub: topic %s: %w", topic, err))
}

// CheckTopic reports whether m's topic exists: an error wrapping ErrNoTopic when it does
// not, outbox.ErrUnroutable when the route needs a field m lacks (a placeholder other
// than {topic}), or the error of asking.
func (p *Publisher) CheckTopic(ctx context.Context, m *outbox.Message) error {
	name, err := p.route.Destination(m)
	if err != nil {
		return err
	}
	_, err = p.client.TopicAdminClient.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: p.fullName(name)})
	if status.Code(err) == codes.NotFound {
		return fmt.Errorf("%w: %s", ErrNoTopic, p.fullName(name))
	}
	return err
}

// Message returns the Pub/Sub message Publish sends for m (without its topic), or the
// rejection Publish would report: for tools that publish the outbox's messages with the
// client themselves.
func (p *Publisher) Message(m *outbox.Message) (*pubsub.Message, error) { return p.encode(m) }
