package outboxcli

import (
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/brokers"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxtest"
)

// reconnecting is a publisher with a reconnection signal, as the broker adapters have.
type reconnecting struct {
	outboxtest.Publisher
	back chan struct{}
}

func (p *reconnecting) Reconnected() <-chan struct{} { return p.back }

// TestFleetRouteReconnected: a publisher's reconnection signal reaches one receiver, so
// the route passes each to every relay on it; a relay whose run ended gets no more.
func TestFleetRouteReconnected(t *testing.T) {
	ctx := t.Context()
	shared := &reconnecting{back: make(chan struct{})}
	r := newFleetRoute(ctx, &brokers.Opened{Publisher: shared, Close: func() {}})
	a, releaseA := r.publisher()
	b, releaseB := r.publisher()
	defer releaseB()
	var _ outbox.Reconnector = a
	shared.back <- struct{}{}
	for _, p := range []*routePublisher{a, b} {
		testenv.AwaitRecv(t, "the reconnection signal", p.Reconnected())
	}
	releaseA()
	shared.back <- struct{}{}
	// The route passes a signal to every relay on it in one go, under its lock: once b
	// has it and the lock is free, a would have it too.
	testenv.AwaitRecv(t, "the reconnection signal", b.Reconnected())
	r.mu.Lock()
	r.mu.Unlock() // (empty: it waits for the pass to end)
	select {
	case <-a.Reconnected():
		t.Fatal("a released publisher still gets reconnection signals")
	default:
	}
}
