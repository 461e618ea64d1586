// Package awsdial holds what the AWS publishers (outboxsqs, outboxsns, outboxkinesis)
// share: their URL, "scheme://?region=...&endpoint=...&profile=...", the SDK
// configuration it loads, and a publisher's closing.
package awsdial

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"

	"github.com/outboxkit/outbox"
)

// Params are the query parameters of an AWS broker URL.
type Params struct {
	Region   string // the AWS region; empty: the SDK's (AWS_REGION, the profile)
	Endpoint string // an emulator's or a VPC endpoint's base URL
	Profile  string // the shared configuration profile to load
}

// Parse reads a "scheme://?region=...&endpoint=...&profile=..." URL. Its errors are
// *outbox.ConfigError values of the field "url", and never show the URL's credentials.
func Parse(scheme, rawURL string) (Params, error) {
	bad := func(reason string) error {
		return &outbox.ConfigError{Field: "url", Reason: fmt.Sprintf("%s: %s; want %s://?region=REGION[&endpoint=URL][&profile=NAME]", Redact(rawURL), reason, scheme)}
	}
	u, err := url.Parse(rawURL)
	switch {
	case err != nil:
		return Params{}, bad("not a URL")
	case u.Scheme != scheme:
		return Params{}, bad(fmt.Sprintf("scheme %q is not %s", u.Scheme, scheme))
	case u.Host != "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.Opaque != "":
		return Params{}, bad("the endpoint goes in the endpoint parameter, not in the URL's host or path")
	}
	var p Params
	for k, vs := range u.Query() {
		v := vs[len(vs)-1]
		switch k {
		case "region":
			p.Region = v
		case "endpoint":
			e, err := url.Parse(v)
			if err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" {
				return Params{}, bad("endpoint must be an http:// or https:// URL")
			}
			p.Endpoint = v
		case "profile":
			p.Profile = v
		default:
			return Params{}, bad(fmt.Sprintf("unknown parameter %q", k))
		}
	}
	return p, nil
}

// Redact hides user information and the endpoint's, should either carry any.
func Redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	q := u.Query()
	if e, err := url.Parse(q.Get("endpoint")); err == nil && e.User != nil {
		q.Set("endpoint", e.Redacted())
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// Load loads the SDK's configuration with p's region and profile, then opts (which
// override them). The endpoint is the client's to set (BaseEndpoint).
func (p Params) Load(ctx context.Context, opts ...func(*config.LoadOptions) error) (aws.Config, error) {
	var all []func(*config.LoadOptions) error
	if p.Region != "" {
		all = append(all, config.WithRegion(p.Region))
	}
	if p.Profile != "" {
		all = append(all, config.WithSharedConfigProfile(p.Profile))
	}
	return config.LoadDefaultConfig(ctx, append(all, opts...)...)
}

// Life is a publisher's closing: calls made under CallCtx end when Close is called.
type Life struct {
	closing context.Context
	close   context.CancelFunc
	once    sync.Once
}

// NewLife returns the Life of a publisher that is open.
func NewLife() *Life {
	closing, cancel := context.WithCancel(context.Background())
	return &Life{closing: closing, close: cancel}
}

// Close closes the publisher; closing twice is safe.
func (l *Life) Close() { l.once.Do(l.close) }

// Closed reports whether Close was called.
func (l *Life) Closed() bool { return l.closing.Err() != nil }

// CallCtx returns ctx, cancelled also when the publisher is closed.
func (l *Life) CallCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(l.closing, cancel)
	return ctx, func() { stop(); cancel() }
}

// PingCtx returns the context of a Ping: ctx, given 5 s when it has no deadline, and
// cancelled also when the publisher is closed.
func (l *Life) PingCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	timeout := func() {}
	if _, ok := ctx.Deadline(); !ok {
		ctx, timeout = context.WithTimeout(ctx, 5*time.Second)
	}
	ctx, cancel := l.CallCtx(ctx)
	return ctx, func() { cancel(); timeout() }
}

// Outage is the outage of a call to dest that ctx ended: closed wraps the publisher's
// ErrClosed when Close ended it, and the context's cause otherwise. what names the
// destination ("queue", "topic", "stream") and pkg the package in the message.
func (l *Life) Outage(ctx context.Context, pkg, what, dest string, closed error) error {
	if l.Closed() {
		return outbox.Outage(fmt.Errorf("%s: %s %q: %w", pkg, what, dest, closed))
	}
	return outbox.Outage(fmt.Errorf("%s: %s %q: %w", pkg, what, dest, context.Cause(ctx)))
}

// Batch sends the calls of one destination of an AWS publisher (SendMessageBatch,
// PublishBatch, PutRecords), each carrying a chunk of entries, and records each entry's
// outcome. E is the publisher's entry.
type Batch[E any] struct {
	Slots chan struct{} // one token per call in flight, over the publisher's calls
	// Outage is the outage of a call that ctx ended (Life.Outage for the destination).
	Outage func(ctx context.Context) error
	// Classify makes a call's error an outage or a rejection of the whole chunk.
	Classify func(error) error
	// Call makes the call for chunk and returns each entry's outcome by its index in
	// chunk (nil: stored), or the error of the call as a whole.
	Call func(ctx context.Context, chunk []E) ([]error, error)
	// Record records e's outcome.
	Record func(e E, err error)
}

// Send makes one call for chunk. When the service refuses the call as a whole for a
// reason that concerns its entries (a rejection, not an outage), it sends each entry
// alone, so that only the guilty one is rejected.
func (b Batch[E]) Send(ctx context.Context, chunk []E) {
	fail := func(err error) {
		for _, e := range chunk {
			b.Record(e, err)
		}
	}
	select {
	case b.Slots <- struct{}{}:
	case <-ctx.Done():
		fail(b.Outage(ctx))
		return
	}
	results, err := b.Call(ctx, chunk)
	<-b.Slots
	if err != nil {
		if ctx.Err() != nil {
			fail(b.Outage(ctx))
			return
		}
		err = b.Classify(err)
		if outbox.IsUnavailable(err) || len(chunk) == 1 {
			fail(err)
			return
		}
		var wg sync.WaitGroup
		for i := range chunk {
			wg.Go(func() { b.Send(ctx, chunk[i:i+1]) })
		}
		wg.Wait()
		return
	}
	for i, e := range chunk {
		b.Record(e, results[i])
	}
}
