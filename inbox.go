package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/outboxkit/outbox/outboxdriver"
)

// InboxConfig configures an Inbox.
type InboxConfig struct {
	// Consumer names the consumer: a message id is processed once per consumer, so two
	// consumers of one database that handle the same message need different names.
	// Required; at most 200 bytes of UTF-8.
	Consumer string
}

// Inbox gives a consumer exactly-once effects on top of at-least-once delivery: it runs
// the handler's work only for messages the consumer has not processed yet, and records
// the message as processed in the handler's own transaction, so the record and the
// side effects commit together or not at all.
//
// The record is inserted first thing in the transaction. A second delivery of the same
// message, concurrent or later, finds it and skips the work; a concurrent one waits for
// the first transaction to end and then does the work only if that one rolled back.
// Rows of the inbox table are kept for the retention the store's cleanup is given: it
// must be longer than the longest time a message can be redelivered (the broker's
// redelivery window, plus a relay's replay of dead letters).
//
// An Inbox is safe for concurrent use.
type Inbox[TTx any] struct {
	driver   outboxdriver.InboxDriver[TTx]
	consumer string
}

// NewInbox returns an Inbox that records through driver.
func NewInbox[TTx any](driver outboxdriver.InboxDriver[TTx], config InboxConfig) (*Inbox[TTx], error) {
	if any(driver) == nil {
		return nil, errors.New("outbox: NewInbox: missing driver")
	}
	if err := config.Validate(); err != nil {
		return nil, err
	}
	return &Inbox[TTx]{driver: driver, consumer: config.Consumer}, nil
}

// Validate checks c as NewInbox and NewVersions do: a *ConfigError names the field at
// fault.
func (c InboxConfig) Validate() error {
	switch {
	case c.Consumer == "":
		return &ConfigError{Field: "Consumer", Reason: "required: name the consumer"}
	case len(c.Consumer) > 200:
		return &ConfigError{Field: "Consumer", Reason: "longer than 200 bytes"}
	case !utf8.ValidString(c.Consumer):
		return &ConfigError{Field: "Consumer", Reason: "not valid UTF-8"}
	}
	return nil
}

// Consumer returns the consumer name.
func (in *Inbox[TTx]) Consumer() string { return in.consumer }

// ErrNoMessageID is returned for an empty message id: without one there is nothing to
// deduplicate on.
var ErrNoMessageID = errors.New("outbox: inbox: empty message id")

// Claim records message id as processed in tx and reports whether it is new. Call it
// first in the transaction that does the message's work; when it returns false, the work
// was done before (or by a concurrent delivery that committed): skip it and commit or
// roll back, then ack the message.
func (in *Inbox[TTx]) Claim(ctx context.Context, tx TTx, id string) (bool, error) {
	if id == "" {
		return false, ErrNoMessageID
	}
	fresh, err := in.driver.Claim(ctx, tx, in.consumer, []string{id})
	if err != nil {
		return false, fmt.Errorf("outbox: inbox claim: %w", err)
	}
	return fresh[0], nil
}

// ClaimBatch is Claim for many messages in one round trip, for consumers that handle a
// batch in one transaction. Repeated ids count once: only the first is fresh.
func (in *Inbox[TTx]) ClaimBatch(ctx context.Context, tx TTx, ids []string) ([]bool, error) {
	fresh := make([]bool, len(ids))
	first := make(map[string]int, len(ids))
	distinct := make([]string, 0, len(ids))
	for i, id := range ids {
		if id == "" {
			return nil, ErrNoMessageID
		}
		if _, dup := first[id]; !dup {
			first[id] = i
			distinct = append(distinct, id)
		}
	}
	if len(distinct) == 0 {
		return fresh, nil
	}
	got, err := in.driver.Claim(ctx, tx, in.consumer, distinct)
	if err != nil {
		return nil, fmt.Errorf("outbox: inbox claim: %w", err)
	}
	for i, id := range distinct {
		fresh[first[id]] = got[i]
	}
	return fresh, nil
}

