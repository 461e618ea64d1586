// Package lanes runs a consumer's handler in per-key lanes: the messages of one key one
// at a time, in the order they were queued, and different keys at once up to a limit. The
// consumer runners of outboxnats, outboxamqp and outboxkafka all run on it, so that order,
// a handler's panic and the choice between retrying and dead-lettering mean the same on
// every broker. What a runner does with the outcome (ack, nak, reject, commit, produce a
// dead letter) stays with the runner: that is where the brokers differ.
//
// The key is the unit of order. A job queued without a key is a lane of its own: ordered
// with nothing, it waits for no other job but a free handler slot, and no job waits for
// it. The relay does not order messages without a key either, so holding them in a line
// would cost throughput for an order nobody was given.
package lanes

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/outboxkit/outbox"
)

// Config configures a Runner.
type Config struct {
	// Handler is called for each delivery a job hands to Turn.Handle. Required.
	Handler outbox.Handler
	// Context is the base of the handlers' contexts. Runners pass one that is never
	// cancelled, so that work in progress finishes during a shutdown. Defaults to
	// context.Background().
	Context context.Context
	// Limit caps the handler calls in progress over all lanes. A job holds a slot only
	// while the handler runs, not while it waits to retry, so a lane retrying in place
	// does not starve the others. Defaults to 0: no cap.
	Limit int
	// Backlog caps the jobs queued that have not yet started their handler: Go waits
	// while it is reached. It gives back pressure to a runner whose broker window is
	// large (a JetStream consumer's MaxAckPending), so that messages do not sit here
	// past their ack deadline. Defaults to 0: no cap, for runners whose broker bounds
	// what is outstanding (an AMQP prefetch) or that pause fetching themselves (Kafka).
	Backlog int
	// MaxAttempts is the attempt at which a failing delivery is given up on (dead-
	// lettered). Defaults to 0: never; every error but a permanent one is retried.
	MaxAttempts int
	// RetryDelay is the delay Outcome gives for an error that does not ask for one with
	// outbox.Retry. Defaults to 0.
	RetryDelay time.Duration
	// Quit, when closed, makes the runner start no more jobs (the queued ones are
	// dropped, unsettled) and ends the waits of jobs in progress: Turn.Handle and
	// Turn.Sleep return false. A runner passes its ctx.Done() when a message left
	// unsettled at shutdown comes back from the broker by itself. Defaults to nil: never.
	Quit <-chan struct{}
}

// Outcome is what a handler call means for its delivery, the one place where the retry
// or dead-letter decision is made.
type Outcome struct {
	// Err is the handler's error: nil when the delivery is done and is to be acked.
	Err error
	// Dead says to give the delivery up (dead-letter it): Err is permanent
	// (outbox.Permanent, or a panic), or the delivery was on its MaxAttempts-th attempt.
	Dead bool
	// Delay, for a delivery to retry, is how long it should wait first: the delay Err
	// asks for with outbox.Retry, else Config.RetryDelay.
	Delay time.Duration
}

// Runner queues jobs in per-key lanes and runs each lane's jobs one at a time, in order,
// on a goroutine that exists while the lane has work. Go, Len and Drop may be called
// concurrently; Go must not be called for a key while a Drop of that key runs, nor after
// Stop or Close.
type Runner struct {
	cfg     Config
	slots   chan struct{} // a token per handler call in progress; nil without Limit
	backlog chan struct{} // a token per job not yet handling; nil without Backlog
	wg      sync.WaitGroup

	mu    sync.Mutex
	keyed map[string]*lane   // the lanes of keys with work
	all   map[*lane]struct{} // every lane with work, keyless ones too
}

// lane is the queue of one key, or of one keyless job.
type lane struct {
	key   string
	queue []func(*Turn)
	stop  chan struct{} // closed by Drop or Stop: abandon the queue and any wait
	done  chan struct{} // closed when the lane's goroutine returns
}

// New returns a Runner with no lanes.
func New(cfg Config) *Runner {
	if cfg.Context == nil {
		cfg.Context = context.Background()
	}
	r := &Runner{cfg: cfg, keyed: map[string]*lane{}, all: map[*lane]struct{}{}}
	if cfg.Limit > 0 {
		r.slots = make(chan struct{}, cfg.Limit)
	}
	if cfg.Backlog > 0 {
		r.backlog = make(chan struct{}, cfg.Backlog)
	}
	return r
}

