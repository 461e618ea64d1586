package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxtest"
)

func TestRoutingDestination(t *testing.T) {
	t.Parallel()
	routing := outbox.Routing{
		Rules: []outbox.Rule{
			{Topic: "orders.*", EventType: "refund?", Destination: "audit"},
			{Topic: "orders.*", Destination: "kafka"},
			{Headers: map[string]string{"tier": "gold*"}, Destination: "audit"},
			{AggregateType: "invoice", Destination: "mail"},
		},
		Default: "kafka",
	}
	if err := routing.Validate("kafka", "audit", "mail"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		m    outbox.Message
		want string
	}{
		{outbox.Message{Topic: "orders.placed", EventType: "refund1"}, "audit"},
		{outbox.Message{Topic: "orders.placed", EventType: "refunded"}, "kafka"},
		{outbox.Message{Topic: "orders.eu.placed"}, "kafka"}, // '*' crosses dots
		{outbox.Message{Topic: "users", Headers: map[string]string{"tier": "golden"}}, "audit"},
		{outbox.Message{Topic: "users", Headers: map[string]string{"Tier": "golden"}}, "kafka"},
		{outbox.Message{Topic: "users", AggregateType: "invoice"}, "mail"},
		{outbox.Message{Topic: "users"}, "kafka"},
	} {
		if got, ok := routing.Destination(&tc.m); !ok || got != tc.want {
			t.Errorf("%+v: routed to %q (%v), want %q", tc.m, got, ok, tc.want)
		}
	}
	routing.Default = ""
	if got, ok := routing.Destination(&outbox.Message{Topic: "users"}); ok {
		t.Errorf("no rule and no default: routed to %q", got)
	}
	check := routing.Check(map[string]func(*outbox.Message) error{"mail": func(m *outbox.Message) error {
		return &outbox.ValidationError{Field: "AggregateType", Reason: "mail refuses it"}
	}})
	var ve *outbox.ValidationError
	if err := check(&outbox.Message{Topic: "users"}); !errors.As(err, &ve) || ve.Field != "Topic" || !strings.Contains(ve.Reason, "no routing rule") {
		t.Errorf("unroutable at write time: %v", err)
	}
	if err := check(&outbox.Message{Topic: "x", AggregateType: "invoice"}); !errors.As(err, &ve) || ve.Field != "AggregateType" {
		t.Errorf("the destination's check: %v", err)
	}
	if err := check(&outbox.Message{Topic: "orders.x"}); err != nil {
		t.Errorf("a routed message refused: %v", err)
	}
}

func TestRoutingValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		r     outbox.Routing
		field string
	}{
		{outbox.Routing{Rules: []outbox.Rule{{Topic: "a"}}}, "Rules[0].Destination"},
		{outbox.Routing{Rules: []outbox.Rule{{Topic: "a", Destination: "nope"}}}, "Rules[0].Destination"},
		{outbox.Routing{Rules: []outbox.Rule{{Destination: "a"}, {Topic: "[", Destination: "a"}}}, "Rules[1].Topic"},
		{outbox.Routing{Rules: []outbox.Rule{{Headers: map[string]string{"x y": "1"}, Destination: "a"}}}, `Rules[0].Headers["x y"]`},
		{outbox.Routing{Rules: []outbox.Rule{{Headers: map[string]string{"x": "[z"}, Destination: "a"}}}, `Rules[0].Headers["x"]`},
		{outbox.Routing{Default: "b"}, "Default"},
	} {
		var ce *outbox.ConfigError
		if err := tc.r.Validate("a"); !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("%+v: %v, want a ConfigError on %s", tc.r, err, tc.field)
		}
	}
	if _, err := outbox.NewRouter(outbox.Routing{Default: "a"}, outbox.Destination{Name: "a", Publisher: &outboxtest.Publisher{}},
		outbox.Destination{Name: "a", Publisher: &outboxtest.Publisher{}}); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Errorf("a destination named twice: %v", err)
	}
}

