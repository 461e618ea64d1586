package outboxcli

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/brokers"
)

// A fleet's outboxes with one route share its broker connection. A relay draining a
// backlog keeps up to --max-in-flight messages on it, and a broker takes a connection's
// messages in the order they were sent: another outbox's message, sent behind them, waits
// for all of them. So a route has two lanes: the shared connection, and a second one
// (opened the first time an outbox needs it) that carries the publishes of every outbox
// with more than bulkInFlight messages in flight on the route. An outbox with a message
// now and then keeps the shared lane to itself and the others like it.
//
// Per-key order holds across the lanes: a relay sends a key's next message only after
// the broker confirmed the one before (the key gate), whichever lane carried it.

// bulkInFlight is how many messages an outbox may have in flight on a route's shared
// lane: past it, its publishes go to the route's bulk lane.
const bulkInFlight = 200

// bulkRetry is how long a route waits, after its bulk lane failed to connect, before it
// tries again; meanwhile every outbox publishes on the shared lane.
const bulkRetry = 10 * time.Second

// fleetRoute is one route's broker connections.
type fleetRoute struct {
	name   string
	shared *brokers.Opened
	open   func(context.Context) (*brokers.Opened, error) // another connection like shared
	log    *slog.Logger
	ctx    context.Context // the fleet's: ends the bulk lane's connecting

	mu        sync.Mutex
	bulk      *brokers.Opened // nil until opened
	opening   bool
	failedAt  time.Time
	listeners map[chan struct{}]bool // the running relays' Reconnected channels
	closed    bool
}

func newFleetRoute(ctx context.Context, name string, shared *brokers.Opened, open func(context.Context) (*brokers.Opened, error), log *slog.Logger) *fleetRoute {
	r := &fleetRoute{name: name, shared: shared, open: open, log: log, ctx: ctx, listeners: map[chan struct{}]bool{}}
	r.forward(shared.Publisher)
	return r
}

// forward passes pub's reconnection signals to every relay on the route: a publisher
// has one Reconnected channel, and each signal on it reaches one receiver.
func (r *fleetRoute) forward(pub outbox.Publisher) {
	rc, ok := pub.(outbox.Reconnector)
	if !ok {
		return
	}
	back := rc.Reconnected()
	if back == nil {
		return
	}
	go func() {
		for {
			select {
			case <-r.ctx.Done():
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
}

// bulkLane returns the bulk lane's publisher, or nil while it is not open: then it
// starts opening it in the background (unless a failed attempt was less than bulkRetry
// ago), so that no publish waits for a connection.
func (r *fleetRoute) bulkLane() outbox.Publisher {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bulk != nil {
		return r.bulk.Publisher
	}
	if r.opening || r.closed || time.Since(r.failedAt) < bulkRetry {
		return nil
	}
	r.opening = true
	go func() {
		ctx, cancel := context.WithTimeout(r.ctx, 30*time.Second)
		defer cancel()
		opened, err := r.open(ctx)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.opening = false
		switch {
		case err != nil:
			r.failedAt = time.Now()
			r.log.Warn("could not open the route's second broker connection, for outboxes draining a backlog; they share the first meanwhile",
				"route", r.name, "err", err, "retry_in", bulkRetry)
		case r.closed:
			opened.Close()
		default:
			r.bulk = opened
			r.forward(opened.Publisher)
			r.log.Info("opened the route's second broker connection, for outboxes draining a backlog", "route", r.name)
		}
	}()
	return nil
}

// close closes the route's connections; the relays on it have stopped.
func (r *fleetRoute) close() {
	r.mu.Lock()
	r.closed = true
	bulk := r.bulk
	r.mu.Unlock()
	if bulk != nil {
		bulk.Close()
	}
	r.shared.Close()
}

// publisher returns the publisher one relay run of an outbox uses; done releases it when
// the run has returned.
func (r *fleetRoute) publisher() (pub *lanePublisher, done func()) {
	p := &lanePublisher{route: r, back: make(chan struct{}, 1)}
	r.mu.Lock()
	r.listeners[p.back] = true
	r.mu.Unlock()
	return p, func() {
		r.mu.Lock()
		delete(r.listeners, p.back)
		r.mu.Unlock()
	}
}

// lanePublisher is one outbox's publisher on a route: the shared lane while it has at
// most bulkInFlight messages in flight, the bulk lane past that.
type lanePublisher struct {
	route    *fleetRoute
	inFlight atomic.Int64
	back     chan struct{}
}

func (p *lanePublisher) Publish(ctx context.Context, batch []*outbox.Message) []error {
	n := int64(len(batch))
	defer p.inFlight.Add(-n)
	lane := p.route.shared.Publisher
	if p.inFlight.Add(n) > bulkInFlight {
		if bulk := p.route.bulkLane(); bulk != nil {
			lane = bulk
		}
	}
	return lane.Publish(ctx, batch)
}

// Reconnected fires when either of the route's connections is back.
func (p *lanePublisher) Reconnected() <-chan struct{} { return p.back }

// Ping checks the shared lane, and the bulk lane if it is open.
func (p *lanePublisher) Ping(ctx context.Context) error {
	var errs []error
	lanes := []outbox.Publisher{p.route.shared.Publisher}
	p.route.mu.Lock()
	if p.route.bulk != nil {
		lanes = append(lanes, p.route.bulk.Publisher)
	}
	p.route.mu.Unlock()
	for _, l := range lanes {
		if pg, ok := l.(outbox.Pinger); ok {
			errs = append(errs, pg.Ping(ctx))
		}
	}
	return errors.Join(errs...)
}
