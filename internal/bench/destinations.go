package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxkit/outbox"
)

// DestinationsPhase is what the destinations phase measured (Config.Broker2URL): the
// same backlog drained to each destination alone, and to both through an outbox.Router
// (the events of topic "audit", half of them, to the second), in the same run.
type DestinationsPhase struct {
	EPS1, EPS2 float64 // each destination alone
	EPS        float64 // both
}

// X is the rate to both destinations over the slower destination's alone.
func (d DestinationsPhase) X() float64 { return div(d.EPS, min(d.EPS1, d.EPS2)) }

func (m *measurer) destinationsPhase(ctx context.Context) (*DestinationsPhase, error) {
	cfg, say := m.cfg, m.say
	target2, err := openTarget(ctx, cfg.Broker2URL)
	if err != nil {
		return nil, err
	}
	defer target2.Close()
	dest1, drop1, err := m.target.Prepare(ctx, "bench_d1_"+m.tag)
	if err != nil {
		return nil, err
	}
	defer drop1()
	dest2, drop2, err := target2.Prepare(ctx, "bench_d2_"+m.tag)
	if err != nil {
		return nil, err
	}
	defer drop2()
	halves := func(i int, m *outbox.Message) { m.Topic = []string{"orders", "audit"}[i%2] }

	run := 0
	drain := func(label string, open func() (outbox.Publisher, func(), error)) (float64, error) {
		run++
		say("destinations: %s: writing a backlog of %d events", label, cfg.Events)
		if err := writeBacklog(ctx, m.db, cfg, m.payload, halves, say); err != nil {
			return 0, err
		}
		if err := m.db.settle(ctx); err != nil {
			return 0, err
		}
		rs, err := startRelaysWith(ctx, cfg, m.db, fmt.Sprintf("%s-d%d", m.tag, run), m.confirmed, open)
		if err != nil {
			return 0, err
		}
		defer rs.stop(ctx)
		d, err := rs.waitPublished(ctx, int64(cfg.Events), func(n int64, elapsed time.Duration) {
			say("destinations: %s: %d/%d (%.0f/s)", label, n, cfg.Events, float64(n)/elapsed.Seconds())
		})
		if err != nil {
			return 0, err
		}
		eps := float64(cfg.Events) / d.Seconds()
		say("destinations: %s: %.0f events/s", label, eps)
		for _, td := range []struct {
			t     Target
			route string
		}{{m.target, dest1}, {target2, dest2}} {
			if e, ok := td.t.(emptier); ok {
				if err := e.Empty(ctx, td.route); err != nil {
					return 0, err
				}
			}
		}
		return eps, nil
	}
	var dp DestinationsPhase
	if dp.EPS1, err = drain("the first destination alone", func() (outbox.Publisher, func(), error) { return openPublisher(ctx, m.target, dest1) }); err != nil {
		return nil, err
	}
	if dp.EPS2, err = drain("the second destination alone", func() (outbox.Publisher, func(), error) { return openPublisher(ctx, target2, dest2) }); err != nil {
		return nil, err
	}
	both := func() (outbox.Publisher, func(), error) {
		p1, close1, err := openPublisher(ctx, m.target, dest1)
		if err != nil {
			return nil, nil, err
		}
		p2, close2, err := openPublisher(ctx, target2, dest2)
		if err != nil {
			close1()
			return nil, nil, err
		}
		router, err := outbox.NewRouter(outbox.Routing{Rules: []outbox.Rule{{Topic: "audit", Destination: "second"}}, Default: "first"},
			outbox.Destination{Name: "first", Publisher: p1}, outbox.Destination{Name: "second", Publisher: p2})
		if err != nil {
			close1()
			close2()
			return nil, nil, err
		}
		return router, func() { close1(); close2() }, nil
	}
	if dp.EPS, err = drain("both destinations, half the events each", both); err != nil {
		return nil, err
	}
	say("destinations: both %.0f/s against %.0f/s and %.0f/s alone (%.2f of the slower)", dp.EPS, dp.EPS1, dp.EPS2, dp.X())
	return &dp, nil
}
