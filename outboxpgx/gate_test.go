package outboxpgx_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// wakeKey is the outbox's gate lock.
func (b *testBundle) wakeKey(t *testing.T) int64 {
	t.Helper()
	n, err := pgsql.NewNames(pgsql.Config{Schema: b.Schema})
	if err != nil {
		t.Fatal(err)
	}
	return n.WakeKey
}

// holdGate holds the outbox's gate on a session of its own until the test ends, as a
// waiting relay's listener would: every writer notifies meanwhile.
func (b *testBundle) holdGate(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	c, err := b.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn := c.Hijack()
	t.Cleanup(func() { conn.Close(ctx) })
	if _, err := conn.Exec(ctx, fmt.Sprintf("SELECT pg_advisory_lock(%d)", b.wakeKey(t))); err != nil {
		t.Fatal(err)
	}
}

// gateListener runs Listen with a gate, and returns its wake-ups and answers in the order
// Listen gave them, and the function that asks.
type gateEvent struct {
	wake   bool
	from   int64
	answer outboxdriver.GateState
}

func (b *testBundle) gateListener(t *testing.T, shared bool) (events chan gateEvent, ask func() outboxdriver.GateState) {
	t.Helper()
	var lis outboxdriver.Listener = b.Driver
	if shared {
		lis = watchListener(t, b.Pool, b.Driver)
	}
	events, ask, stop := listenGate(t, lis)
	t.Cleanup(stop)
	return events, ask
}

// watchListener is drv's Listen on the listening session of an idle watch of pool's,
// run until the test ends.
func watchListener(t *testing.T, pool *pgxpool.Pool, drv *outboxpgx.Driver) outboxdriver.Listener {
	t.Helper()
	w := outboxpgx.NewIdleWatch(pool, time.Hour)
	runWatch(t, w, func(err error) { t.Logf("idle watch: %v", err) })
	return listenFunc(func(ctx context.Context, wake func(outboxdriver.Wake, int64), gate outboxdriver.Gate) error {
		return w.Listen(ctx, drv, wake, gate)
	})
}

type listenFunc func(context.Context, func(outboxdriver.Wake, int64), outboxdriver.Gate) error

func (f listenFunc) Listen(ctx context.Context, wake func(outboxdriver.Wake, int64), gate outboxdriver.Gate) error {
	return f(ctx, wake, gate)
}

// sessions runs test twice: with the driver's Listen, and with the same outbox's Listen
// on an idle watch's shared session.
func sessions(t *testing.T, test func(t *testing.T, shared bool)) {
	for _, shared := range []bool{false, true} {
		name := "own session"
		if shared {
			name = "shared session"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, shared)
		})
	}
}

// listenGate is gateListener on lis, with the function that stops Listen and waits for
// it to return.
func listenGate(t *testing.T, lis outboxdriver.Listener) (events chan gateEvent, ask func() outboxdriver.GateState, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	events = make(chan gateEvent, 64)
	asks := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- lis.Listen(ctx, func(w outboxdriver.Wake, from int64) {
			if w == outboxdriver.WakeWritten {
				events <- gateEvent{wake: true, from: from}
			}
		}, outboxdriver.Gate{Asks: asks, Answer: func(a outboxdriver.GateState) { events <- gateEvent{answer: a} }})
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; ctx.Err() == nil {
				t.Errorf("Listen: %v", err)
			}
		})
	}
	if e := testenv.AwaitRecv(t, "Listen's first wake-up", events); !e.wake {
		stop()
		t.Fatalf("first event %+v, want a wake-up", e)
	}
	ask = func() outboxdriver.GateState {
		t.Helper()
		asks <- struct{}{}
		e := testenv.AwaitRecv(t, "the gate's answer", events)
		if e.wake {
			t.Fatalf("a wake-up (from %d) before the gate's answer", e.from)
		}
		return e.answer
	}
	return events, ask, stop
}

// leftListener returns a driver whose listener held the gate and was stopped while
// the network was silent, so that the server keeps its session, gate and all (its
// process ID is left). The driver's later connections go straight to the server.
func (b *testBundle) leftListener(t *testing.T) (drv *outboxpgx.Driver, left int32) {
	t.Helper()
	ctx := context.Background()
	proxy, _ := dbProxy(t)
	var direct atomic.Bool
	pool, drv, _ := taggedDriver(t, b, 2, func(cfg *pgxpool.Config) {
		var d net.Dialer
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if !direct.Load() {
				network, addr = "tcp", proxy.Addr()
			}
			return d.DialContext(ctx, network, addr)
		}
	})
	if _, err := drv.MigrateUp(ctx, 0); err != nil {
		t.Fatal(err)
	}
	_, ask, stop := listenGate(t, drv)
	if a := ask(); a != outboxdriver.GateArmed {
		stop()
		t.Fatalf("an idle outbox: answer %d, want GateArmed", a)
	}
	proxy.Partition(t) // the listener's close never arrives
	direct.Store(true)
	stop()
	pool.Reset() // the idle connections are silenced too
	if left = b.gateHolder(t); left == 0 {
		t.Fatal("no session holds the gate after the silent close: the test shows nothing")
	}
	return drv, left
}

