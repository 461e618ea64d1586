package outboxcli

import (
	"context"
	"sync"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/brokers"
)

// A fleet's outboxes with one route share its broker connection, and each outbox's relay
// listens for the connection's comebacks (outbox.Reconnector): a publisher has one
// Reconnected channel, and each signal on it reaches one receiver, so the route passes
// each signal on to every relay on it.

// fleetRoute is one route's broker connection.
type fleetRoute struct {
	shared *brokers.Opened

	mu        sync.Mutex
	listeners map[chan struct{}]bool // the running relays' Reconnected channels
}

// newFleetRoute returns the route over shared; its signals are passed on until ctx ends.
func newFleetRoute(ctx context.Context, shared *brokers.Opened) *fleetRoute {
	r := &fleetRoute{shared: shared, listeners: map[chan struct{}]bool{}}
	rc, ok := shared.Publisher.(outbox.Reconnector)
	if !ok {
		return r
	}
	back := rc.Reconnected()
	if back == nil {
		return r
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-back:
			}
			r.mu.Lock()
			for ch := range r.listeners {
				select {
				case ch <- struct{}{}:
				default: // one pending signal is enough
				}
			}
			r.mu.Unlock()
		}
	}()
	return r
}

// close closes the route's connection; the relays on it have stopped.
func (r *fleetRoute) close() { r.shared.Close() }

// publisher returns the publisher one relay run of an outbox uses; done releases it when
// the run has returned.
func (r *fleetRoute) publisher() (pub *routePublisher, done func()) {
	p := &routePublisher{route: r, back: make(chan struct{}, 1)}
	r.mu.Lock()
	r.listeners[p.back] = true
	r.mu.Unlock()
	return p, func() {
		r.mu.Lock()
		delete(r.listeners, p.back)
		r.mu.Unlock()
	}
}

// routePublisher is one relay run's publisher on a route: the route's, with a
// reconnection signal of its own.
type routePublisher struct {
	route *fleetRoute
	back  chan struct{}
}

func (p *routePublisher) Publish(ctx context.Context, batch []*outbox.Message) []error {
	return p.route.shared.Publisher.Publish(ctx, batch)
}

// Reconnected fires when the route's connection is back.
func (p *routePublisher) Reconnected() <-chan struct{} { return p.back }

// Ping checks the route's connection (nil when its publisher cannot tell).
func (p *routePublisher) Ping(ctx context.Context) error {
	if pg, ok := p.route.shared.Publisher.(outbox.Pinger); ok {
		return pg.Ping(ctx)
	}
	return nil
}
