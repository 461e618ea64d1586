package outboxkafka

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/outboxkit/outbox/internal/reconnect"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"

	"github.com/outboxkit/outbox"
)

// CloudEventsPrefix is the prefix of the CloudEvents attribute headers in binary content
// mode that the CloudEvents Kafka binding names (outbox.CloudEventsConfig.Prefix).
const CloudEventsPrefix = "ce_"

// Config configures a Publisher. The zero value is usable.
//
// Route applies to New and Dial. The other fields configure the client Dial builds; New
// takes the caller's client as it is and refuses a Config that sets them, so that no
// setting is silently ignored.
type Config struct {
	// Route maps a message to its topic: a template over the message's topic, aggregate
	// type, event type and key (see outbox.ParseRoute), such as "events.{topic}" or
	// outbox.RouteDebezium. Defaults to "{topic}".
	Route string

	// Compression is the codec record batches are compressed with: "none", "gzip",
	// "snappy", "lz4" or "zstd" (zstd needs Kafka 2.1 or later, and consumers that
	// read it). The client falls back to no compression for a broker too old for the
	// codec. Dial only. Defaults to "snappy", franz-go's default.
	Compression string

	// MaxMessageBytes is the largest record batch the client builds (franz-go's
	// ProducerBatchMaxBytes, uncompressed): a message whose record alone is larger is
	// rejected without being sent. Keep it at or below the max.message.bytes of every
	// destination topic. Dial only. Defaults to 1,048,576 (MaxMessageBytesDefault, 1 MiB,
	// the Java producer's max.request.size), under the broker default of 1,048,588 (Kafka
	// 1.1 and later; 1,000,012 before) and above the largest record of a message within
	// Write's default outbox.Limits (about 1,035,000 bytes), so that what Write accepts
	// by default is published. franz-go's own default is 1,000,012, which such a message
	// can exceed. At least 512, at most 100 MiB (the most the client writes in one
	// request, as Kafka's socket.request.max.bytes by default).
	MaxMessageBytes int

	// MaxBufferedRecords caps the records the client holds that Kafka has not
	// acknowledged yet, over all concurrent Publish calls; a Publish that would exceed
	// it waits for room (until its ctx is done). Dial only. Defaults to 10,000
	// (MaxBufferedRecordsDefault).
	MaxBufferedRecords int

	// TLS, when set, makes Dial's client connect with TLS (a custom CA in RootCAs,
	// client certificates in Certificates). Dial only. Defaults to plain TCP.
	TLS *tls.Config

	// SASL, when set, authenticates Dial's client: plain.Auth{...}.AsMechanism(),
	// scram.Auth{...}.AsSha512Mechanism(), ... from franz-go's pkg/sasl. Dial only.
	// Defaults to none.
	SASL sasl.Mechanism

	// ClientID is the client id Dial's client sends, which brokers log and apply
	// quotas by. Dial only. Defaults to "outboxkafka".
	ClientID string
}

// Defaults of Config.
const (
	MaxMessageBytesDefault    = 1 << 20
	MaxBufferedRecordsDefault = 10_000
	CompressionDefault        = "snappy"
)

// deliveryTimeout bounds how long a client made by Dial keeps a record it could not
// deliver: past it the record is failed instead of delivered late (the Publish that
// produced it gave up long before, and the relay sent the message again). franz-go
// enforces it only where that is safe for the idempotent producer.
const deliveryTimeout = time.Minute

var codecs = map[string]kgo.CompressionCodec{
	"none":   kgo.NoCompression(),
	"gzip":   kgo.GzipCompression(),
	"snappy": kgo.SnappyCompression(),
	"lz4":    kgo.Lz4Compression(),
	"zstd":   kgo.ZstdCompression(),
}

func (c Config) withDefaults() Config {
	c.Compression = cmp.Or(c.Compression, CompressionDefault)
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, MaxMessageBytesDefault)
	c.MaxBufferedRecords = cmp.Or(c.MaxBufferedRecords, MaxBufferedRecordsDefault)
	c.ClientID = cmp.Or(c.ClientID, "outboxkafka")
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
	if _, ok := codecs[c.Compression]; !ok && c.Compression != "" {
		return nil, &outbox.ConfigError{Field: "Compression", Reason: fmt.Sprintf("%q is not one of none, gzip, snappy, lz4, zstd", c.Compression)}
	}
	if c.MaxMessageBytes != 0 && (c.MaxMessageBytes < 512 || c.MaxMessageBytes > 100<<20) {
		return nil, &outbox.ConfigError{Field: "MaxMessageBytes", Reason: fmt.Sprintf("%d is not between 512 and 100 MiB", c.MaxMessageBytes)}
	}
	if c.MaxBufferedRecords < 0 {
		return nil, &outbox.ConfigError{Field: "MaxBufferedRecords", Reason: "must not be negative"}
	}
	route, err := outbox.ParseRoute(c.Route)
	if err != nil {
		var ce *outbox.ConfigError
		errors.As(err, &ce)
		return nil, &outbox.ConfigError{Field: "Route", Reason: ce.Reason}
	}
	// The template's fixed parts are in every topic name: a bad one would make every
	// message a rejection and dead-letter the whole outbox, so refuse it here.
	if reason := checkTopic(route.Example()); reason != "" {
		return nil, &outbox.ConfigError{Field: "Route", Reason: fmt.Sprintf("%q does not form valid topic names: %s", c.Route, reason)}
	}
	return route, nil
}

