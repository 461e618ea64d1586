package lanes_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/lanes"
)

// Every test runs in a synctest bubble: handlers "work" with time.Sleep on the bubble's
// clock, and synctest.Wait says when every goroutine is blocked, so what the tests see
// does not depend on how fast the machine is.

// handleJob is a job that hands d to the handler and reports the outcome.
func handleJob(d *outbox.Delivery, out func(lanes.Outcome, bool)) func(*lanes.Turn) {
	return func(t *lanes.Turn) {
		o, ok := t.Handle(d)
		if out != nil {
			out(o, ok)
		}
	}
}

// TestKeyOrder queues interleaved jobs of several keys, whose handlers take different
// times: each key's jobs run one at a time, in the order queued.
func TestKeyOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		seen := map[string][]int{}
		running := map[string]int{}
		h := func(_ context.Context, d *outbox.Delivery) error {
			mu.Lock()
			running[d.Key]++
			if running[d.Key] > 1 {
				t.Errorf("key %s: two jobs at once", d.Key)
			}
			n, _ := d.Version()
			seen[d.Key] = append(seen[d.Key], int(n))
			mu.Unlock()
			// Later jobs of a key finish faster: a lane that let them overtake would
			// record them first.
			time.Sleep(time.Duration(100-n) * time.Millisecond)
			mu.Lock()
			running[d.Key]--
			mu.Unlock()
			return nil
		}
		r := lanes.New(lanes.Config{Handler: h, Limit: 3})
		keys := []string{"a", "b", "c", "d", "e"}
		for i := range 50 {
			key := keys[i%len(keys)]
			d := &outbox.Delivery{Key: key, Attempt: 1, Headers: map[string]string{outbox.HeaderAggregateVersion: fmt.Sprint(i)}}
			r.Go(key, handleJob(d, nil))
		}
		r.Close()
		for k, got := range seen {
			for i := 1; i < len(got); i++ {
				if got[i] < got[i-1] {
					t.Fatalf("key %s handled out of order: %v", k, got)
				}
			}
			if len(got) != 10 {
				t.Errorf("key %s: %d jobs handled, want 10", k, len(got))
			}
		}
	})
}

// blocker is a handler whose calls wait until released, counting those in progress.
type blocker struct {
	running atomic.Int32
	most    atomic.Int32
	release chan struct{}
}

func newBlocker() *blocker { return &blocker{release: make(chan struct{})} }

func (b *blocker) handle(context.Context, *outbox.Delivery) error {
	n := b.running.Add(1)
	for {
		m := b.most.Load()
		if n <= m || b.most.CompareAndSwap(m, n) {
			break
		}
	}
	<-b.release
	b.running.Add(-1)
	return nil
}

// TestLimit runs different keys at once, never more than Limit.
func TestLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBlocker()
		r := lanes.New(lanes.Config{Handler: b.handle, Limit: 3})
		for i := range 10 {
			key := fmt.Sprint("k", i)
			r.Go(key, handleJob(&outbox.Delivery{Key: key}, nil))
		}
		synctest.Wait()
		if n := b.running.Load(); n != 3 {
			t.Errorf("%d handlers running, want the limit, 3", n)
		}
		close(b.release)
		r.Close()
		if n := b.most.Load(); n != 3 {
			t.Errorf("at most %d handlers ran at once, want 3", n)
		}
	})
}

// TestKeyless gives each job without a key a lane of its own: it waits neither for a
// busy key nor for another keyless job.
func TestKeyless(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBlocker()
		r := lanes.New(lanes.Config{Handler: b.handle})
		r.Go("a", handleJob(&outbox.Delivery{Key: "a"}, nil))
		r.Go("a", handleJob(&outbox.Delivery{Key: "a"}, nil))
		for range 3 {
			r.Go("", handleJob(&outbox.Delivery{}, nil))
		}
		synctest.Wait()
		if n := b.running.Load(); n != 4 {
			t.Errorf("%d handlers running, want 4: one of key a and the three keyless", n)
		}
		close(b.release)
		r.Close()
	})
}

// TestPanic turns a handler's panic into a permanent error: the delivery is given up on
// and the runner goes on.
func TestPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		h := func(_ context.Context, d *outbox.Delivery) error {
			calls++
			if calls == 1 {
				panic("boom")
			}
			return nil
		}
		r := lanes.New(lanes.Config{Handler: h, MaxAttempts: 5})
		var got []lanes.Outcome
		for range 2 {
			r.Go("k", handleJob(&outbox.Delivery{Key: "k", Attempt: 1}, func(o lanes.Outcome, _ bool) { got = append(got, o) }))
		}
		r.Close()
		if len(got) != 2 {
			t.Fatalf("%d outcomes, want 2", len(got))
		}
		if o := got[0]; !o.Dead || !outbox.IsPermanent(o.Err) || !strings.Contains(o.Err.Error(), "handler panicked: boom") {
			t.Errorf("panic gave %+v, want a dead outcome with a permanent 'handler panicked: boom'", o)
		}
		if o := got[1]; o.Err != nil || o.Dead {
			t.Errorf("the call after the panic gave %+v, want done", o)
		}
	})
}