// Go queues job behind the jobs of key, or, when key is empty, as a lane of its own. It
// waits while the Backlog is full.
func (r *Runner) Go(key string, job func(*Turn)) {
	if r.backlog != nil {
		r.backlog <- struct{}{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.keyed[key]
	if key == "" || l == nil {
		l = &lane{key: key, stop: make(chan struct{}), done: make(chan struct{})}
		r.all[l] = struct{}{}
		if key != "" {
			r.keyed[key] = l
		}
		r.wg.Add(1)
		go r.run(l)
	}
	l.queue = append(l.queue, job)
}

// Len returns how many jobs of key are queued and not started.
func (r *Runner) Len(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if l := r.keyed[key]; l != nil {
		return len(l.queue)
	}
	return 0
}

// run runs l's jobs until its queue is empty, it is dropped or the runner quits.
func (r *Runner) run(l *lane) {
	defer r.wg.Done()
	defer close(l.done)
	for {
		r.mu.Lock()
		if len(l.queue) == 0 || closed(l.stop) || closed(r.cfg.Quit) {
			dropped := r.forget(l)
			r.mu.Unlock()
			r.unqueue(dropped)
			return
		}
		job := l.queue[0]
		l.queue[0] = nil
		l.queue = l.queue[1:]
		r.mu.Unlock()
		t := &Turn{r: r, l: l, queued: r.backlog != nil}
		job(t)
		t.started()
	}
}

// forget removes l from the runner and returns how many jobs it abandons. Call it with
// mu held.
func (r *Runner) forget(l *lane) int {
	if _, ok := r.all[l]; !ok {
		return 0
	}
	delete(r.all, l)
	if r.keyed[l.key] == l {
		delete(r.keyed, l.key)
	}
	n := len(l.queue)
	l.queue = nil
	return n
}

// unqueue gives back the Backlog tokens of n jobs that will never start.
func (r *Runner) unqueue(n int) {
	if r.backlog == nil {
		return
	}
	for range n {
		<-r.backlog
	}
}

// Drop abandons the queued jobs of keys, ends the waits of their jobs in progress, and
// returns when those have returned. A later Go for one of keys starts a new lane.
func (r *Runner) Drop(keys ...string) {
	r.mu.Lock()
	var ls []*lane
	for _, k := range keys {
		if l := r.keyed[k]; l != nil {
			ls = append(ls, l)
		}
	}
	r.stopLocked(ls)
}

// Stop abandons every queued job, ends the waits of the jobs in progress, and returns
// when those have returned.
func (r *Runner) Stop() {
	r.mu.Lock()
	ls := make([]*lane, 0, len(r.all))
	for l := range r.all {
		ls = append(ls, l)
	}
	r.stopLocked(ls)
	r.wg.Wait()
}

// stopLocked stops ls and waits for them; it is called with mu held and releases it.
func (r *Runner) stopLocked(ls []*lane) {
	dropped := 0
	for _, l := range ls {
		dropped += r.forget(l)
		close(l.stop)
	}
	r.mu.Unlock()
	r.unqueue(dropped)
	for _, l := range ls {
		<-l.done
	}
}

// Close returns once every queued job has run: a runner calls it to drain its lanes
// after it stops queueing.
func (r *Runner) Close() { r.wg.Wait() }

// Turn is a job's run in its lane: how the job calls the handler and waits. It belongs to
// the job's goroutine.
type Turn struct {
	r      *Runner
	l      *lane
	queued bool // holds a Backlog token
}

// Handle calls the handler for d, in a slot of the Limit, and says what its result means
// for d. A handler that panics returns a permanent error: the panic does not reach the
// process. Handle returns false, without calling the handler, when the lane was dropped
// or the runner quit before a slot was free: the job should leave d unsettled.
func (t *Turn) Handle(d *outbox.Delivery) (Outcome, bool) {
	if !t.acquire() {
		return Outcome{}, false
	}
	err := t.call(d)
	if t.r.slots != nil {
		<-t.r.slots
	}
	return t.r.Decide(err, d.Attempt), true
}

func (t *Turn) acquire() bool {
	if t.stopped() {
		return false
	}
	if t.r.slots != nil {
		select {
		case t.r.slots <- struct{}{}:
		case <-t.l.stop:
			return false
		case <-t.r.cfg.Quit:
			return false
		}
	}
	t.started()
	return true
}

// started gives back the job's Backlog token: it no longer waits in a queue.
func (t *Turn) started() {
	if t.queued {
		t.queued = false
		<-t.r.backlog
	}
}

func (t *Turn) stopped() bool { return closed(t.l.stop) || closed(t.r.cfg.Quit) }

// call runs the handler, turning a panic into a permanent error.
func (t *Turn) call(d *outbox.Delivery) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = outbox.Permanent(fmt.Errorf("handler panicked: %v", p))
		}
	}()
	return t.r.cfg.Handler(outbox.HandlerContext(t.r.cfg.Context, d), d)
}

// Sleep waits for d, holding no slot; false if the lane was dropped or the runner quit
// first.
func (t *Turn) Sleep(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-t.l.stop:
		return false
	case <-t.r.cfg.Quit:
		return false
	}
}

// Decide says what a handler's err on the given attempt means: done, retry after a
// delay, or give up.
func (r *Runner) Decide(err error, attempt int) Outcome {
	switch {
	case err == nil:
		return Outcome{}
	case outbox.IsPermanent(err) || (r.cfg.MaxAttempts > 0 && attempt >= r.cfg.MaxAttempts):
		return Outcome{Err: err, Dead: true}
	default:
		return Outcome{Err: err, Delay: outbox.RetryDelay(err, r.cfg.RetryDelay)}
	}
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