// dialOnly names the first field set that only Dial uses, or "".
func (c Config) dialOnly() string {
	switch {
	case c.Compression != "":
		return "Compression"
	case c.MaxMessageBytes != 0:
		return "MaxMessageBytes"
	case c.MaxBufferedRecords != 0:
		return "MaxBufferedRecords"
	case c.TLS != nil:
		return "TLS"
	case c.SASL != nil:
		return "SASL"
	case c.ClientID != "":
		return "ClientID"
	}
	return ""
}

// Publisher publishes outbox messages to Kafka. It implements outbox.Publisher and
// outbox.Pinger. It is safe for concurrent use.
type Publisher struct {
	route *outbox.Route
	cl    *kgo.Client
	owned bool // Dial made cl: Close closes it
	// back receives a value when the client Dial made connects to a broker after a
	// failed attempt (outbox.Reconnector); nil for New's.
	back chan struct{}

	closeOnce sync.Once
	closed    chan struct{}
}

var (
	_ outbox.Publisher   = (*Publisher)(nil)
	_ outbox.Pinger      = (*Publisher)(nil)
	_ outbox.Reconnector = (*Publisher)(nil)
)

// New returns a Publisher that produces through cl. The caller keeps owning cl: Close
// does not close it, and cl may produce other records meanwhile.
//
// cl must produce with acks=all (kgo.RequiredAcks(kgo.AllISRAcks()), franz-go's
// default) and idempotently (the default: no kgo.DisableIdempotentWrite), outside
// transactions (no kgo.TransactionalID), flushing by itself (no kgo.ManualFlushing) and
// to the record's own topic (no kgo.DefaultProduceTopicAlways). New refuses a client that
// does not, with a *outbox.ConfigError naming the option: anything weaker than acks=all
// is not a durable confirm, and the others would lose the guarantees of the package
// documentation or never send. A kgo.ProducerLinger adds to the latency of every
// Publish; Dial sets none.
func New(cl *kgo.Client, cfg Config) (*Publisher, error) {
	if cl == nil {
		return nil, errors.New("outboxkafka: New: nil client")
	}
	if f := cfg.dialOnly(); f != "" {
		return nil, &outbox.ConfigError{Field: f, Reason: "configures the client Dial builds; New uses the client's own options (see the kgo option of the same purpose)"}
	}
	route, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	return newPublisher(cl, route)
}

func newPublisher(cl *kgo.Client, route *outbox.Route) (*Publisher, error) {
	if err := checkClient(cl); err != nil {
		return nil, err
	}
	return &Publisher{route: route, cl: cl, closed: make(chan struct{})}, nil
}

// checkClient refuses a client that cannot give the guarantees of the package.
func checkClient(cl *kgo.Client) error {
	bad := func(reason string) error { return &outbox.ConfigError{Field: "client", Reason: reason} }
	if acks, _ := cl.OptValue(kgo.RequiredAcks).(kgo.Acks); acks != kgo.AllISRAcks() {
		return bad("produces without acks=all: a record acknowledged by the leader alone is lost if the leader fails; use kgo.RequiredAcks(kgo.AllISRAcks())")
	}
	if disabled, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); disabled {
		return bad("is not idempotent (kgo.DisableIdempotentWrite): the client's own retries could write a record twice or reorder a partition; Kafka 3.0+ allows idempotent writes to any client that may write the topic")
	}
	if txn := cl.OptValues(kgo.TransactionalID); len(txn) == 2 && txn[1] == true {
		return bad("is transactional (kgo.TransactionalID): records produced outside a transaction fail; use a client of its own")
	}
	if manual, _ := cl.OptValue(kgo.ManualFlushing).(bool); manual {
		return bad("flushes manually (kgo.ManualFlushing): Publish would wait for a flush nobody calls")
	}
	if always, _ := cl.OptValue(kgo.DefaultProduceTopicAlways).(bool); always {
		return bad("overrides every record's topic (kgo.DefaultProduceTopicAlways): Config.Route would be ignored")
	}
	return nil
}