func TestDecide(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	r := lanes.New(lanes.Config{MaxAttempts: 3, RetryDelay: time.Second})
	unlimited := lanes.New(lanes.Config{RetryDelay: time.Second})
	for _, c := range []struct {
		name    string
		r       *lanes.Runner
		err     error
		attempt int
		want    lanes.Outcome
	}{
		{"done", r, nil, 1, lanes.Outcome{}},
		{"retry", r, boom, 1, lanes.Outcome{Err: boom, Delay: time.Second}},
		{"retry with the asked delay", r, outbox.Retry(boom, time.Minute), 2, lanes.Outcome{Err: outbox.Retry(boom, time.Minute), Delay: time.Minute}},
		{"last attempt", r, boom, 3, lanes.Outcome{Err: boom, Dead: true}},
		{"past the last attempt", r, boom, 7, lanes.Outcome{Err: boom, Dead: true}},
		{"permanent", r, outbox.Permanent(boom), 1, lanes.Outcome{Err: outbox.Permanent(boom), Dead: true}},
		{"no limit", unlimited, boom, 1000, lanes.Outcome{Err: boom, Delay: time.Second}},
		{"no limit, permanent", unlimited, outbox.Permanent(boom), 1, lanes.Outcome{Err: outbox.Permanent(boom), Dead: true}},
	} {
		got := c.r.Decide(c.err, c.attempt)
		if fmt.Sprint(got.Err) != fmt.Sprint(c.want.Err) || got.Dead != c.want.Dead || got.Delay != c.want.Delay {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
}

// TestBacklog makes Go wait while Backlog jobs are queued and not handling yet.
func TestBacklog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBlocker()
		r := lanes.New(lanes.Config{Handler: b.handle, Limit: 1, Backlog: 2})
		var queued atomic.Int32
		go func() {
			for i := range 6 {
				r.Go(fmt.Sprint("k", i), handleJob(&outbox.Delivery{}, nil))
				queued.Add(1)
			}
		}()
		synctest.Wait()
		// One job handles (its token back), two wait for the slot, the fourth Go waits.
		if n := queued.Load(); n != 3 {
			t.Errorf("Go returned %d times, want 3: one job handling and a backlog of 2", n)
		}
		close(b.release)
		synctest.Wait()
		r.Close()
		if n := queued.Load(); n != 6 {
			t.Errorf("Go returned %d times, want 6", n)
		}
	})
}

// TestSlotNotHeldWhileSleeping lets other keys use the only slot while a lane waits to
// retry in place.
func TestSlotNotHeldWhileSleeping(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var handled keyLog
		got := handled.String
		r := lanes.New(lanes.Config{Handler: handled.handle, Limit: 1})
		r.Go("slow", func(t *lanes.Turn) {
			t.Handle(&outbox.Delivery{Key: "slow"})
			t.Sleep(time.Hour)
			t.Handle(&outbox.Delivery{Key: "slow"})
		})
		synctest.Wait()
		r.Go("quick", handleJob(&outbox.Delivery{Key: "quick"}, nil))
		synctest.Wait()
		if want := "[slow quick]"; got() != want {
			t.Errorf("handled %v before the retry, want %s", got(), want)
		}
		r.Close()
		if want := "[slow quick slow]"; got() != want {
			t.Errorf("handled %v, want %s", got(), want)
		}
	})
}

// TestDrop abandons a key's queue and ends its job's wait, leaving other keys alone; a
// later job of the key runs in a new lane.
func TestDrop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var handled keyLog
		r := lanes.New(lanes.Config{Handler: handled.handle, Backlog: 10})
		slept := make(chan bool, 1)
		r.Go("p0", func(t *lanes.Turn) { slept <- t.Sleep(time.Hour) })
		r.Go("p0", handleJob(&outbox.Delivery{Key: "p0"}, nil))
		r.Go("p1", func(t *lanes.Turn) { t.Sleep(time.Minute); t.Handle(&outbox.Delivery{Key: "p1"}) })
		synctest.Wait()
		if n := r.Len("p0"); n != 1 {
			t.Errorf("Len(p0) = %d, want 1", n)
		}
		r.Drop("p0")
		if <-slept {
			t.Error("the dropped lane's Sleep ran to its end")
		}
		if n := r.Len("p0"); n != 0 {
			t.Errorf("Len(p0) = %d after Drop, want 0", n)
		}
		r.Go("p0", handleJob(&outbox.Delivery{Key: "p0"}, nil))
		r.Close()
		if got := handled.String(); got != "[p0 p1]" {
			t.Errorf("handled %s, want [p0 p1]: the dropped job never, the new one and the other key's", got)
		}
	})
}

// TestStopAndQuit: Stop abandons every queue and wait; after Quit, no job starts and a
// job waiting for a slot gives up its delivery unhandled.
func TestStopAndQuit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBlocker()
		quit := make(chan struct{})
		r := lanes.New(lanes.Config{Handler: b.handle, Limit: 1, Quit: quit})
		var outcomes sync.Map
		for i := range 3 {
			key := fmt.Sprint("k", i)
			r.Go(key, handleJob(&outbox.Delivery{Key: key}, func(_ lanes.Outcome, ok bool) { outcomes.Store(key, ok) }))
		}
		r.Go("k0", handleJob(&outbox.Delivery{Key: "k0"}, func(lanes.Outcome, bool) { t.Error("a job queued behind k0 started after Quit") }))
		synctest.Wait()
		close(quit)
		synctest.Wait()
		close(b.release) // the handler in progress finishes
		r.Stop()
		handled := 0
		outcomes.Range(func(_, ok any) bool {
			if ok.(bool) {
				handled++
			}
			return true
		})
		if handled != 1 {
			t.Errorf("%d deliveries handled, want 1: the one in progress at Quit", handled)
		}
	})
}

// keyLog is a handler that records the keys it handled, in order.
type keyLog struct {
	mu   sync.Mutex
	keys []string
}

func (k *keyLog) handle(_ context.Context, d *outbox.Delivery) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.keys = append(k.keys, d.Key)
	return nil
}

func (k *keyLog) String() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return fmt.Sprint(k.keys)
}
