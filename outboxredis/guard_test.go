package outboxredis_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxredis"
)

func TestGuard(t *testing.T) {
	t.Parallel()
	c := newClient(t, sharedAddr())
	prefix := uniqueStream(t, c) + ":"
	g, err := outboxredis.NewGuard(c, outboxredis.GuardConfig{Consumer: "mailer", Prefix: prefix, TTL: time.Minute, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var sent atomic.Int32
	release := make(chan struct{})
	h := g.Handler(func(ctx context.Context, d *outbox.Delivery) error {
		sent.Add(1)
		<-release
		return nil
	})
	ctx := context.Background()
	d := &outbox.Delivery{ID: "m-1"}

	// Two deliveries at once: one runs, and holds the lease until released; the other is
	// told to retry later, while the first still runs. (The lease is long: a slow machine
	// must not let it expire before the second delivery looks.)
	results := make(chan error, 2)
	for range 2 {
		go func() { results <- h(ctx, d) }()
	}
	var errs []error
	testenv.Await(t, "one of two concurrent deliveries to return while the other runs", func() (any, bool) {
		select {
		case err := <-results:
			errs = append(errs, err)
			return nil, true
		default:
			return fmt.Sprintf("%d handler runs", sent.Load()), false
		}
	})
	close(release)
	errs = append(errs, testenv.AwaitRecv(t, "the released delivery to return", results))
	inProgress := 0
	for _, err := range errs {
		if errors.Is(err, outboxredis.ErrInProgress) && outbox.RetryDelay(err, 0) > 0 {
			inProgress++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if sent.Load() != 1 || inProgress != 1 {
		t.Fatalf("handler ran %d times, %d deliveries told to retry; want 1 and 1", sent.Load(), inProgress)
	}
	// Handled: a later delivery is acked without running.
	if err := h(ctx, d); err != nil || sent.Load() != 1 {
		t.Fatalf("redelivery after success: %v, ran %d times", err, sent.Load())
	}
	// A failed run releases the mark: the retry runs.
	fails := 1
	h2 := g.Handler(func(ctx context.Context, d *outbox.Delivery) error {
		if fails > 0 {
			fails--
			return errors.New("smtp down")
		}
		sent.Add(1)
		return nil
	})
	if err := h2(ctx, &outbox.Delivery{ID: "m-2"}); err == nil {
		t.Fatal("the failing run reported success")
	}
	if err := h2(ctx, &outbox.Delivery{ID: "m-2"}); err != nil || sent.Load() != 2 {
		t.Fatalf("retry after a failure: %v, ran %d", err, sent.Load())
	}
	if _, err := outboxredis.NewGuard(c, outboxredis.GuardConfig{}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Fatalf("no consumer: %v", err)
	}
}
