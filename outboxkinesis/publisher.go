package outboxkinesis

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	smithy "github.com/aws/smithy-go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/awsdial"
	"github.com/outboxkit/outbox/outboxsqs"
)

// Config configures a Publisher. The zero value is usable.
type Config struct {
	// Route maps a message to its stream: a template over the message's topic, aggregate
	// type, event type and key (see outbox.ParseRoute) that gives a stream name.
	// Defaults to "{topic}".
	Route string

	// MaxRecordBytes is the largest record Publish sends, counted as Kinesis counts it
	// (data plus partition key). A larger one is rejected without being sent. Defaults
	// to 1048576 (1 MiB, MaxRecordBytesDefault), Kinesis's limit.
	MaxRecordBytes int

	// MaxInflight caps the PutRecords calls in flight at once, over all concurrent
	// Publish calls. Defaults to 16 (MaxInflightDefault).
	MaxInflight int
}

// Defaults and limits.
const (
	MaxRecordBytesDefault = 1 << 20
	MaxInflightDefault    = 16
	// maxCallRecords and maxCallBytes bound one PutRecords call.
	maxCallRecords = 500
	maxCallBytes   = 5 << 20
	// MaxPartitionKeyChars is Kinesis's limit on a partition key, in Unicode characters.
	MaxPartitionKeyChars = 256
)

func (c Config) withDefaults() Config {
	c.MaxRecordBytes = cmp.Or(c.MaxRecordBytes, MaxRecordBytesDefault)
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
	case c.MaxRecordBytes < 0 || c.MaxRecordBytes > MaxRecordBytesDefault:
		return nil, &outbox.ConfigError{Field: "MaxRecordBytes", Reason: fmt.Sprintf("must lie between 0 and %d, Kinesis's limit", MaxRecordBytesDefault)}
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
	if reason := checkStream(route.Example()); reason != "" {
		return nil, &outbox.ConfigError{Field: "Route", Reason: fmt.Sprintf("%q does not form valid stream names: %s", route.String(), reason)}
	}
	return route, nil
}

// checkStream says why name is not a valid stream name, or "": 1 to 128 ASCII letters,
// digits, _ - and .
func checkStream(name string) string {
	if len(name) == 0 || len(name) > 128 {
		return fmt.Sprintf("stream name %q is not 1 to 128 characters long", name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			return fmt.Sprintf("stream name %q holds %q: only ASCII letters, digits, _ - and . are allowed", name, r)
		}
	}
	return ""
}

// Errors Publish reports.
var (
	// ErrClosed is matched (errors.Is) by the outages of a Publisher that was closed.
	ErrClosed = errors.New("outboxkinesis: publisher closed")
	// ErrNoStream is matched by the outage reported for a stream that does not exist
	// (or that the credentials may not see).
	ErrNoStream = errors.New("outboxkinesis: stream does not exist")
	// ErrTooLarge is matched by the rejection of a record over Config.MaxRecordBytes,
	// which Publish does not send.
	ErrTooLarge = errors.New("outboxkinesis: record too large")
	// ErrInvalidStream is matched by the rejection of a message whose route gives no
	// valid stream name.
	ErrInvalidStream = errors.New("outboxkinesis: invalid stream")
)

// Publisher publishes outbox messages to Amazon Kinesis Data Streams. It implements
// outbox.Publisher and outbox.Pinger, and is safe for concurrent use.
type Publisher struct {
	client *kinesis.Client
	route  *outbox.Route
	cfg    Config
	slots  chan struct{} // one token per PutRecords call in flight

	lastStream atomic.Pointer[string] // the stream of the last successful send, for Ping

	life *awsdial.Life
}

var (
	_ outbox.Publisher = (*Publisher)(nil)
	_ outbox.Pinger    = (*Publisher)(nil)
)

// New returns a Publisher that sends through client. Close leaves the client as it is.
func New(client *kinesis.Client, cfg Config) (*Publisher, error) {
	if client == nil {
		return nil, errors.New("outboxkinesis: New: nil client")
	}
	route, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Publisher{client: client, route: route, cfg: cfg, slots: make(chan struct{}, cfg.MaxInflight), life: awsdial.NewLife()}, nil
}

