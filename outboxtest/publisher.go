// Package outboxtest gives users of outbox fakes for their own tests: an in-memory
// Publisher that records what the relay sends and can be told to fail, and an in-memory
// Store to write messages into and run relays on, without a database server.
package outboxtest

import (
	"context"
	"fmt"
	"sync"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

// Publisher is an in-memory outbox.Publisher. It confirms every message unless Fail says
// otherwise, and keeps what it confirmed in order. It is safe for concurrent use.
type Publisher struct {
	// Fail, when set, is asked about each message before it is confirmed; a non-nil
	// error fails that message (wrap it with outbox.Outage to simulate an outage). It is
	// called with the Publisher's lock held, one message at a time: it must not block
	// (to hold a publish, wrap the Publisher instead).
	Fail func(*outbox.Message) error

	mu       sync.Mutex
	msgs     []outbox.Message
	attempts int
	changed  chan struct{}
}

var _ outbox.Publisher = (*Publisher)(nil)

// Publish implements outbox.Publisher.
func (p *Publisher) Publish(ctx context.Context, batch []*outbox.Message) []error {
	var errs []error
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, m := range batch {
		p.attempts++
		err := ctx.Err()
		if err == nil && p.Fail != nil {
			err = p.Fail(m)
		}
		if err != nil {
			if errs == nil {
				errs = make([]error, len(batch))
			}
			errs[i] = err
			continue
		}
		c := *m
		c.Payload = append([]byte(nil), m.Payload...)
		p.msgs = append(p.msgs, c)
	}
	if p.changed != nil {
		close(p.changed)
		p.changed = nil
	}
	return errs
}

// Messages returns copies of the confirmed messages, in confirmation order.
func (p *Publisher) Messages() []outbox.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]outbox.Message(nil), p.msgs...)
}

// Attempts returns how many messages Publish was asked to send, failed ones included.
func (p *Publisher) Attempts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.attempts
}

// WaitFor blocks until at least n messages were confirmed or ctx ends, and returns the
// confirmed messages.
func (p *Publisher) WaitFor(ctx context.Context, n int) ([]outbox.Message, error) {
	for {
		p.mu.Lock()
		if len(p.msgs) >= n {
			out := append([]outbox.Message(nil), p.msgs...)
			p.mu.Unlock()
			return out, nil
		}
		if p.changed == nil {
			p.changed = make(chan struct{})
		}
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return p.Messages(), ctx.Err()
		}
	}
}

// Await waits until at least n messages were confirmed and returns the confirmed
// messages. It fails t only when no new message was confirmed for OUTBOX_TEST_STALL (a Go
// duration, default 2 minutes), however long the whole wait takes: a slow machine passes,
// a stuck relay fails with the count it reached. Call it from the test's goroutine.
func (p *Publisher) Await(t interface {
	Helper()
	Fatal(args ...any)
}, n int) []outbox.Message {
	t.Helper()
	var got []outbox.Message
	err := testenv.Progress(context.Background(), fmt.Sprintf("%d messages published", n), testenv.Stall(), func() (any, bool) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if len(p.msgs) >= n {
			got = append([]outbox.Message(nil), p.msgs...)
			return nil, true
		}
		// Only confirmations count: a relay that retries a rejected message forever
		// makes attempts but no progress.
		return fmt.Sprintf("%d published", len(p.msgs)), false
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}
