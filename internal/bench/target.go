package bench

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/brokers"
)

// Target is the broker side of a run. Every broker has one, in target_<broker>.go.
type Target interface {
	// Prepare creates an empty destination (stream, queue, topic) for one phase of the
	// run, named after name (lower-case letters, digits and '_'), and returns the route
	// that sends every message there (a template without placeholders) and a function
	// that deletes it.
	Prepare(ctx context.Context, name string) (route string, drop func(), err error)

	// Broker returns the broker URL and settings that each relay of a run opens its
	// publisher with, through internal/brokers as `outbox relay` opens its own; the run
	// sets the route.
	Broker() (url string, s brokers.Settings)

	// Raw publishes msgs to route with the broker's client library directly, as fast as
	// that client can with the same durability (confirms, acks) as the publisher, and
	// returns once every message is confirmed. It is the reference the relay's rate is
	// measured against, so it must be what an expert would write: pipelined, batched,
	// no outbox code in the loop beyond building the wire message.
	Raw(ctx context.Context, route string, msgs []*outbox.Message) error

	// Close releases what the target holds.
	Close()
}

// emptier is a Target whose destinations slow down as they fill: a queue that keeps every
// message until a consumer takes it, and confirms new ones later the more it holds. The
// bench has no consumer, so after each drain the run empties both destinations, as
// consumers would have, and the latency phase that follows measures the relays rather
// than a broker holding hundreds of thousands of messages no one reads
// (docs/benchmarks.md, "p99 right after a large drain").
type emptier interface {
	// Empty removes every message from the destination that route sends to.
	Empty(ctx context.Context, route string) error
}

// reader is a Target the bench can also read from, as a consumer would: the fleet run
// (Config.Outboxes) times messages from their COMMIT to their arrival there.
type reader interface {
	// PrepareTopics is Prepare with a destination per topic: route is a template that
	// sends each message to its topic's, and topicRoute returns the route of one topic's.
	PrepareTopics(ctx context.Context, name string) (route string, topicRoute func(topic string) string, drop func(), err error)

	// Read calls got with the payload of every message sent to route (one topic's) from
	// now until stop is called, as it arrives, from one goroutine, on a connection of
	// its own.
	Read(route string, got func(payload []byte)) (stop func(), err error)

	// Count returns how many messages the destination of route (one topic's) holds.
	Count(ctx context.Context, route string) (int64, error)
}

// TargetOpener opens the Target of a broker URL.
type TargetOpener func(ctx context.Context, brokerURL string) (Target, error)

var targets = map[*brokers.Broker]TargetOpener{}

// RegisterTarget makes open serve the URLs of broker b. Target files call it from init.
func RegisterTarget(b *brokers.Broker, open TargetOpener) { targets[b] = open }

// Schemes returns the broker URL schemes a run can use.
func Schemes() []string {
	var s []string
	for b := range targets {
		s = append(s, b.Schemes...)
	}
	sort.Strings(s)
	return s
}

func openTarget(ctx context.Context, brokerURL string) (Target, error) {
	b, err := brokers.ForURL(brokerURL)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	open, ok := targets[b]
	if !ok {
		return nil, fmt.Errorf("bench: no target for %s: want one of %s", b.Name, strings.Join(Schemes(), ", "))
	}
	return open(ctx, brokerURL)
}

// openPublisher opens a publisher to route on the target's broker, as a relay of the run
// uses it.
func openPublisher(ctx context.Context, t Target, route string) (outbox.Publisher, func(), error) {
	url, s := t.Broker()
	s.Route = route
	opened, err := brokers.Open(ctx, url, s)
	if err != nil {
		return nil, nil, err
	}
	return opened.Publisher, opened.Close, nil
}
