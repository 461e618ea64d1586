package outboxsqlite

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// asked counts the callers that asked for q's lock; the hook runs under q.mu, so a
// caller counted here is queued (or holds the lock) by the time q.mu is free again.
func countAsks(q *writeQueue) func() int {
	n := 0
	q.asked = func(context.Context) { n++ }
	return func() int {
		q.mu.Lock()
		defer q.mu.Unlock()
		return n
	}
}

// TestWriteQueueOrder: callers are served in the order they asked, each handed the lock
// by the release before its turn, whatever order the goroutines run in.
func TestWriteQueueOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := &writeQueue{}
		if err := q.acquire(t.Context(), 0); err != nil {
			t.Fatal(err)
		}
		const n = 6
		granted := make(chan int, n)
		for i := range n {
			go func() {
				if err := q.acquire(t.Context(), time.Minute); err != nil {
					t.Errorf("caller %d: %v", i, err)
					return
				}
				granted <- i
			}()
			synctest.Wait() // caller i is queued before caller i+1 starts
		}
		if got := q.waiters(); got != n {
			t.Fatalf("%d waiters, want %d", got, n)
		}
		for want := range n {
			q.release()
			synctest.Wait()
			select {
			case got := <-granted:
				if got != want {
					t.Fatalf("lock handed to caller %d, want %d (first come, first served)", got, want)
				}
			default:
				t.Fatalf("release handed the lock to nobody; caller %d waits", want)
			}
			if len(granted) != 0 {
				t.Fatal("one release handed the lock to two callers")
			}
		}
		q.release()
		if q.held || q.waiters() != 0 {
			t.Fatalf("after the last release: held %v, %d waiters; want free", q.held, q.waiters())
		}
	})
}

// TestWriteQueueGiveUp: a caller whose context ends, or who waited too long, leaves the
// queue without the lock, and the lock goes to the next caller, never to a caller that
// is gone.
func TestWriteQueueGiveUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := &writeQueue{}
		if err := q.acquire(t.Context(), 0); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancelled, timedOut, last := make(chan error, 1), make(chan error, 1), make(chan error, 1)
		go func() { cancelled <- q.acquire(ctx, 0) }()
		synctest.Wait()
		go func() { timedOut <- q.acquire(t.Context(), BusyTimeout) }()
		synctest.Wait()
		go func() { last <- q.acquire(t.Context(), 0) }()
		synctest.Wait()

		cancel()
		if err := <-cancelled; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled caller: %v, want context.Canceled", err)
		}
		time.Sleep(BusyTimeout) // the fake clock of the bubble
		if err := <-timedOut; !errors.Is(err, ErrWriteQueueTimeout) {
			t.Fatalf("caller past BusyTimeout: %v, want ErrWriteQueueTimeout", err)
		}
		if got := q.waiters(); got != 1 {
			t.Fatalf("%d waiters after two gave up, want 1", got)
		}
		q.release()
		if err := <-last; err != nil {
			t.Fatalf("last caller: %v", err)
		}
		q.release()
		if q.held {
			t.Fatal("lock still held after its last holder released it")
		}
		if err := q.acquire(ctx, 0); !errors.Is(err, context.Canceled) {
			t.Fatalf("acquire with a done context: %v, want context.Canceled", err)
		}
	})
}

// TestWriteQueueGrantedWhileGivingUp: when the lock is handed to a caller in the same
// instant its context ends, the caller either takes it or passes it on: the lock is
// never left held by nobody. The waiter runs after both happened; which one woke it
// decides what it sees.
func TestWriteQueueGrantedWhileGivingUp(t *testing.T) {
	for _, c := range []struct {
		name         string
		cancelFirst  bool
		wantAcquired bool
	}{
		{"handed the lock, then cancelled", false, true},
		{"cancelled, then handed the lock", true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q := &writeQueue{}
				if err := q.acquire(t.Context(), 0); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(t.Context())
				done := make(chan error, 1)
				go func() { done <- q.acquire(ctx, 0) }()
				synctest.Wait()
				if c.cancelFirst {
					cancel()
					q.release()
				} else {
					q.release()
					cancel()
				}
				err := <-done
				switch {
				case err == nil && c.wantAcquired:
					if !q.held {
						t.Fatal("caller took the lock but the queue says it is free")
					}
					q.release()
				case errors.Is(err, context.Canceled) && !c.wantAcquired:
					if q.held {
						t.Fatal("caller gave up after the lock was handed to it, and left it held")
					}
				default:
					t.Fatalf("acquire: %v; want the lock: %v", err, c.wantAcquired)
				}
			})
		})
	}
}

// TestQueueForSameFile: pools on one file share a queue, found through another path to
// the file too, and the queue is forgotten when the last pool closes.
func TestQueueForSameFile(t *testing.T) {
	dir := t.TempDir()
	a, err := Open(dir + "/a.db")
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(dir + "/./a.db")
	if err != nil {
		t.Fatal(err)
	}
	other, err := Open(dir + "/b.db")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	qa, qb, qo := queueOf(t, a), queueOf(t, b), queueOf(t, other)
	if qa != qb || qa == qo {
		t.Fatalf("queues: a %p, a by another path %p, b %p; want one for a, another for b", qa, qb, qo)
	}
	a.Close()
	b.Close()
	c, err := Open(dir + "/a.db")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if queueOf(t, c) == qa {
		t.Fatal("the queue of a closed file was kept")
	}
}
