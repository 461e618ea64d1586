package bench

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strings"

	"github.com/outboxkit/outbox"
)

// Target is the broker side of a run. Every broker has one, in target_<broker>.go.
type Target interface {
	// Prepare creates an empty destination (stream, queue, topic) for one phase of the
	// run, named after name (lower-case letters, digits and '_'), and returns the route
	// that sends every message there (a template without placeholders) and a function
	// that deletes it.
	Prepare(ctx context.Context, name string) (route string, drop func(), err error)

	// Publisher returns a publisher sending by route, set up as `outbox relay` sets it
	// up, and the function that closes it. Each relay of a run gets its own.
	Publisher(ctx context.Context, route string) (pub outbox.Publisher, close func(), err error)

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

// TargetOpener opens the Target of a broker URL.
type TargetOpener func(ctx context.Context, brokerURL string) (Target, error)

var targets = map[string]TargetOpener{}

// RegisterTarget makes open serve broker URLs of the given schemes. Target files call it
// from init.
func RegisterTarget(schemes []string, open TargetOpener) {
	for _, s := range schemes {
		targets[s] = open
	}
}

// Schemes returns the broker URL schemes a run can use.
func Schemes() []string {
	s := make([]string, 0, len(targets))
	for k := range targets {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

func openTarget(ctx context.Context, brokerURL string) (Target, error) {
	first, _, _ := strings.Cut(brokerURL, ",")
	u, err := url.Parse(first)
	if err != nil || u.Scheme == "" {
		return nil, fmt.Errorf("bench: %q is not a broker URL", first)
	}
	open, ok := targets[u.Scheme]
	if !ok {
		return nil, fmt.Errorf("bench: no target for broker scheme %q: want one of %s", u.Scheme, strings.Join(Schemes(), ", "))
	}
	return open(ctx, brokerURL)
}