// TestRouterPublish: a batch is split by destination; an outage of one destination is
// that destination's (a DestinationOutageError, no broker-wide outage), and for a while
// after it that destination's messages fail without being tried; an unroutable message
// is a permanent rejection.
func TestRouterPublish(t *testing.T) {
	t.Parallel()
	var down atomic.Bool
	down.Store(true)
	a := &outboxtest.Publisher{Fail: func(*outbox.Message) error {
		if down.Load() {
			return outbox.Outage(errors.New("connection refused"))
		}
		return nil
	}}
	b := &outboxtest.Publisher{}
	r, err := outbox.NewRouter(outbox.Routing{Rules: []outbox.Rule{{Topic: "a.*", Destination: "a"}, {Topic: "b.*", Destination: "b"}}},
		outbox.Destination{Name: "a", Publisher: a}, outbox.Destination{Name: "b", Publisher: b})
	if err != nil {
		t.Fatal(err)
	}
	batch := []*outbox.Message{{Topic: "a.x", Key: "1"}, {Topic: "b.x", Key: "2"}, {Topic: "c", Key: "3"}, {Topic: "a.y", Key: "4"}}
	errs := r.Publish(context.Background(), batch)
	if len(errs) != 4 || errs[1] != nil {
		t.Fatalf("errors %v; want b's message confirmed", errs)
	}
	for _, i := range []int{0, 3} {
		if dest, ok := outbox.AsDestinationOutage(errs[i]); !ok || dest != "a" || outbox.IsOutage(errs[i]) {
			t.Errorf("a's message %d: %v; want an outage of destination a alone", i, errs[i])
		}
	}
	if !outbox.IsPermanent(errs[2]) || !errors.Is(errs[2], outbox.ErrUnroutable) {
		t.Errorf("unroutable message: %v; want a permanent ErrUnroutable", errs[2])
	}
	tried := a.Attempts()
	errs = r.Publish(context.Background(), batch[:1])
	if _, ok := outbox.AsDestinationOutage(errs[0]); !ok || a.Attempts() != tried {
		t.Errorf("right after the outage: %v, %d attempts more; want it failed untried", errs[0], a.Attempts()-tried)
	}
	if got := b.Messages(); len(got) != 1 || got[0].Key != "2" {
		t.Errorf("b got %v", got)
	}
}

// TestMemRelayRouterDestinationDown: two destinations; one is down for a while. The
// other's messages are all published meanwhile, nothing of the down one is dead-lettered
// or counted as an attempt, and once it is back every message arrives, each key's in
// write order.
func TestMemRelayRouterDestinationDown(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupMem(t)
		b.topic = func(key string) string { return key[:1] + ".events" }
		var down atomic.Bool
		down.Store(true)
		pa := &outboxtest.Publisher{Fail: func(*outbox.Message) error {
			if down.Load() {
				return outbox.Outage(errors.New("test: connection refused"))
			}
			return nil
		}}
		pb := &outboxtest.Publisher{}
		router, err := outbox.NewRouter(outbox.Routing{Rules: []outbox.Rule{{Topic: "a.*", Destination: "a"}}, Default: "b"},
			outbox.Destination{Name: "a", Publisher: pa}, outbox.Destination{Name: "b", Publisher: pb})
		if err != nil {
			t.Fatal(err)
		}
		keys := append(memKeys("a", 5), memKeys("b", 5)...)
		b.writeRounds(t, 10, keys)
		r := b.relay(t, router, outbox.RelayConfig{ID: "r", MaxAttempts: 2, MaxInFlight: 10, PublishBatchSize: 5})
		testenv.Await(t, "b's 50 messages published while a is down", func() (any, bool) {
			n := len(pb.Messages())
			return fmt.Sprintf("%d of 50", n), n == 50
		})
		st := b.status(t)
		if st.Dead != 0 || st.Retrying != 0 || st.Pending != 50 {
			t.Errorf("while a is down: %+v; want a's 50 pending, no attempt counted, none dead", st)
		}
		if s := r.Stats(); s.Outages != 0 {
			t.Errorf("the relay paused %d times: one destination's outage must not pause the others", s.Outages)
		}
		// Each destination's state and counters, in the router and, from the relay's
		// next lease round, in the store's status.
		ds := router.Stats()
		if len(ds) != 2 || ds[0].Name != "a" || ds[0].Up || ds[0].Published != 0 || ds[0].Failed != 0 || ds[0].Deferred == 0 ||
			ds[1].Name != "b" || !ds[1].Up || ds[1].Published != 50 || ds[1].Deferred != 0 {
			t.Errorf("router stats while a is down: %+v", ds)
		}
		testenv.Await(t, "the status to show a down and b up", func() (any, bool) {
			rs := b.status(t).Relays
			if len(rs) != 1 {
				return rs, false
			}
			d := rs[0].Destinations
			return d, len(d) == 2 && d[0].Name == "a" && !d[0].Up && d[1].Name == "b" && d[1].Up
		})
		down.Store(false)
		testenv.Await(t, "a's messages published once it is back", func() (any, bool) {
			st := b.status(t)
			return fmt.Sprintf("%d pending", st.Pending), st.Pending == 0
		})
		if ds := router.Stats(); !ds[0].Up || ds[0].Published != 50 || !ds[0].Since.After(ds[1].Since) {
			t.Errorf("router stats once a is back: %+v; want a up since after b's start", ds)
		}
		got := append(pa.Messages(), pb.Messages()...)
		if dups := b.checkHistory(t, got); dups != 0 {
			t.Errorf("%d duplicates", dups)
		}
		for _, m := range pa.Messages() {
			if !strings.HasPrefix(m.Key, "a") {
				t.Errorf("%s reached destination a", m.Payload)
			}
		}
	})
}

