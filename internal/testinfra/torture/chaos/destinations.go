package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/torture"
	"github.com/outboxkit/outbox/internal/testinfra/torture/nemesis"
	"github.com/outboxkit/outbox/outboxamqp"
	"github.com/outboxkit/outbox/outboxnats"
)

// destsAuditType is the aggregate type of the odd keys in a run of broker
// "destinations": a routing rule sends their events to RabbitMQ, the others' to NATS.
const destsAuditType = "torture.audit"

func init() {
	register("destinations", brokerKind{
		new:         func() Broker { return &destinationsBroker{} },
		dial:        dialDestinations,
		maxAttempts: RabbitMaxAttempts, // RabbitMQ's unbind burns attempts
	})
}

// keyRouter is a Broker whose relays send each key's events to one of several
// destinations by routing rules on the aggregate type: the workload stamps each key's,
// and the checker checks that every copy is where its key's rule sends it.
type keyRouter interface {
	// AggregateType is the aggregate type of key's events.
	AggregateType(key string) string
	// Misrouted says why copy d is not where its key's events go ("" when it is).
	Misrouted(d torture.Delivery) string
	// Destinations is how many destinations the relays route to.
	Destinations() int
}

// destinationsBroker is two brokers behind one relay: the relays publish through an
// outbox.Router to a private NATS JetStream server (the even keys) and a private
// RabbitMQ node (the odd keys, by a rule on their aggregate type). Each keeps its own
// faults (their targets say which), so one is down while the other serves.
type destinationsBroker struct {
	nats   natsBroker
	rabbit rabbitBroker
}

var _ keyRouter = (*destinationsBroker)(nil)

func (b *destinationsBroker) Start(tb testenv.TB) {
	b.nats.Start(tb)
	b.rabbit.Start(tb)
}

// RelayURL and Route carry both destinations', NATS's first, separated by a space.
func (b *destinationsBroker) RelayURL() string { return b.nats.RelayURL() + " " + b.rabbit.RelayURL() }
func (b *destinationsBroker) Route() string    { return b.nats.Route() + " " + b.rabbit.Route() }

func (b *destinationsBroker) Faults(tb testenv.TB) []nemesis.Fault {
	return append(labelFaults("nats", b.nats.Faults(tb)), labelFaults("rabbitmq", b.rabbit.Faults(tb))...)
}

// labelFaults prefixes the targets of faults with the destination they hit.
func labelFaults(dest string, faults []nemesis.Fault) []nemesis.Fault {
	out := make([]nemesis.Fault, len(faults))
	for i, f := range faults {
		inject := f.Inject
		f.Inject = func(r *rand.Rand) (string, func() error, error) {
			target, heal, err := inject(r)
			return dest + ": " + target, heal, err
		}
		out[i] = f
	}
	return out
}

// ReadBack reads both: NATS's copies carry their subject as Dest, RabbitMQ's
// "rabbitmq".
func (b *destinationsBroker) ReadBack(tb testenv.TB, log *torture.DeliveryLog) {
	b.nats.ReadBack(tb, log)
	var rabbit torture.DeliveryLog
	b.rabbit.ReadBack(tb, &rabbit)
	for _, d := range rabbit.Copies() {
		d.Dest = "rabbitmq"
		log.Add(d)
	}
}

func (b *destinationsBroker) Destinations() int { return 2 }

func (b *destinationsBroker) AggregateType(key string) string {
	var i int
	if _, err := fmt.Sscanf(key, "agg-%d", &i); err == nil && i%2 == 1 {
		return destsAuditType
	}
	return "torture"
}

func (b *destinationsBroker) Misrouted(d torture.Delivery) string {
	want := "nats"
	if b.AggregateType(d.Key) == destsAuditType {
		want = "rabbitmq"
	}
	got := "nats"
	if d.Dest == "rabbitmq" {
		got = "rabbitmq"
	}
	if got != want {
		return fmt.Sprintf("misrouted: event %s of key %s, routed to %s, read back from %s (%s)", d.ID, d.Key, want, got, d.Dest)
	}
	return ""
}

// dialDestinations connects a relay to both destinations and routes by aggregate type.
func dialDestinations(ctx context.Context, url, route string) (Publisher, error) {
	urls, routes := strings.Fields(url), strings.Fields(route)
	if len(urls) != 2 || len(routes) != 2 {
		return nil, fmt.Errorf("chaos: destinations: want two URLs and two routes, got %q and %q", url, route)
	}
	np, err := outboxnats.Dial(ctx, urls[0], outboxnats.Config{Route: routes[0]})
	if err != nil {
		return nil, err
	}
	rp, err := outboxamqp.Dial(ctx, urls[1], outboxamqp.Config{Exchange: rabbitExchange, Route: routes[1]})
	if err != nil {
		np.Close()
		return nil, err
	}
	router, err := outbox.NewRouter(outbox.Routing{Rules: []outbox.Rule{{AggregateType: destsAuditType, Destination: "rabbitmq"}}, Default: "nats"},
		outbox.Destination{Name: "nats", Publisher: np}, outbox.Destination{Name: "rabbitmq", Publisher: rp})
	if err != nil {
		np.Close()
		rp.Close()
		return nil, err
	}
	return routedPublisher{router, func() { np.Close(); rp.Close() }}, nil
}

type routedPublisher struct {
	*outbox.Router
	close func()
}

func (p routedPublisher) Close() { p.close() }

// checkRouted counts into rep the copies of all that are not where their key's rule
// sends them.
func checkRouted(all *torture.DeliveryLog, r keyRouter, rep *torture.Report) {
	rep.Destinations = r.Destinations()
	for _, d := range all.Copies() {
		if why := r.Misrouted(d); why != "" {
			rep.Misrouted++
			rep.Example("%s", why)
		}
	}
}