// Process runs work in tx if message id is new to the consumer, after recording it, and
// reports whether it ran. An error from work is returned as it is; the caller rolls the
// transaction back, which also forgets the record, so a redelivery tries again.
func (in *Inbox[TTx]) Process(ctx context.Context, tx TTx, id string, work func(ctx context.Context) error) (bool, error) {
	fresh, err := in.Claim(ctx, tx, id)
	if err != nil || !fresh {
		return false, err
	}
	return true, work(ctx)
}

// Versions is the aggregate-version style of idempotence: an event carries the version
// of its aggregate after the change (1, 2, 3, ...), and a consumer applies it only if it
// is newer than the last version it applied for that aggregate. Unlike the Inbox it keeps
// one row per aggregate, not per message, and it also drops events that arrive after a
// newer one (an out-of-order redelivery); it suits consumers that keep the latest state
// of an aggregate, not ones that must see every event.
//
// The version travels in a header the producer sets (HeaderAggregateVersion); see
// Delivery.Version.
type Versions[TTx any] struct {
	driver   outboxdriver.VersionDriver[TTx]
	consumer string
}

// HeaderAggregateVersion is the header producers set to the aggregate's version after the
// event, for consumers using Versions.
const HeaderAggregateVersion = "Outbox-Aggregate-Version"

// NewVersions returns Versions recording through driver for the consumer named in config.
func NewVersions[TTx any](driver outboxdriver.VersionDriver[TTx], config InboxConfig) (*Versions[TTx], error) {
	in, err := NewInbox[TTx](nopInbox[TTx]{}, config)
	if err != nil {
		return nil, err
	}
	if any(driver) == nil {
		return nil, errors.New("outbox: NewVersions: missing driver")
	}
	return &Versions[TTx]{driver: driver, consumer: in.consumer}, nil
}

// Advance records version for the aggregate in tx and reports whether it is newer than
// the last applied one: apply the event only then.
func (v *Versions[TTx]) Advance(ctx context.Context, tx TTx, aggregateType, aggregateID string, version int64) (bool, error) {
	if aggregateID == "" {
		return false, errors.New("outbox: versions: empty aggregate id")
	}
	ok, err := v.driver.AdvanceVersion(ctx, tx, v.consumer, aggregateType, aggregateID, version)
	if err != nil {
		return false, fmt.Errorf("outbox: advance version: %w", err)
	}
	return ok, nil
}

// nopInbox lets NewVersions reuse NewInbox's checks of the consumer name.
type nopInbox[TTx any] struct{}

func (nopInbox[TTx]) Claim(context.Context, TTx, string, []string) ([]bool, error) { return nil, nil }

// InboxCleanupConfig configures CleanInbox.
type InboxCleanupConfig struct {
	// Retention is how long an inbox row is kept: longer than any broker keeps
	// redelivering a message, and than a dead-letter replay usually waits. Defaults to
	// 30 days (InboxRetentionDefault).
	Retention time.Duration
	// Interval between cleanup rounds. Defaults to a minute.
	Interval time.Duration
	// Batch is the most rows one statement deletes. Defaults to 10,000.
	Batch int
	// OnError, when set, is told about a failed round; the next round tries again.
	OnError func(error)
}

// InboxRetentionDefault is the default of InboxCleanupConfig.Retention.
const InboxRetentionDefault = 30 * 24 * time.Hour

// CleanInbox deletes inbox rows older than the retention through c, in batches, every
// interval, until ctx is done; then it returns ctx's error. Run it in one goroutine per
// inbox, in any number of processes: the stores delete with SKIP LOCKED where they can.
func CleanInbox(ctx context.Context, c outboxdriver.InboxCleaner, cfg InboxCleanupConfig) error {
	retention := cmp.Or(cfg.Retention, InboxRetentionDefault)
	interval := cmp.Or(cfg.Interval, time.Minute)
	batch := cmp.Or(cfg.Batch, 10_000)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		for {
			n, err := c.DeleteInbox(ctx, retention, batch)
			if err != nil {
				if cfg.OnError != nil && ctx.Err() == nil {
					cfg.OnError(err)
				}
				break
			}
			if n < batch {
				break
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
