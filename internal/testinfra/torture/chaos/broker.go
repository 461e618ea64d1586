package chaos

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/torture"
	"github.com/outboxkit/outbox/internal/testinfra/torture/nemesis"
)

// A Broker is one broker kind's part of a run: a private server the run may restart, the
// address relays dial (through a proxy the run may cut), its own faults, and the
// complete read-back.
type Broker interface {
	// Start starts the server and creates the destinations the relays publish to, and
	// registers their teardown with tb.
	Start(tb testenv.TB)
	// RelayURL is the address relays dial.
	RelayURL() string
	// Route is the relays' route template.
	Route() string
	// Faults are the broker's own faults (restarts, cuts, ...), named by their kinds.
	Faults(tb testenv.TB) []nemesis.Fault
	// ReadBack reads every message the broker holds for the run into log, in broker
	// order per key. A read that cannot reach every stored message fails tb: such a run
	// is invalid, not passed.
	ReadBack(tb testenv.TB, log *torture.DeliveryLog)
}

// outboxRouter is a Broker that can give each outbox of a run a destination of its own,
// for runs of several outboxes (Config.Outboxes).
type outboxRouter interface {
	// OutboxRoute is the route of outbox name's relays.
	OutboxRoute(name string) string
	// OutboxOf names the outbox whose destination dest is ("" for none).
	OutboxOf(dest string) string
}

// Publisher is what a relay closes when it exits.
type Publisher interface {
	outbox.Publisher
	Close()
}

// brokerKind is a registered broker: how the run starts one, and how a relay process
// dials it.
type brokerKind struct {
	new  func() Broker
	dial func(ctx context.Context, url, route string) (Publisher, error)
	// maxAttempts is the relays' attempt limit in this broker's runs when Config has
	// none; 0 means the common default.
	maxAttempts int
}

var brokers = map[string]brokerKind{}

func register(name string, k brokerKind) { brokers[name] = k }

// Brokers lists the broker kinds a run can use.
func Brokers() []string {
	names := make([]string, 0, len(brokers))
	for n := range brokers {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func lookup(kind string) (brokerKind, error) {
	k, ok := brokers[kind]
	if !ok {
		return brokerKind{}, fmt.Errorf("chaos: unknown broker %q (known: %s)", kind, strings.Join(Brokers(), ", "))
	}
	return k, nil
}

// dial connects a relay process to the broker of its run.
func dial(ctx context.Context, kind, url, route string) (Publisher, error) {
	k, err := lookup(kind)
	if err != nil {
		return nil, err
	}
	return k.dial(ctx, url, route)
}

// Fault kinds every run can inject; brokers add their own (KindBrokerRestart, ...).
const (
	KindRelayKill     = "relay-kill"
	KindRelayStop     = "relay-stop"
	KindRelayRestart  = "relay-restart"
	KindPGTerminate   = "pg-terminate"
	KindBrokerRestart = "broker-restart"
	KindBrokerCut     = "broker-cut"
)

func kindsOf(faults []nemesis.Fault) []string {
	var ks []string
	for _, f := range faults {
		if !slices.Contains(ks, f.Kind) {
			ks = append(ks, f.Kind)
		}
	}
	return ks
}