// Dial makes a Kinesis client from rawURL and returns a publisher that uses it. The URL
// is "kinesis://" with optional query parameters region, endpoint (an emulator or a VPC
// endpoint, "http://127.0.0.1:4567") and profile, such as "kinesis://?region=eu-west-1".
// Credentials come from the AWS SDK's default chain, never from the URL; optFns, applied
// last, override any of it. Dial checks that Kinesis answers (Ping) and fails if it does
// not; a missing stream does not fail it.
func Dial(ctx context.Context, rawURL string, cfg Config, optFns ...func(*config.LoadOptions) error) (*Publisher, error) {
	if _, err := cfg.validate(); err != nil {
		return nil, err
	}
	params, err := awsdial.Parse("kinesis", rawURL)
	if err != nil {
		return nil, err
	}
	awsCfg, err := params.Load(ctx, optFns...)
	if err != nil {
		return nil, fmt.Errorf("outboxkinesis: load AWS configuration: %w", err)
	}
	client := kinesis.NewFromConfig(awsCfg, func(o *kinesis.Options) {
		if params.Endpoint != "" {
			o.BaseEndpoint = aws.String(params.Endpoint)
		}
		o.HTTPClient = outboxsqs.BufferRequests(o.HTTPClient)
	})
	p, err := New(client, cfg)
	if err != nil {
		return nil, err
	}
	if err := p.Ping(ctx); err != nil && !errors.Is(err, ErrNoStream) {
		p.Close()
		return nil, fmt.Errorf("outboxkinesis: connect: %w", err)
	}
	return p, nil
}

// ParseURL reads a "kinesis://?region=...&endpoint=...&profile=..." URL. Its errors
// are *outbox.ConfigError values of the field "url".
func ParseURL(rawURL string) (region, endpoint, profile string, err error) {
	p, err := awsdial.Parse("kinesis", rawURL)
	return p.Region, p.Endpoint, p.Profile, err
}

// Client returns the Kinesis client the publisher sends through.
func (p *Publisher) Client() *kinesis.Client { return p.client }

// Close makes Publish and Ping return outages (errors.Is(err, ErrClosed)) from now on and
// cancels the calls in flight. Closing twice is safe.
func (p *Publisher) Close() { p.life.Close() }

// callCtx returns ctx, cancelled also when the publisher is closed.
func (p *Publisher) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return p.life.CallCtx(ctx)
}

// ctxOutage is the outage of a call that ctx ended: the caller's deadline or Close.
func (p *Publisher) ctxOutage(ctx context.Context, dest string) error {
	return p.life.Outage(ctx, "outboxkinesis", "stream", dest, ErrClosed)
}

// Ping checks that Kinesis answers: the summary of the route's stream when it has no
// placeholders (so a missing stream is reported), else of the stream last sent to, else
// ListStreams. Its errors are outages. Without a deadline on ctx it gives up after 5 s.
func (p *Publisher) Ping(ctx context.Context) error {
	ctx, cancel := p.life.PingCtx(ctx)
	defer cancel()
	if p.life.Closed() {
		return outbox.Outage(fmt.Errorf("outboxkinesis: ping: %w", ErrClosed))
	}
	stream, ok := p.route.Static()
	if !ok {
		if last := p.lastStream.Load(); last != nil {
			stream, ok = *last, true
		}
	}
	var err error
	if ok {
		_, err = p.client.DescribeStreamSummary(ctx, &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(stream)})
		if err != nil {
			return classify(err, stream)
		}
		return nil
	}
	if _, err = p.client.ListStreams(ctx, &kinesis.ListStreamsInput{Limit: aws.Int32(1)}); err != nil {
		return outbox.Outage(fmt.Errorf("outboxkinesis: ping: %w", err))
	}
	return nil
}

// CheckStream reports whether the stream m is routed to exists: nil, the rejection
// Publish would return for m, or an outage (ErrNoStream for a missing stream). It is for
// start-up checks such as the warnings `outbox relay` logs for pending messages.
func (p *Publisher) CheckStream(ctx context.Context, m *outbox.Message) error {
	stream, err := p.stream(m)
	if err != nil {
		return err
	}
	ctx, cancel := p.callCtx(ctx)
	defer cancel()
	if _, err := p.client.DescribeStreamSummary(ctx, &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(stream)}); err != nil {
		return classify(err, stream)
	}
	return nil
}