// TestGateLeftSessionEnded: a listener that held the gate is stopped while the network
// is silent, so the server keeps its session, gate and all. The next Listen of the same
// driver is not told the gate is covered (that session will never take a notification,
// nor let go at one): it ends the session, answers busy meanwhile, then takes the gate,
// and writers' notifications reach it.
func TestGateLeftSessionEnded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	drv, left := b.leftListener(t)

	events, ask, stop := listenGate(t, drv)
	defer stop()
	answers := []outboxdriver.GateState{}
	testenv.Await(t, "an answer other than busy", func() (any, bool) {
		a := ask()
		answers = append(answers, a)
		return answers, a != outboxdriver.GateBusy
	})
	if a := answers[len(answers)-1]; a != outboxdriver.GateArmed {
		t.Fatalf("answers %v, want busy until the session left behind ends, then GateArmed", answers)
	}
	if pid := b.gateHolder(t); pid == left || pid == 0 {
		t.Fatalf("the gate is held by process %d; the session left behind was %d", pid, left)
	}
	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`1`)})
	if e := testenv.AwaitRecv(t, "the notification of a write", events); !e.wake {
		t.Fatalf("event %+v, want a wake-up", e)
	}
}

// TestGate: a writer notifies only while a relay's listener holds the gate; the
// listener lets go of it at the first notification; a writer between its insert and its
// commit keeps a relay from taking it (busy), and another session's hold covers.
func TestGate(t *testing.T) {
	t.Parallel()
	sessions(t, testGate)
}

func testGate(t *testing.T, shared bool) {
	b := setup(t)
	ctx := context.Background()
	events, ask := b.gateListener(t, shared)
	msg := func(key string) outbox.Message { return outbox.Message{Topic: "t", Key: key, Payload: []byte(`1`)} }
	maxSeq := func() int64 {
		var seq int64
		if err := b.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(max(seq), 0) FROM "%s".outbox`, b.Schema)).Scan(&seq); err != nil {
			t.Fatal(err)
		}
		return seq
	}

	b.Write(t, msg("open")) // no relay waits: no notification
	if a := ask(); a != outboxdriver.GateArmed {
		t.Fatalf("an idle outbox: answer %d, want GateArmed", a)
	}
	if a := ask(); a != outboxdriver.GateArmed {
		t.Fatalf("asked again while held: answer %d, want GateArmed", a)
	}
	b.Write(t, msg("armed"))
	// The first notification is the second write's: the first did not notify.
	if e := testenv.AwaitRecv(t, "the notification of a write while armed", events); !e.wake || e.from != maxSeq() {
		t.Fatalf("event %+v, want a wake-up from %d", e, maxSeq())
	}
	// Let go of at the notification: another session can take the gate.
	testenv.Await(t, "the listener to let go of the gate", func() (any, bool) {
		var took bool
		err := pgx.BeginFunc(ctx, b.Pool, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, fmt.Sprintf("SELECT pg_try_advisory_xact_lock(%d)", b.wakeKey(t))).Scan(&took)
		})
		return err, err == nil && took
	})

	// A writer between its insert and its commit: busy, and it did not notify.
	tx, err := b.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Writer.Write(ctx, tx, msg("in flight")); err != nil {
		t.Fatal(err)
	}
	if a := ask(); a != outboxdriver.GateBusy {
		t.Fatalf("a writer in flight: answer %d, want GateBusy", a)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if a := ask(); a != outboxdriver.GateArmed {
		t.Fatalf("the writer committed: answer %d, want GateArmed", a)
	}
	b.Write(t, msg("armed again"))
	if e := testenv.AwaitRecv(t, "the notification after the busy writer", events); !e.wake || e.from != maxSeq() {
		t.Fatalf("event %+v, want a wake-up from %d", e, maxSeq())
	}

	// Another session holds the gate: covered, and writers notify.
	b.holdGate(t)
	testenv.Await(t, "the answer covered", func() (any, bool) {
		a := ask() // armed while the listener has not yet let go
		return a, a == outboxdriver.GateCovered
	})
	b.Write(t, msg("covered"))
	if e := testenv.AwaitRecv(t, "the notification while covered", events); !e.wake || e.from != maxSeq() {
		t.Fatalf("event %+v, want a wake-up from %d", e, maxSeq())
	}
}

// TestGateBeforeVersion7: on an outbox whose schema predates the gate, writers notify
// on every commit and the listener answers GateAlways.
func TestGateBeforeVersion7(t *testing.T) {
	t.Parallel()
	sessions(t, func(t *testing.T, shared bool) {
		b := setup(t)
		if _, err := b.Driver.MigrateDown(context.Background(), pgsql.GateVersion-1); err != nil {
			t.Fatal(err)
		}
		testGateBeforeVersion7(t, b, shared)
	})
}

func testGateBeforeVersion7(t *testing.T, b *testBundle, shared bool) {
	events, ask := b.gateListener(t, shared)
	if a := ask(); a != outboxdriver.GateAlways {
		t.Fatalf("answer %d, want GateAlways", a)
	}
	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`1`)})
	if e := testenv.AwaitRecv(t, "the notification of a write", events); !e.wake || e.from == 0 {
		t.Fatalf("event %+v, want a wake-up from a seq", e)
	}
}