// Dial builds a client for the seed brokers ("host:port"; the port defaults to 9092) and
// returns a publisher that owns it: Close closes it. Dial fails if no seed broker answers
// within ctx (5 s when ctx has no deadline); once it succeeded, the client reconnects by
// itself after any outage, retrying with backoff from 25 ms to 100 ms plus jitter
// (kgo.RetryBackoffFn; franz-go's own is 250 ms to 5 s), and tells the relay when a
// broker answers again (outbox.Reconnector), so that a relay paused by the outage
// resumes at once.
//
// The client produces with acks=all, idempotently, compressed as Config.Compression says,
// with no linger (the relay's batch is the batch: waiting for more records would only
// delay every Publish), batches of at most Config.MaxMessageBytes, at most
// Config.MaxBufferedRecords records unacknowledged, and gives up on a record still
// unacknowledged a minute after it was produced (kgo.RecordDeliveryTimeout). opts are
// applied after these and may override them, within what New accepts:
// kgo.AllowAutoTopicCreation() lets a broker with auto.create.topics.enable create
// missing topics; kgo.Dialer and kgo.WithLogger are other common ones.
func Dial(ctx context.Context, seeds []string, cfg Config, opts ...kgo.Opt) (*Publisher, error) {
	if len(seeds) == 0 {
		return nil, &outbox.ConfigError{Field: "seeds", Reason: "no seed broker given"}
	}
	route, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	hook := &reconnectHook{back: make(chan struct{}, 1)}
	defaults := []kgo.Opt{
		kgo.SeedBrokers(seeds...),
		kgo.ClientID(cfg.ClientID),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerBatchCompression(codecs[cfg.Compression], kgo.NoCompression()),
		kgo.ProducerBatchMaxBytes(int32(cfg.MaxMessageBytes)),
		kgo.MaxBufferedRecords(cfg.MaxBufferedRecords),
		kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(deliveryTimeout),
		kgo.RetryBackoffFn(reconnect.Delay),
		kgo.WithHooks(hook),
	}
	if cfg.TLS != nil {
		defaults = append(defaults, kgo.DialTLSConfig(cfg.TLS))
	}
	if cfg.SASL != nil {
		defaults = append(defaults, kgo.SASL(cfg.SASL))
	}
	where := strings.Join(seeds, ",")
	cl, err := kgo.NewClient(append(defaults, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("outboxkafka: client for %s: %w", where, err)
	}
	p, err := newPublisher(cl, route)
	if err != nil {
		cl.Close()
		return nil, err
	}
	p.owned = true
	p.back = hook.back
	ctx, cancel := withPingTimeout(ctx)
	defer cancel()
	if err := cl.Ping(ctx); err != nil {
		cl.Close()
		return nil, fmt.Errorf("outboxkafka: connect to %s: %w", where, err)
	}
	return p, nil
}

// withPingTimeout gives ctx a deadline 5 s away, for Ping and Dial, unless it has one.
func withPingTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, 5*time.Second)
}

// Client returns the client the publisher produces through.
func (p *Publisher) Client() *kgo.Client { return p.cl }

// Close closes the client if Dial made it, and makes Publish calls still waiting for
// acknowledgements return outages at once. Closing twice is safe. It does not wait for
// records in flight: the relay publishes those messages again.
func (p *Publisher) Close() {
	p.closeOnce.Do(func() {
		close(p.closed)
		if p.owned {
			p.cl.Close()
		}
	})
}

