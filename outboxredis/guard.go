package outboxredis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox"
)

// GuardConfig configures a Guard.
type GuardConfig struct {
	// Consumer names the consumer; message ids are guarded per consumer. Required.
	Consumer string
	// TTL is how long a handled message's id is remembered. It must be longer than the
	// longest time a message can be redelivered. Defaults to 24h.
	TTL time.Duration
	// Lease is how long a delivery in progress holds its id: another delivery of the
	// same message meanwhile is retried later, not run. It must be longer than the
	// handler's longest run. Defaults to 5m.
	Lease time.Duration
	// Prefix of the marker keys ("<Prefix><Consumer>:<id>"). Defaults to
	// "outbox-guard:".
	Prefix string
}

// Guard deduplicates deliveries with Redis keys (SET NX with a TTL), for handlers whose
// effects are not in a database the Inbox could share a transaction with: calling an
// API, sending an e-mail.
//
// What it guarantees: while the marker lives, a message handled successfully is not
// handled again, and two deliveries of one message do not run at the same time.
//
// What it does not: the marker and the handler's effect are not atomic. A crash after
// the effect and before the marker is set to done lets a redelivery run the handler
// again once the lease expires: at-least-once, not exactly-once. The marker is also
// lost if Redis loses it (no persistence, a failover before replication, eviction under
// maxmemory: use a noeviction policy) or after TTL. For exactly-once effects, keep them
// in a database and use outbox.Inbox; make external calls idempotent themselves
// (an idempotency key of the message id) where the API allows.
type Guard struct {
	client redis.UniversalClient
	cfg    GuardConfig
}

// NewGuard returns a Guard over client.
func NewGuard(client redis.UniversalClient, cfg GuardConfig) (*Guard, error) {
	if client == nil {
		return nil, errors.New("outboxredis: NewGuard: nil client")
	}
	if cfg.Consumer == "" {
		return nil, &outbox.ConfigError{Field: "Consumer", Reason: "required: name the consumer"}
	}
	if cfg.TTL < 0 || cfg.Lease < 0 {
		return nil, &outbox.ConfigError{Field: "TTL", Reason: "durations must not be negative"}
	}
	cfg.TTL = cmp.Or(cfg.TTL, 24*time.Hour)
	cfg.Lease = cmp.Or(cfg.Lease, 5*time.Minute)
	cfg.Prefix = cmp.Or(cfg.Prefix, "outbox-guard:")
	return &Guard{client: client, cfg: cfg}, nil
}

const (
	guardRunning = "running"
	guardDone    = "done"
)

// ErrInProgress is the error (made with outbox.Retry) a guarded handler returns for a
// delivery of a message another delivery is handling: the runner delivers it again
// later.
var ErrInProgress = errors.New("outboxredis: the message is being handled by another delivery")

// Handler wraps h: it runs h only for messages not handled before, marking each running
// while h runs and done after h succeeds; a failed h releases the mark so that a retry
// runs. A Redis error is returned for the runner to retry.
func (g *Guard) Handler(h outbox.Handler) outbox.Handler {
	return func(ctx context.Context, d *outbox.Delivery) error {
		key := g.cfg.Prefix + g.cfg.Consumer + ":" + d.ID
		ok, err := g.client.SetNX(ctx, key, guardRunning, g.cfg.Lease).Result()
		if err != nil {
			return fmt.Errorf("outboxredis: guard %s: %w", d.ID, err)
		}
		if !ok {
			state, err := g.client.Get(ctx, key).Result()
			switch {
			case errors.Is(err, redis.Nil): // expired between the two calls: try again
				return outbox.Retry(ErrInProgress, time.Second)
			case err != nil:
				return fmt.Errorf("outboxredis: guard %s: %w", d.ID, err)
			case state == guardDone:
				return nil // handled before
			default:
				return outbox.Retry(ErrInProgress, min(g.cfg.Lease, 5*time.Second))
			}
		}
		if err := h(ctx, d); err != nil {
			// Let a redelivery run it; if this fails, the lease runs out instead.
			_ = g.client.Del(context.WithoutCancel(ctx), key).Err()
			return err
		}
		// The work is done: ack. If the mark cannot be set to done, it expires with the
		// lease, and a redelivery after that runs the handler again.
		_ = g.client.Set(context.WithoutCancel(ctx), key, guardDone, g.cfg.TTL).Err()
		return nil
	}
}