func (p *Publisher) stream(m *outbox.Message) (string, error) {
	stream, err := p.route.Destination(m)
	if err != nil {
		return "", err
	}
	if reason := checkStream(stream); reason != "" {
		return "", fmt.Errorf("outboxkinesis: route %q gives %q for topic %q: %s: %w", p.route.String(), stream, m.Topic, reason, ErrInvalidStream)
	}
	return stream, nil
}

// Record returns the PutRecords entry Publish sends for m and its stream, or the
// rejection of m.
func (p *Publisher) Record(m *outbox.Message) (types.PutRecordsRequestEntry, string, error) {
	stream, err := p.stream(m)
	if err != nil {
		return types.PutRecordsRequestEntry{}, "", err
	}
	data, err := Encode(m)
	if err != nil {
		return types.PutRecordsRequestEntry{}, "", err
	}
	key := PartitionKey(m)
	if size := len(data) + len(key); size > p.cfg.MaxRecordBytes {
		return types.PutRecordsRequestEntry{}, "", fmt.Errorf("outboxkinesis: record for stream %q is %d bytes, over the limit of %d bytes (Config.MaxRecordBytes): %w",
			stream, size, p.cfg.MaxRecordBytes, ErrTooLarge)
	}
	return types.PutRecordsRequestEntry{Data: data, PartitionKey: aws.String(key)}, stream, nil
}

// PartitionKey returns the partition key m is sent with: its key, its id when it has
// none (it is ordered with respect to no other message), or the key's hex SHA-256 when
// it is longer than Kinesis allows. Records of one partition key go to one shard, in
// the order of their sequence numbers.
func PartitionKey(m *outbox.Message) string {
	key := m.Key
	if key == "" {
		return m.ID.String()
	}
	if utf8.RuneCountInString(key) > MaxPartitionKeyChars {
		sum := sha256.Sum256([]byte(key))
		return hex.EncodeToString(sum[:])
	}
	return key
}

// envelope is a record's data: Kinesis records carry no headers, so the outbox's travel
// beside the payload. A JSON payload is Data as it is; any other is DataBase64.
type envelope struct {
	Headers    map[string]string `json:"headers"`
	Data       json.RawMessage   `json:"data,omitempty"`
	DataBase64 string            `json:"data_base64,omitempty"`
}

