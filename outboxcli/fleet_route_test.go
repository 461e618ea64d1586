package outboxcli

import (
	"context"
	"log/slog"
	"testing"
	"time"

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
	r := newFleetRoute(ctx, "r", &brokers.Opened{Publisher: shared, Close: func() {}},
		func(context.Context) (*brokers.Opened, error) { panic("not used") }, slog.Default())
	a, releaseA := r.publisher()
	b, releaseB := r.publisher()
	defer releaseB()
	var _ outbox.Reconnector = a
	shared.back <- struct{}{}
	for _, p := range []*lanePublisher{a, b} {
		testenv.AwaitRecv(t, "the reconnection signal", p.Reconnected())
	}
	releaseA()
	shared.back <- struct{}{}
	testenv.AwaitRecv(t, "the reconnection signal", b.Reconnected())
	select {
	case <-a.Reconnected():
		t.Fatal("a released publisher still gets reconnection signals")
	case <-time.After(50 * time.Millisecond):
	}
}

// lane is a publisher that records which lane took each publish in calls, and holds a
// batch of more than one message until hold is closed.
type lane struct {
	name  string
	calls chan string
	hold  chan struct{}
}

func (l *lane) Publish(_ context.Context, batch []*outbox.Message) []error {
	l.calls <- l.name
	if len(batch) > 1 {
		<-l.hold
	}
	return nil
}

// TestFleetRouteLanes: an outbox's publishes use the shared lane up to bulkInFlight
// messages in flight; past that, the bulk lane once it has opened (in the background:
// the publish that asks for it goes on the shared lane meanwhile). A bulk lane that
// failed to open leaves every publish on the shared lane, and is not tried again at
// once.
func TestFleetRouteLanes(t *testing.T) {
	for _, fail := range []bool{false, true} {
		calls, hold := make(chan string, 10), make(chan struct{})
		opens := make(chan struct{}, 10)
		r := newFleetRoute(t.Context(), "r", &brokers.Opened{Publisher: &lane{"shared", calls, hold}, Close: func() {}},
			func(context.Context) (*brokers.Opened, error) {
				defer func() { opens <- struct{}{} }()
				if fail {
					return nil, context.DeadlineExceeded
				}
				return &brokers.Opened{Publisher: &lane{"bulk", calls, hold}, Close: func() {}}, nil
			}, slog.Default())
		p, release := r.publisher()
		publish := func(n int, want string) {
			t.Helper()
			p.Publish(t.Context(), make([]*outbox.Message, n))
			if got := <-calls; got != want {
				t.Fatalf("fail=%v: a publish of %d with %d in flight took the %s lane, want %s", fail, n, p.inFlight.Load(), got, want)
			}
		}
		publish(1, "shared")
		done := make(chan struct{})
		go func() { defer close(done); p.Publish(t.Context(), make([]*outbox.Message, bulkInFlight)) }()
		if got := <-calls; got != "shared" {
			t.Fatalf("a publish of bulkInFlight took the %s lane", got)
		}
		publish(1, "shared") // past bulkInFlight: asks for the bulk lane, not open yet
		testenv.AwaitRecv(t, "the bulk lane's opening to end", opens)
		if fail {
			publish(1, "shared")
		} else {
			testenv.Await(t, "the bulk lane to be used", func() (any, bool) { return nil, r.bulkLane() != nil })
			publish(1, "bulk")
		}
		close(hold)
		<-done
		publish(1, "shared")
		release()
		if len(opens) > 0 {
			t.Fatalf("fail=%v: the bulk lane was opened again", fail)
		}
	}
}
