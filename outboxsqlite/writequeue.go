package outboxsqlite

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// ErrWriteQueueTimeout is returned by BeginTx on a pool from Open when the transaction
// waited BusyTimeout for its turn at the write lock. The transactions ahead of it held
// the lock that long: one left open (a missing Commit or Rollback), or more queued than
// the database commits in BusyTimeout. It is the in-process counterpart of SQLITE_BUSY,
// which a transaction still gets when another process holds the lock that long.
var ErrWriteQueueTimeout = errors.New("outboxsqlite: no turn at the write lock within BusyTimeout: the write transactions ahead held it that long (is one left open, without Commit or Rollback?)")

// writeQueue is a first-come, first-served lock in front of SQLite's write lock: every
// write transaction of the process on one database file takes it before BEGIN IMMEDIATE
// and gives it back after COMMIT or ROLLBACK, so whoever asked first begins first.
//
// SQLite's own wait (the busy handler) is not fair: a waiter sleeps 1, 2, 5, ... up to
// 100 ms between tries, and a writer that has just committed and begins again finds the
// lock free before any sleeper wakes. Eight such writers in a loop keep the lock among
// themselves; the relay's transactions wait until they pause. Here a waiter is served in
// arrival order and the lock is handed to it directly (no barging): a caller that asks
// while k others wait begins after at most k+1 transactions (the holder's and theirs).
//
// Invariants, under mu: if waiting is not empty, held is true; a turn is in waiting
// until it is granted (removed, granted set, ready closed) or abandoned (removed by its
// owner). The zero value is an unlocked queue. It does no I/O.
type writeQueue struct {
	mu      sync.Mutex
	held    bool
	waiting list.List // of *turn, oldest first

	// asked, when set (tests only), is called with mu held each time a caller asks for
	// the lock, with the caller's context: the instant from which FIFO order holds.
	asked func(ctx context.Context)
}

type turn struct {
	ready   chan struct{} // closed when the lock is handed to this turn
	granted bool
}

// acquire takes the lock, waiting behind those who asked before, until ctx is done or
// wait has passed (wait <= 0: no limit but ctx). It returns ctx's error or
// ErrWriteQueueTimeout without the lock. On nil the caller holds it and must release it.
func (q *writeQueue) acquire(ctx context.Context, wait time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	q.mu.Lock()
	if q.asked != nil {
		q.asked(ctx)
	}
	if !q.held {
		q.held = true
		q.mu.Unlock()
		return nil
	}
	t := &turn{ready: make(chan struct{})}
	e := q.waiting.PushBack(t)
	q.mu.Unlock()

	var timeout <-chan time.Time
	if wait > 0 {
		timer := time.NewTimer(wait)
		defer timer.Stop()
		timeout = timer.C
	}
	var err error
	select {
	case <-t.ready:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-timeout:
		err = fmt.Errorf("%w (waited %s)", ErrWriteQueueTimeout, wait)
	}
	q.mu.Lock()
	if t.granted {
		// Handed over while we gave up: pass it on rather than drop it.
		q.mu.Unlock()
		q.release()
		return err
	}
	q.waiting.Remove(e)
	q.mu.Unlock()
	return err
}

// release gives the lock to the oldest waiter, or frees it when nobody waits.
func (q *writeQueue) release() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.held {
		panic("outboxsqlite: write queue released while not held")
	}
	if e := q.waiting.Front(); e != nil {
		t := q.waiting.Remove(e).(*turn)
		t.granted = true
		close(t.ready) // held stays true: the lock passes to t
		return
	}
	q.held = false
}

// waiters returns how many callers wait for the lock (not counting its holder).
func (q *writeQueue) waiters() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.waiting.Len()
}

// fileQueues holds one writeQueue per database file that pools from Open have open in
// this process, so that every pool on a file (a relay given a pool of its own, a second
// Open of the same path) queues on the same lock. Files are told apart with
// os.SameFile: two paths that name one file (a symbolic link, a relative path) share a
// queue.
var fileQueues struct {
	mu    sync.Mutex
	files []*fileQueue
}

type fileQueue struct {
	info os.FileInfo
	q    *writeQueue
	refs int
}

// queueFor returns the queue of the database file at path, which must exist, and the
// function that drops this reference to it.
func queueFor(path string) (*writeQueue, func(), error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, nil, err
	}
	fileQueues.mu.Lock()
	defer fileQueues.mu.Unlock()
	var f *fileQueue
	for _, c := range fileQueues.files {
		if os.SameFile(c.info, info) {
			f = c
			break
		}
	}
	if f == nil {
		f = &fileQueue{info: info, q: &writeQueue{}}
		fileQueues.files = append(fileQueues.files, f)
	}
	f.refs++
	var once sync.Once
	return f.q, func() {
		once.Do(func() {
			fileQueues.mu.Lock()
			defer fileQueues.mu.Unlock()
			if f.refs--; f.refs == 0 {
				for i, c := range fileQueues.files {
					if c == f {
						fileQueues.files = append(fileQueues.files[:i], fileQueues.files[i+1:]...)
						break
					}
				}
			}
		})
	}, nil
}