// Encode returns the data of the record that carries m: a JSON object with "headers"
// (outbox.Message.WireHeaders) and the payload as "data" when it is compact JSON of a
// JSON content type (Decode then gets it back byte for byte), or as "data_base64"
// otherwise. Decode reverses it.
func Encode(m *outbox.Message) ([]byte, error) {
	env := envelope{Headers: map[string]string{}}
	m.WireHeaders(func(k, v string) { env.Headers[k] = v })
	if len(m.Payload) > 0 {
		var compact bytes.Buffer
		if outbox.IsJSONContentType(m.ContentType) && json.Compact(&compact, m.Payload) == nil && bytes.Equal(compact.Bytes(), m.Payload) {
			env.Data = m.Payload
		} else {
			env.DataBase64 = base64.StdEncoding.EncodeToString(m.Payload)
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // the payload's characters stay as they are
	if err := enc.Encode(env); err != nil {
		return nil, fmt.Errorf("outboxkinesis: encode message %s: %w", m.ID, err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// Decode returns the payload and headers of a record a Publisher sent.
func Decode(data []byte) (payload []byte, headers map[string]string, err error) {
	var env envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return nil, nil, fmt.Errorf("outboxkinesis: decode record: %w", err)
	}
	switch {
	case env.Data != nil:
		payload = []byte(env.Data)
	case env.DataBase64 != "":
		if payload, err = base64.StdEncoding.DecodeString(env.DataBase64); err != nil {
			return nil, nil, fmt.Errorf("outboxkinesis: decode data_base64: %w", err)
		}
	default:
		payload = []byte{}
	}
	if env.Headers == nil {
		env.Headers = map[string]string{}
	}
	return payload, env.Headers, nil
}

type entry struct {
	i    int
	req  types.PutRecordsRequestEntry
	size int
}

// Publish implements outbox.Publisher. It groups the batch by stream and sends each
// stream's records in PutRecords calls of up to 500 records and 5 MiB, all at once (at
// most Config.MaxInflight in flight over all Publish calls). A record is confirmed when
// Kinesis gave it a sequence number. It returns nil when every record was, otherwise a
// slice of len(batch) with nil for the confirmed ones.
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
		return fail(outbox.Outage(fmt.Errorf("outboxkinesis: publish: %w", ErrClosed)))
	}
	if err := ctx.Err(); err != nil {
		return fail(outbox.Outage(fmt.Errorf("outboxkinesis: publish: %w", err)))
	}
	ctx, cancel := p.callCtx(ctx)
	defer cancel()
	byStream := map[string][]entry{}
	for i, m := range batch {
		req, stream, err := p.Record(m)
		if err != nil {
			errs[i] = err
			continue
		}
		byStream[stream] = append(byStream[stream], entry{i: i, req: req, size: len(req.Data) + len(*req.PartitionKey)})
	}
	var wg sync.WaitGroup
	for stream, entries := range byStream {
		start, total := 0, 0
		for i, e := range entries {
			if i-start == maxCallRecords || (i > start && total+e.size > maxCallBytes) {
				chunk := entries[start:i]
				wg.Go(func() { p.send(ctx, stream, chunk, errs) })
				start, total = i, 0
			}
			total += e.size
		}
		chunk := entries[start:]
		wg.Go(func() { p.send(ctx, stream, chunk, errs) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return errs
		}
	}
	return nil
}

// send sends one PutRecords call (awsdial.Batch: a call Kinesis refuses as a whole for its
// records is sent again record by record).
func (p *Publisher) send(ctx context.Context, stream string, chunk []entry, errs []error) {
	awsdial.Batch[entry]{
		Slots:    p.slots,
		Outage:   func(ctx context.Context) error { return p.ctxOutage(ctx, stream) },
		Classify: func(err error) error { return classify(err, stream) },
		Record:   func(e entry, err error) { errs[e.i] = err },
		Call: func(ctx context.Context, chunk []entry) ([]error, error) {
			records := make([]types.PutRecordsRequestEntry, len(chunk))
			for i, e := range chunk {
				records[i] = e.req
			}
			out, err := p.client.PutRecords(ctx, &kinesis.PutRecordsInput{StreamName: aws.String(stream), Records: records})
			if err != nil {
				return nil, err
			}
			p.lastStream.Store(&stream)
			results := make([]error, len(chunk))
			for i := range chunk {
				switch {
				case i >= len(out.Records):
					results[i] = outbox.Outage(fmt.Errorf("outboxkinesis: stream %q: PutRecords returned no result for record %d", stream, i))
				case out.Records[i].ErrorCode != nil || out.Records[i].SequenceNumber == nil:
					// ProvisionedThroughputExceededException or InternalFailure: Kinesis's
					// side, sent again later.
					r := out.Records[i]
					results[i] = outbox.Outage(fmt.Errorf("outboxkinesis: stream %q: record not stored: %s: %s", stream, aws.ToString(r.ErrorCode), aws.ToString(r.ErrorMessage)))
				}
			}
			return results, nil
		},
	}.Send(ctx, chunk)
}

// classify turns the error of a call for stream into an outage or a rejection.
func classify(err error, stream string) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return outbox.Outage(fmt.Errorf("outboxkinesis: stream %q: %w", stream, err))
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode() {
		case "ResourceNotFoundException":
			return outbox.DestinationOutage("stream "+stream, fmt.Errorf("%w: %q: create it (for example: aws kinesis create-stream --stream-name %s --shard-count 1) or fix the publisher's Route (%w)",
				ErrNoStream, stream, stream, err))
		case "ValidationException", "InvalidArgumentException":
			return fmt.Errorf("outboxkinesis: stream %q refused the records: %w", stream, err)
		}
	}
	// Throttling, KMS and credential problems, a stream being updated, 5xx, network
	// errors and anything unknown: pause, lose nothing.
	return outbox.Outage(fmt.Errorf("outboxkinesis: stream %q: %w", stream, err))
}
