package outbox

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"time"
	"unicode/utf8"
)

// RelayConfig configures a Relay. The zero value is usable: every field has a default.
type RelayConfig struct {
	// ID names this relay in leases, logs and `outbox status`. It must be unique among
	// running relays. Defaults to hostname-pid-random.
	ID string

	// Fingerprint identifies where this relay sends messages: any text that changes
	// whenever its destinations or routing change (the outbox daemon uses a hash of
	// them), at most 200 bytes. Relays of one outbox whose fingerprints differ never hold
	// shards at the same time: a relay whose fingerprint differs from those of the relays
	// holding shards takes none until they have all stopped, and says so in its log.
	// Empty, the default: the relay states none and shares the shards with every relay.
	Fingerprint string

	// BatchSize is how many messages one fetch reads. Defaults to 1000.
	BatchSize int

	// MaxInFlight caps messages sent to the broker and not yet confirmed. Defaults to
	// 2000.
	MaxInFlight int

	// PublishBatchSize caps the messages of one Publisher.Publish call; up to
	// MaxInFlight/PublishBatchSize calls run at once. Defaults to 250, or to MaxInFlight
	// when that is smaller.
	PublishBatchSize int

	// PollInterval is how often the relay looks for due messages when nothing wakes it:
	// the fallback when LISTEN/NOTIFY is unavailable, and the pace at which retries and
	// delayed messages are noticed. Defaults to 500ms.
	PollInterval time.Duration

	// LeaseTTL is how long a shard lease lasts without renewal, in database time. Leases
	// are renewed every LeaseTTL/3 or every second, whichever is shorter, and a dead
	// relay's shards are taken over within LeaseTTL plus one renewal interval. Defaults
	// to 15s.
	LeaseTTL time.Duration

	// MaxAttempts is how many rejected attempts a message gets before it is
	// dead-lettered. Outages do not count. Defaults to 10.
	MaxAttempts int

	// RetryMinDelay and RetryMaxDelay bound the backoff after a rejection: the n-th
	// rejection waits RetryMinDelay plus a random duration in [0, min(RetryMaxDelay,
	// RetryMinDelay*2^(n-1))) (exponential with full jitter). Defaults to 1s and 5m.
	RetryMinDelay time.Duration
	RetryMaxDelay time.Duration

	// OutageMinDelay and OutageMaxDelay bound the pause after a broker outage, growing
	// the same way with each consecutive outage; at the end of each pause the broker is
	// probed (Pinger). Defaults to 100ms and 1s: a probe is one ping, and the ceiling
	// bounds how late a relay notices that a broker is back when its publisher cannot say
	// so itself (Reconnector: NATS, RabbitMQ and Kafka publishers say so, and the relay
	// resumes at once).
	OutageMinDelay time.Duration
	OutageMaxDelay time.Duration

	// PublishTimeout bounds one Publish call; a timeout is treated as an outage (the
	// outcome is unknown, so the message is sent again). Defaults to 30s.
	PublishTimeout time.Duration

	// Retention is how long published messages are kept before the cleaner deletes them
	// (or, on a store that keeps them in daily partitions, drops their day). -1 keeps them
	// forever. Defaults to 7 days (168h).
	Retention time.Duration

	// CleanupInterval is how often the cleaner runs, and CleanupBatch how many rows one
	// of its DELETE statements removes at most. Defaults to 1m and 1000.
	CleanupInterval time.Duration
	CleanupBatch    int

	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger

	// Observer receives the relay's events, for metrics and tracing. Defaults to none.
	Observer Observer

	// WAL, when set, turns on WAL mode: the relay fetches when the database's log shows
	// a commit to the outbox, instead of polling (WALConfig). Nil: polling, woken by
	// LISTEN/NOTIFY where the store can.
	WAL *WALConfig
}

// Defaults for RelayConfig.
const (
	BatchSizeDefault        = 1000
	MaxInFlightDefault      = 2000
	PublishBatchSizeDefault = 250
	PollIntervalDefault     = 500 * time.Millisecond
	LeaseTTLDefault         = 15 * time.Second
	MaxAttemptsDefault      = 10
	RetryMinDelayDefault    = time.Second
	RetryMaxDelayDefault    = 5 * time.Minute
	OutageMinDelayDefault   = 100 * time.Millisecond
	OutageMaxDelayDefault   = time.Second
	PublishTimeoutDefault   = 30 * time.Second
	RetentionDefault        = 7 * 24 * time.Hour
	CleanupIntervalDefault  = time.Minute
	CleanupBatchDefault     = 1000
)