// stuckPublisher holds every Publish until release is closed, then confirms.
type stuckPublisher struct {
	outboxtest.Publisher
	release chan struct{}
	calls   atomic.Int64
}

func (p *stuckPublisher) Publish(ctx context.Context, batch []*outbox.Message) []error {
	p.calls.Add(1)
	select {
	case <-p.release:
		return p.Publisher.Publish(ctx, batch)
	case <-ctx.Done():
		errs := make([]error, len(batch))
		for i := range errs {
			errs[i] = outbox.Outage(ctx.Err())
		}
		return errs
	}
}

// TestMemRelayRouterDestinationStuck: one destination takes its time (every publish
// hangs until the test lets it go, shorter than the publish timeout); the other's
// messages are all published meanwhile. A relay that sent both in one batch, or let
// the slow one take every publish worker, would hold them back.
func TestMemRelayRouterDestinationStuck(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupMem(t)
		b.topic = func(key string) string { return key[:1] + ".events" }
		slow := &stuckPublisher{release: make(chan struct{})}
		fast := &outboxtest.Publisher{}
		router, err := outbox.NewRouter(outbox.Routing{Rules: []outbox.Rule{{Topic: "a.*", Destination: "a"}}, Default: "b"},
			outbox.Destination{Name: "a", Publisher: slow}, outbox.Destination{Name: "b", Publisher: fast})
		if err != nil {
			t.Fatal(err)
		}
		keys := append(memKeys("a", 40), memKeys("b", 40)...)
		b.writeRounds(t, 5, keys)
		b.relay(t, router, outbox.RelayConfig{ID: "r", MaxInFlight: 40, PublishBatchSize: 5, PublishTimeout: time.Hour})
		testenv.Await(t, "b's 200 messages published while a is stuck", func() (any, bool) {
			n := len(fast.Messages())
			return fmt.Sprintf("%d of 200, %d calls to a", n, slow.calls.Load()), n == 200
		})
		close(slow.release)
		testenv.Await(t, "a's messages published once it goes on", func() (any, bool) {
			st := b.status(t)
			return fmt.Sprintf("%d pending", st.Pending), st.Pending == 0
		})
		got := append(slow.Messages(), fast.Messages()...)
		if dups := b.checkHistory(t, got); dups != 0 {
			t.Errorf("%d duplicates", dups)
		}
	})
}

// TestRoutingPriorities: a destination's default priority reaches the messages routed to
// it at write time, after the message's own priority and its topic's default; a value
// outside 0-MaxPriority fails the Write.
func TestRoutingPriorities(t *testing.T) {
	t.Parallel()
	routing := outbox.Routing{Rules: []outbox.Rule{{Topic: "pay.*", Destination: "payments"}}, Default: "events"}
	store := outboxtest.NewStore(outboxtest.StoreConfig{})
	w, err := outbox.NewWriter(store, outbox.WriterConfig{
		Priorities: map[string]int{"pay.audit": 2},
		Priority:   routing.Priorities(map[string]int{"payments": 7}),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testenv.Context(t)
	tx := store.Begin()
	err = w.Write(ctx, tx,
		outbox.Message{Topic: "pay.card"},              // the destination's: 7
		outbox.Message{Topic: "pay.card", Priority: 3}, // its own
		outbox.Message{Topic: "pay.audit"},             // its topic's: 2
		outbox.Message{Topic: "clicks"})                // none
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	st, err := store.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range st.Priorities {
		got = append(got, fmt.Sprintf("%d:%d", p.Priority, p.Pending))
	}
	if want := "[7:1 3:1 2:1 0:1]"; fmt.Sprint(got) != want {
		t.Errorf("pending per priority %v, want %s", got, want)
	}

	bad, err := outbox.NewWriter(store, outbox.WriterConfig{Priority: func(*outbox.Message) int { return outbox.MaxPriority + 1 }})
	if err != nil {
		t.Fatal(err)
	}
	var ve *outbox.ValidationError
	if err := bad.Write(ctx, store.Begin(), outbox.Message{Topic: "t"}); !errors.As(err, &ve) || ve.Field != "Priority" {
		t.Errorf("a default priority above MaxPriority: %v, want a *ValidationError on Priority", err)
	}
}
