package outbox

import (
	"context"
	"sync"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// The relay's background tasks, started by loop.run beside the loop. They share with it
// only the wake channels (wake, wakeLeases), the gate's asks (gateAsks) and what the
// listener heard (listenNews, behind its own lock). LISTEN wakes the loop for new
// messages and answers its asks for the wake gate; maintenance
// (retention of published history, partitions ahead) and recycling (the pending ring)
// are the store's own upkeep, which the store coordinates between relays (PostgreSQL: an
// advisory lock per task, so one relay does the work at a time).

func (l *loop) listen(ctx context.Context, lis outboxdriver.Listener) {
	signal := func(ch chan struct{}) {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	wake := func(w outboxdriver.Wake, from int64) {
		if w == outboxdriver.WakeLeases {
			signal(l.wakeLeases)
			return
		}
		l.news.written(from)
		signal(l.wake)
	}
	var gate outboxdriver.Gate
	if l.gate != nil {
		gate = outboxdriver.Gate{Asks: l.gateAsks, Answer: func(a outboxdriver.GateState) {
			l.news.answered(a)
			signal(l.wake)
		}}
	}
	listen := func() error {
		l.news.listening(true)
		defer func() { l.news.listening(false); signal(l.wake) }()
		return lis.Listen(ctx, wake, gate)
	}
	// A lost LISTEN connection is most often one the database closed (a restart, a
	// terminated backend): listen again at once, backing off to 2 s while it fails, and
	// poll meanwhile. A connection that listened for a while starts the backoff over.
	fails := 0
	for ctx.Err() == nil {
		began := time.Now()
		err := listen()
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > 10*time.Second {
			fails = 0
		}
		fails++
		d := backoff(min(fails, 8), 25*time.Millisecond, 2*time.Second)
		l.log.Warn("LISTEN connection lost; polling meanwhile", "err", err, "retry_in", d.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
	}
}

// maintain calls m (the store's upkeep, or a rowCleaner) at start and every
// CleanupInterval.
func (l *loop) maintain(ctx context.Context, m outboxdriver.Maintainer) {
	t := time.NewTicker(l.cfg.CleanupInterval)
	defer t.Stop()
	for {
		done, err := m.Maintain(ctx, outboxdriver.MaintainRequest{Retention: l.cfg.Retention, Limit: l.cfg.CleanupBatch})
		switch {
		case err != nil && ctx.Err() == nil:
			l.log.Error("maintenance failed", "err", err)
		case len(done.Created) > 0 || len(done.Dropped) > 0:
			l.log.Info("maintenance", "partitions_created", len(done.Created), "partitions_dropped", len(done.Dropped), "deleted", done.Deleted)
		case done.Deleted > 0:
			l.log.Debug("maintenance", "deleted", done.Deleted)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// recycleInterval is how often a relay calls Recycler.Recycle: the ring rotates at most
// this often, so it bounds, with the store's rows per bucket, the dead storage a fetch
// walks while a snapshot is held open. recycleDraining is the interval after a rotation
// and while a retired bucket holds a backlog: the bucket just retired, or drained, is
// emptied a tenth of a second later rather than a second (until then every full fetch
// walks its rows published since a snapshot was taken).
// recycleIdleMax is the longest interval: while the relay published nothing and held no
// message since the last call, each call waits twice as long as the one before, up to it
// (an idle outbox's ring has nothing to rotate or reclaim; another relay that publishes
// recycles it meanwhile). Activity brings the interval back to recycleInterval.
const (
	recycleInterval = time.Second
	recycleDraining = 100 * time.Millisecond
	recycleIdleMax  = 8 * time.Second
)

// recycleWait returns the wait before the next Recycle call after done, given whether the
// relay was idle (nothing published, nothing held) since the last call and the wait
// before it.
func recycleWait(done outboxdriver.Recycling, idle bool, last time.Duration) time.Duration {
	switch {
	case done.Draining || done.Rotated:
		return recycleDraining
	case idle:
		return min(max(2*last, recycleInterval), recycleIdleMax)
	}
	return recycleInterval
}

// recycle calls rc at start and then after recycleWait.
func (l *loop) recycle(ctx context.Context, rc outboxdriver.Recycler) {
	t := time.NewTimer(recycleInterval)
	defer t.Stop()
	next, lastPublished := recycleInterval, int64(-1)
	for {
		began := time.Now()
		done, err := rc.Recycle(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			l.log.Error("recycling the pending table failed", "err", err)
		case done.Rotated || done.Reclaimed > 0:
			l.log.Debug("recycled the pending table", "rotated", done.Rotated, "reclaimed", done.Reclaimed, "moved", done.Moved,
				"elapsed", time.Since(began))
		}
		published, held := l.r.stats.published.Load(), l.r.stats.held.Load()
		next = recycleWait(done, published == lastPublished && held == 0, next)
		lastPublished = published
		t.Reset(next)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// rowCleaner maintains a store that is not a Maintainer: it deletes expired published
// rows (and whatever the store expires with them) through DeletePublished, in batches of
// req.Limit with a short pause between them, until a batch comes back short.
type rowCleaner struct{ store outboxdriver.Store }

func (c rowCleaner) Maintain(ctx context.Context, req outboxdriver.MaintainRequest) (outboxdriver.Maintenance, error) {
	var m outboxdriver.Maintenance
	for {
		n, err := c.store.DeletePublished(ctx, req.Retention, req.Limit)
		m.Deleted += n
		if err != nil || n < req.Limit {
			return m, err
		}
		select { // leave the database room between batches
		case <-ctx.Done():
			return m, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// listenNews gathers, between the listener and the loop, what the listener said since
// the loop last looked: where the messages the notifications announced start (the lowest
// seq each transaction wrote), and the latest news of the gate, which the loop takes in
// the order the listener said it (an answer, then a notification: the gate is open).
type listenNews struct {
	mu      sync.Mutex
	froms   []int64
	unknown bool // one did not say, or more came than are kept: fetch in full
	gate    gateNews
	full    bool // the gate was armed or covered since: fetch in full
	started bool // the listener started since: its news is the gate's after that
}

// gateNews is the listener's latest news of the gate.
type gateNews struct {
	kind   gateNewsKind
	answer outboxdriver.GateState // kind newsAnswer
}

type gateNewsKind uint8

const (
	newsNone    gateNewsKind = iota
	newsWritten              // a notification of a write: the listener let go of the gate
	newsAnswer               // an answer to the relay's ask
	newsStarted              // the listener started (listenNews.started says so too)
	newsStopped              // the listener stopped
)

// maxGathered bounds the seqs kept between two looks of the loop.
const maxGathered = 256

func (w *listenNews) written(from int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gate = gateNews{kind: newsWritten}
	if from == 0 || len(w.froms) == maxGathered {
		w.unknown = true
		return
	}
	w.froms = append(w.froms, from)
}

func (w *listenNews) answered(a outboxdriver.GateState) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gate = gateNews{kind: newsAnswer, answer: a}
	w.full = w.full || a == outboxdriver.GateArmed || a == outboxdriver.GateCovered
}

func (w *listenNews) listening(on bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gate = gateNews{kind: newsStopped}
	if on {
		w.gate.kind, w.started = newsStarted, true
	}
}

// take returns what was gathered since the last take, and starts over.
func (w *listenNews) take() (froms []int64, unknown bool, started bool, gate gateNews, full bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	froms, unknown, started, gate, full = w.froms, w.unknown, w.started, w.gate, w.full
	w.froms, w.unknown, w.started, w.gate, w.full = nil, false, false, gateNews{}, false
	return froms, unknown, started, gate, full
}