func (c RelayConfig) withDefaults() RelayConfig {
	if c.ID == "" {
		host, _ := os.Hostname()
		var b [3]byte
		_, _ = rand.Read(b[:])
		c.ID = fmt.Sprintf("%s-%d-%s", cmp.Or(host, "relay"), os.Getpid(), hex.EncodeToString(b[:]))
	}
	c.BatchSize = cmp.Or(c.BatchSize, BatchSizeDefault)
	c.MaxInFlight = cmp.Or(c.MaxInFlight, MaxInFlightDefault)
	c.PublishBatchSize = cmp.Or(c.PublishBatchSize, min(PublishBatchSizeDefault, c.MaxInFlight))
	c.PollInterval = cmp.Or(c.PollInterval, PollIntervalDefault)
	c.LeaseTTL = cmp.Or(c.LeaseTTL, LeaseTTLDefault)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, MaxAttemptsDefault)
	c.RetryMinDelay = cmp.Or(c.RetryMinDelay, RetryMinDelayDefault)
	c.RetryMaxDelay = cmp.Or(c.RetryMaxDelay, RetryMaxDelayDefault)
	c.OutageMinDelay = cmp.Or(c.OutageMinDelay, OutageMinDelayDefault)
	c.OutageMaxDelay = cmp.Or(c.OutageMaxDelay, OutageMaxDelayDefault)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, PublishTimeoutDefault)
	c.Retention = cmp.Or(c.Retention, RetentionDefault)
	c.CleanupInterval = cmp.Or(c.CleanupInterval, CleanupIntervalDefault)
	c.CleanupBatch = cmp.Or(c.CleanupBatch, CleanupBatchDefault)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Observer == nil {
		c.Observer = NopObserver{}
	}
	if c.WAL != nil {
		w := *c.WAL
		w.SafetyPoll = cmp.Or(w.SafetyPoll, WALSafetyPollDefault)
		w.Heartbeat = cmp.Or(w.Heartbeat, WALHeartbeatDefault)
		c.WAL = &w
	}
	return c
}

// Validate checks c as NewRelay does, with the defaults of the fields left zero: a
// *ConfigError names the field at fault.
func (c RelayConfig) Validate() error { return c.withDefaults().validate() }

func (c RelayConfig) validate() error {
	positive := []struct {
		name string
		v    int64
	}{
		{"BatchSize", int64(c.BatchSize)},
		{"MaxInFlight", int64(c.MaxInFlight)},
		{"PublishBatchSize", int64(c.PublishBatchSize)},
		{"PollInterval", int64(c.PollInterval)},
		{"LeaseTTL", int64(c.LeaseTTL)},
		{"MaxAttempts", int64(c.MaxAttempts)},
		{"RetryMinDelay", int64(c.RetryMinDelay)},
		{"RetryMaxDelay", int64(c.RetryMaxDelay)},
		{"OutageMinDelay", int64(c.OutageMinDelay)},
		{"OutageMaxDelay", int64(c.OutageMaxDelay)},
		{"PublishTimeout", int64(c.PublishTimeout)},
		{"CleanupInterval", int64(c.CleanupInterval)},
		{"CleanupBatch", int64(c.CleanupBatch)},
	}
	for _, p := range positive {
		if p.v < 0 {
			return &ConfigError{Field: p.name, Reason: "must not be negative"}
		}
	}
	switch {
	case c.Retention < 0 && c.Retention != -1:
		return &ConfigError{Field: "Retention", Reason: "must be positive, or -1 to keep published messages forever"}
	case c.LeaseTTL < time.Second:
		return &ConfigError{Field: "LeaseTTL", Reason: "must be at least 1s"}
	case c.PublishBatchSize > c.MaxInFlight:
		return &ConfigError{Field: "PublishBatchSize", Reason: fmt.Sprintf("%d is larger than MaxInFlight (%d)", c.PublishBatchSize, c.MaxInFlight)}
	case c.RetryMaxDelay < c.RetryMinDelay:
		return &ConfigError{Field: "RetryMaxDelay", Reason: "is shorter than RetryMinDelay"}
	case c.OutageMaxDelay < c.OutageMinDelay:
		return &ConfigError{Field: "OutageMaxDelay", Reason: "is shorter than OutageMinDelay"}
	case len(c.ID) > 200:
		return &ConfigError{Field: "ID", Reason: "longer than 200 bytes"}
	case len(c.Fingerprint) > 200:
		return &ConfigError{Field: "Fingerprint", Reason: "longer than 200 bytes"}
	case !utf8.ValidString(c.Fingerprint):
		return &ConfigError{Field: "Fingerprint", Reason: "not valid UTF-8"}
	case c.WAL != nil && c.WAL.SafetyPoll < 0 && c.WAL.SafetyPoll != -1:
		return &ConfigError{Field: "WAL.SafetyPoll", Reason: "must be positive, or -1 for none"}
	case c.WAL != nil && c.WAL.Heartbeat < 0 && c.WAL.Heartbeat != -1:
		return &ConfigError{Field: "WAL.Heartbeat", Reason: "must be positive, or -1 for none"}
	}
	return nil
}

// backoff returns min + a random duration in [0, min(max, min*2^(n-1))): exponential
// growth with full jitter, never shorter than min so that a failing message cannot spin.
func backoff(n int, min, max time.Duration) time.Duration {
	if n < 1 {
		n = 1
	}
	ceiling := max
	if n < 40 {
		if d := min << (n - 1); d > 0 && d < max {
			ceiling = d
		}
	}
	return min + randDuration(ceiling)
}

func randDuration(n time.Duration) time.Duration {
	if n <= 0 {
		return 0
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	var u uint64
	for _, x := range b {
		u = u<<8 | uint64(x)
	}
	return time.Duration(u % uint64(n))
}