// Ping checks that a broker answers a metadata request. Its errors are outages. Without a
// deadline on ctx it gives up after 5 s.
func (p *Publisher) Ping(ctx context.Context) error {
	if p.isClosed() {
		return outbox.Outage(fmt.Errorf("outboxkafka: ping: %w", kgo.ErrClientClosed))
	}
	ctx, cancel := withPingTimeout(ctx)
	defer cancel()
	if err := p.cl.Ping(ctx); err != nil {
		return outbox.Outage(fmt.Errorf("outboxkafka: ping: %w", err))
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

// Publish implements outbox.Publisher. It produces the whole batch at once and waits
// for every acknowledgement, or until ctx is done. It returns nil when every message was
// acknowledged, otherwise a slice of len(batch) with nil for the acknowledged ones. See
// the package documentation for which errors are outages.
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
	records := make([]*kgo.Record, len(batch))
	for i, m := range batch {
		r, err := p.Record(m)
		if err != nil {
			fail(i, err)
			continue
		}
		records[i] = r
	}
	results := p.produce(ctx, records)

	// A batch-level refusal fails every record the client had buffered for the
	// partition, the innocent with the guilty: send those again one by one to find out.
	var again []int
	for i, err := range results {
		if err != nil && batchLevel(err) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		p.recheck(ctx, records, results, again)
	}
	for i, err := range results {
		if err != nil {
			fail(i, classify(err, records[i].Topic))
		}
	}
	return errs
}

// produce produces the records that are not nil, all at once, and waits for their
// outcomes. It returns franz-go's error per record (nil when Kafka acknowledged it, and
// for nil records), or an outage for each record whose outcome it stopped waiting for
// because ctx is done or the publisher closed.
func (p *Publisher) produce(ctx context.Context, records []*kgo.Record) []error {
	type outcome struct {
		i   int
		err error
	}
	results := make([]error, len(records))
	answered := make([]bool, len(records))
	done := make(chan outcome, len(records)) // promises never block
	sent := 0
	for i, r := range records {
		if r == nil {
			continue
		}
		if err := p.stopped(ctx); err != nil {
			results[i], answered[i] = err, true // do not send what nobody will wait for
			continue
		}
		sent++
		p.cl.Produce(ctx, r, func(_ *kgo.Record, err error) { done <- outcome{i, err} })
	}
	for ; sent > 0; sent-- {
		var stop error
		select {
		case o := <-done:
			results[o.i], answered[o.i] = o.err, true
			continue
		case <-ctx.Done():
			stop = ctx.Err()
		case <-p.closed:
			stop = kgo.ErrClientClosed
		}
		for i, r := range records {
			if r != nil && !answered[i] {
				results[i] = outbox.Outage(fmt.Errorf("outboxkafka: waiting for the acknowledgement of topic %q: %w", r.Topic, stop))
			}
		}
		break
	}
	return results
}

// stopped returns an outage when ctx is done or the publisher closed.
func (p *Publisher) stopped(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return outbox.Outage(fmt.Errorf("outboxkafka: publish: %w", err))
	}
	if p.isClosed() {
		return outbox.Outage(fmt.Errorf("outboxkafka: publish: %w", kgo.ErrClientClosed))
	}
	return nil
}

// recheck produces records[i] for i in idx again, each alone in its partition (one at
// a time per partition, partitions in parallel), and stores the new outcomes in
// results.
func (p *Publisher) recheck(ctx context.Context, records []*kgo.Record, results []error, idx []int) {
	type partition struct {
		topic string
		n     int32
	}
	groups := map[partition][]int{}
	for _, i := range idx {
		k := partition{records[i].Topic, records[i].Partition}
		groups[k] = append(groups[k], i)
	}
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() {
			for _, i := range g {
				r := records[i]
				again := &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: r.Headers}
				results[i] = p.produce(ctx, []*kgo.Record{again})[0]
			}
		})
	}
	wg.Wait()
}

// Record builds the Kafka record Publish sends for m: topic from the route, key, value
// and headers. It returns the rejection of m when m can never be published (no
// destination, an invalid topic name). Tests and benchmarks use it to produce exactly
// what the relay would.
func (p *Publisher) Record(m *outbox.Message) (*kgo.Record, error) {
	topic, err := p.route.Destination(m)
	if err != nil {
		return nil, fmt.Errorf("outboxkafka: %w", err)
	}
	if reason := checkTopic(topic); reason != "" {
		return nil, outbox.Permanent(fmt.Errorf("outboxkafka: invalid topic %q for message topic %q: %s: %w", topic, m.Topic, reason, kerr.InvalidTopicException))
	}
	r := &kgo.Record{Topic: topic, Value: m.Payload, Headers: headers(m)}
	if r.Value == nil {
		r.Value = []byte{} // an empty value, never a null one (a tombstone)
	}
	if m.Key != "" {
		r.Key = []byte(m.Key)
	}
	return r, nil
}

// headers returns m's wire headers. Kafka headers are a list that may repeat a name;
// a metadata header replaces an own header of the same name instead, as it does for
// every other broker.
func headers(m *outbox.Message) []kgo.RecordHeader {
	hs := make([]kgo.RecordHeader, 0, len(m.Headers)+8)
	m.WireHeaders(func(k, v string) {
		if len(hs) >= len(m.Headers) { // past the own headers, which are distinct
			if _, dup := m.Headers[k]; dup {
				for i := range hs {
					if hs[i].Key == k {
						hs[i].Value = []byte(v)
						return
					}
				}
			}
		}
		hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(v)})
	})
	return hs
}

// reconnectHook sends on back when the client connects to a broker after its last
// attempt failed (kgo.HookBrokerConnect).
type reconnectHook struct {
	back   chan struct{}
	mu     sync.Mutex
	failed bool
}

func (h *reconnectHook) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		h.failed = true
		return
	}
	if h.failed {
		h.failed = false
		select {
		case h.back <- struct{}{}:
		default: // one value pending is enough
		}
	}
}

// Reconnected implements outbox.Reconnector: the channel receives a value when the client
// Dial made connects to a broker again after a failed attempt. It is nil for a publisher
// made by New, whose client is the caller's.
func (p *Publisher) Reconnected() <-chan struct{} { return p.back }
