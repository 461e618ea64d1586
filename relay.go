package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox/internal/broken"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Relay publishes committed messages from a Store to a Publisher. Several relays may run
// against one store: the store's rows are divided into shards by key, each relay leases a
// fair share of the shards in database time, and a relay publishes only from shards it
// holds. Within its shards a relay keeps at most one message per key in flight, so
// messages of a key reach the broker in order across retries and relays.
//
// Start and Stop are safe for concurrent use; Stats may be called at any time.
type Relay struct {
	store outboxdriver.Store
	pub   Publisher
	cfg   RelayConfig
	log   *slog.Logger

	mu      sync.Mutex
	started bool
	stop    chan struct{}      // closed by Stop: drain and exit
	kill    context.CancelFunc // cancels in-flight work when Stop's ctx ends
	stopped chan struct{}      // closed when the relay has exited

	stats relayStats
}

// RelayStats counts what a relay has done since it started.
type RelayStats struct {
	Published    int64 // messages confirmed by the broker and marked published
	Rejected     int64 // rejected attempts (each counted toward MaxAttempts)
	DeadLettered int64 // messages moved to the dead-letter state
	Outages      int64 // pauses caused by broker outages
	Refused      int64 // outcomes the store refused because the lease had moved on (fencing)
	Shards       int64 // shards held now
	Held         int64 // messages fetched and not yet recorded (waiting, in flight, or being recorded) now
	FromLog      int64 // WAL mode: messages taken from the stream to publish without a fetch
}

type relayStats struct {
	published, rejected, dead, outages, refused, shards, held, fromLog atomic.Int64
}

// NewRelay returns a relay that reads from store and sends to pub. It does not start it.
func NewRelay(store outboxdriver.Store, pub Publisher, config RelayConfig) (*Relay, error) {
	if store == nil {
		return nil, errors.New("outbox: missing store (wrap a pgx pool with outboxpgx.New)")
	}
	if pub == nil {
		return nil, errors.New("outbox: missing publisher (see outboxnats, or outboxtest.Publisher in tests)")
	}
	config = config.withDefaults()
	if err := config.validate(); err != nil {
		return nil, err
	}
	if err := checkSource(store, config); err != nil {
		return nil, err
	}
	stopped := make(chan struct{})
	return &Relay{
		store: store, pub: pub, cfg: config,
		log:     config.Logger.With("relay_id", config.ID),
		stopped: stopped,
	}, nil
}

// ID returns the relay's id, as it appears in leases.
func (r *Relay) ID() string { return r.cfg.ID }

// Stats returns counters of the relay's work.
func (r *Relay) Stats() RelayStats {
	return RelayStats{
		Published:    r.stats.published.Load(),
		Rejected:     r.stats.rejected.Load(),
		DeadLettered: r.stats.dead.Load(),
		Outages:      r.stats.outages.Load(),
		Refused:      r.stats.refused.Load(),
		Shards:       r.stats.shards.Load(),
		Held:         r.stats.held.Load(),
		FromLog:      r.stats.fromLog.Load(),
	}
}

// Start starts the relay in the background and returns at once. Cancelling ctx stops
// the relay hard (in-flight publishes are abandoned and will be sent again by whoever
// holds the shard next); Stop stops it gracefully. Starting twice is an error.
func (r *Relay) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return errors.New("outbox: relay already started")
	}
	r.started = true
	ctx, cancel := context.WithCancel(ctx)
	r.kill = cancel
	r.stop = make(chan struct{})
	l := newLoop(r)
	go func() {
		defer close(r.stopped)
		defer cancel()
		l.run(ctx)
	}()
	return nil
}

// Stop stops fetching, waits for in-flight messages to be confirmed and recorded, gives
// the relay's leases back so other relays take over at once, and returns. If ctx ends
// first, in-flight work is abandoned (it will be published again by the next owner) and
// Stop returns ctx's error. Stopping twice, or a relay never started, is safe.
func (r *Relay) Stop(ctx context.Context) error {
	r.mu.Lock()
	if !r.started {
		r.mu.Unlock()
		return nil
	}
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	r.mu.Unlock()
	select {
	case <-r.stopped:
		return nil
	case <-ctx.Done():
		r.kill()
		<-r.stopped
		return ctx.Err()
	}
}

// Stopped returns a channel closed when the relay has exited, after Stop or because
// Start's ctx was cancelled.
func (r *Relay) Stopped() <-chan struct{} { return r.stopped }

// Run starts the relay and blocks until ctx is cancelled, then stops it gracefully,
// giving in-flight work up to grace to finish. It is the daemon's main loop.
func (r *Relay) Run(ctx context.Context, grace time.Duration) error {
	if err := r.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-r.stopped:
		return errors.New("outbox: relay stopped unexpectedly")
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	return r.Stop(sctx)
}

// ---- the loop ----
//
// One goroutine (loop.run) owns all state below. It talks to helpers through channels:
// publish workers (at most MaxInFlight/PublishBatchSize at once), at most one Complete
// and one Fetch running at a time (they overlap each other), and one lease worker.
//
// The loop is the wiring; the state it owns lives in types that do no I/O and read no
// clock, each with its invariants and tests: the shard leases (leaseBook, leases.go), the
// messages in hand and the key gate (hand, hand.go), the fetch planner and the keys'
// floors (fetchPlan and floors: fetchplan.go, floors.go), the outcomes awaiting record
// (outcomeBuffer, outcomes.go), the pause after an outage (outageGate, outage.go) and
// when to ask for the wake gate (wakeGate, gate.go).
// Messages enter the hand from one source, the store's Fetch (startFetch and onFetch);
// another source hands them in the same way, through hand.fetchStarted and hand.fetched,
// under the same leases.

// keyFloors bounds the keys whose floor a relay remembers: a continuation through a
// backlog sends them all, about 30 bytes each.
const keyFloors = 4096

type pubResult struct {
	dest  string // the batch's destination, with a Router of several
	items []*item
	msgs  []*Message // the messages of items, as published
	errs  []error
	start time.Time
	took  time.Duration
}

type completeResult struct {
	c       outboxdriver.Completion
	lanes   []*lane // failed lanes whose failure this completion records
	refused []int64
	dropped int             // outcomes refused before asking the store (dropStaleOutcomes)
	settle  func(seq int64) // the fetch source's settler when the record was sent
	err     error
	took    time.Duration
}

type fetchResult struct {
	req     *outboxdriver.FetchRequest
	fetched []*Message
	err     error
	took    time.Duration
	done    func(fetchResult) // the fetch source's, after the hand took the rows (fetchRun)
	prio    bool              // a priority fetch (fetchPlan.nextPriority)
}

type leaseResult struct {
	state   outboxdriver.LeaseState
	err     error
	started time.Time
}

type loop struct {
	r        *Relay
	cfg      RelayConfig
	log      *slog.Logger
	hostname string // reported with every lease renewal

	lastOutageLog time.Time

	hand   *hand   // the messages in hand, by key: the key gate (hand.go)
	floors *floors // the continuation's lower bound per key

	leases *leaseBook

	inFlight    int
	freeWorkers int
	outcomes    outcomeBuffer // the broker's answers until the store records them
	// logRefusals counts, per message from the WAL stream, the records refused so far
	// (refusedFromLog).
	logRefusals map[int64]int

	// With a Router of several destinations, each batch goes to one destination, and no
	// destination takes more than its share of the publish workers and of MaxInFlight
	// (destCaps), so that a slow one leaves room to the others.
	destOf                          func(*Message) string
	destWorkers                     map[string]int
	destInFlight                    map[string]int
	destMaxWorkers, destMaxInFlight int

	givingWay string // the relays this one gives way to (LeaseState.GiveWay), by id: logged on change

	leaseBusy     bool
	leaseAgain    bool      // a round was wanted while one was out: start one when it returns
	leaseFails    int       // lease rounds failed in a row
	leaseFailedAt time.Time // when the first of them started
	lastLeaseLog  time.Time // when a failed round was last logged
	leaseRetryAt  time.Time // after a failed round: the next one, sooner than the renewal tick
	fetch         fetchPlan
	outage        *outageGate
	dests         *destBackoff // the retry delay of messages whose destination is unavailable

	pings        chan error
	pubResults   chan pubResult
	completes    chan completeResult
	fetches      chan fetchResult
	leaseResults chan leaseResult
	wake         chan struct{}
	news         listenNews    // what the listener said since the loop last looked
	wakeLeases   chan struct{} // a relay gave shards back: sync the leases now
	gate         *wakeGate     // when to ask for the gate (gate.go); nil when the store cannot listen
	gateAsks     chan struct{} // the asks, to the listener

	src  fetchSource                  // where news of messages to fetch comes from (source.go)
	prio outboxdriver.PriorityFetcher // the store's, when it keeps priorities and the relay polls

	stopping bool // asked to stop: draining what is in hand

	bgCtx context.Context // the background goroutines' (ended when run returns)
	bg    *sync.WaitGroup
}

func newLoop(r *Relay) *loop {
	workers := r.cfg.MaxInFlight / r.cfg.PublishBatchSize
	hostname, _ := os.Hostname()
	l := &loop{
		r: r, cfg: r.cfg, log: r.log, hostname: hostname,
		hand:         newHand(),
		floors:       newFloors(keyFloors),
		leases:       newLeaseBook(r.cfg.LeaseTTL),
		outage:       newOutageGate(r.cfg.OutageMinDelay, r.cfg.OutageMaxDelay),
		dests:        newDestBackoff(r.cfg.RetryMinDelay, min(r.cfg.RetryMaxDelay, time.Minute)),
		freeWorkers:  max(workers, 1),
		pubResults:   make(chan pubResult, workers+1),
		pings:        make(chan error, 1),
		completes:    make(chan completeResult, 1),
		fetches:      make(chan fetchResult, 1),
		leaseResults: make(chan leaseResult, 1),
		wake:         make(chan struct{}, 1),
		wakeLeases:   make(chan struct{}, 1),
	}
	if _, ok := r.store.(outboxdriver.Listener); ok {
		l.gate, l.gateAsks = &wakeGate{}, make(chan struct{}, 1)
	}
	if rt, ok := r.pub.(*Router); ok && len(rt.order) > 1 {
		l.destOf = rt.destinationOf
		l.destWorkers, l.destInFlight = map[string]int{}, map[string]int{}
		l.destMaxWorkers, l.destMaxInFlight = destCaps(l.freeWorkers, r.cfg.MaxInFlight, r.cfg.PublishBatchSize)
	}
	l.src = newFetchSource(l)
	if r.cfg.WAL == nil { // WAL mode reads in the log's order
		l.prio, l.fetch.prio = r.store.(outboxdriver.PriorityFetcher)
	}
	return l
}

// destCaps returns how many of the relay's publish workers, and how much of its
// MaxInFlight, one destination of several may take: three quarters, and never the last
// worker (one is enough when there is one), nor less than a batch.
func destCaps(workers, maxInFlight, batch int) (maxWorkers, inFlight int) {
	maxWorkers = workers * 3 / 4
	if workers > 1 {
		maxWorkers = min(max(maxWorkers, 1), workers-1)
	} else {
		maxWorkers = 1
	}
	return maxWorkers, max(maxInFlight*3/4, batch)
}

func (l *loop) run(ctx context.Context) {
	l.log.Info("relay starting", "batch_size", l.cfg.BatchSize, "max_in_flight", l.cfg.MaxInFlight,
		"lease_ttl", l.cfg.LeaseTTL, "poll_interval", l.cfg.PollInterval, "max_attempts", l.cfg.MaxAttempts, "fingerprint", l.cfg.Fingerprint)
	l.cfg.Observer.Running(RunningEvent{RelayID: l.cfg.ID, Running: true})
	defer l.cfg.Observer.Running(RunningEvent{RelayID: l.cfg.ID})
	var bg sync.WaitGroup
	bgCtx, bgCancel := context.WithCancel(ctx)
	defer func() { bgCancel(); bg.Wait() }()
	l.bgCtx, l.bg = bgCtx, &bg
	if lis, ok := l.r.store.(outboxdriver.Listener); ok {
		bg.Add(1)
		go func() { defer bg.Done(); l.listen(bgCtx, lis) }()
	}
	m, ok := l.r.store.(outboxdriver.Maintainer)
	if !ok && l.cfg.Retention > 0 {
		m, ok = rowCleaner{l.r.store}, true
	}
	if ok {
		bg.Add(1)
		go func() { defer bg.Done(); l.maintain(bgCtx, m) }()
	}
	if rc, ok := l.r.store.(outboxdriver.Recycler); ok {
		bg.Add(1)
		go func() { defer bg.Done(); l.recycle(bgCtx, rc) }()
	}
	l.src.start(bgCtx, &bg)

	poll := time.NewTicker(l.cfg.PollInterval)
	defer poll.Stop()
	renew := time.NewTicker(renewEvery(l.cfg.LeaseTTL))
	defer renew.Stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()

	var reconnected <-chan struct{}
	if rc, ok := l.r.pub.(Reconnector); ok {
		reconnected = rc.Reconnected()
	}

	l.syncLeases(ctx, false)
	stop := l.r.stop
	for {
		l.r.stats.held.Store(int64(l.hand.size()))
		if l.stopping && l.inFlight == 0 && !l.hand.fetchRunning() && l.outcomes.idle() {
			break
		}
		if !l.stopping {
			l.src.tick(time.Now())
			l.dispatch(ctx)
			l.startFetch(ctx)
		}
		l.startComplete(ctx)
		// Wake up for a paused outage, a pending recording, fetch or lease retry, or
		// the fetch source's timers.
		next := earliest(l.outage.wakeAt(), l.outcomes.retryTime(), l.fetch.wakeAt(time.Now()), l.src.wakeAt(), l.leaseRetryAt, l.gateWakeAt())
		if !next.IsZero() {
			timer.Reset(max(time.Until(next), time.Millisecond))
		}
		select {
		case <-ctx.Done():
			l.log.Warn("relay killed before draining", "in_flight", l.inFlight)
			return
		case <-stop:
			stop = nil
			l.stopping = true
			l.log.Info("relay stopping", "in_flight", l.inFlight)
			l.hand.dropUnsent(func(*lane) bool { return true })
		case res := <-l.pubResults:
			l.onPublished(res)
		case res := <-l.completes:
			l.onComplete(res)
		case res := <-l.fetches:
			l.onFetch(ctx, res)
		case res := <-l.leaseResults:
			l.onLeases(res)
		case <-l.wake:
			l.onListenNews()
		case <-poll.C:
			if l.src.polling() {
				l.fetch.wantFull()
				l.recheckGate()
			}
		case f := <-l.src.arrivals():
			f()
		case f := <-l.src.news():
			f()
		case <-renew.C:
			if !l.stopping {
				l.syncLeases(ctx, false)
			}
		case <-l.wakeLeases:
			l.recheckGate() // the relay that gave shards back may have held the gate
			if !l.stopping {
				l.leaseRoundSoon(ctx)
			}
		case err := <-l.pings:
			if d := l.outage.pinged(err, time.Now()); d > 0 {
				l.paused(d, fmt.Errorf("broker ping: %w", err))
			} else {
				streak, began := l.outage.current()
				l.log.Info("broker reachable again; resuming", "outage", time.Since(began).Round(time.Millisecond),
					"consecutive", streak)
			}
		case <-reconnected:
			// The publisher's connection is back: check now rather than at the end of the
			// pause (a no-op when the gate is open or a ping is out).
			if l.outage.reconnected(time.Now()) {
				l.resume(ctx)
			}
		case <-timer.C:
			if l.outage.due(time.Now()) {
				l.resume(ctx)
			}
			if l.gate != nil && l.gate.due(time.Now()) {
				l.fetch.poke()
			}
			if l.gate != nil && l.src.polling() && l.gate.recheckDue(time.Now()) {
				l.askGate()
			}
			if !l.leaseRetryAt.IsZero() && !time.Now().Before(l.leaseRetryAt) && !l.stopping {
				l.leaseRetryAt = time.Time{}
				l.syncLeases(ctx, false)
			}
			// A recording retry that came due starts at the top of the loop.
		}
	}
	// Drained: give the leases back so other relays take over without waiting for expiry.
	l.src.stop("")
	l.leaseAgain = false
	for l.leaseBusy {
		l.onLeases(<-l.leaseResults)
	}
	l.syncLeases(ctx, true)
	for l.leaseBusy {
		l.onLeases(<-l.leaseResults)
	}
	l.log.Info("relay stopped")
}

// leaseLogEvery spaces the log lines of lease rounds failing in a row.
const leaseLogEvery = 10 * time.Second

// renewEvery is how often a relay renews its leases and looks for shards to take: a third
// of the TTL, and at least every second, so that shards a relay gives back (or a dead
// relay leaves) find a new owner quickly.
func renewEvery(ttl time.Duration) time.Duration { return min(ttl/3, time.Second) }

// syncLeases starts a lease round trip unless one is running. With final set, every
// lease is released.
func (l *loop) syncLeases(ctx context.Context, final bool) {
	if l.leaseBusy {
		return
	}
	req := l.leases.request(outboxdriver.LeaseRequest{RelayID: l.cfg.ID, Hostname: l.hostname, PID: os.Getpid(), TTL: l.cfg.LeaseTTL,
		Fingerprint: l.cfg.Fingerprint}, final, l.hand.idle)
	if ds, ok := l.r.pub.(destinationStater); ok && !final {
		req.Destinations = ds.DestinationStates()
	}
	started := time.Now()
	l.src.leaseRequest(&req, final, started)
	l.leaseBusy = true
	go func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.LeaseTTL/3)
		// (A renewal may take up to TTL/3: with the TTL/5 local margin, the leases are
		// still ours when it gives up.)
		defer cancel()
		st, err := l.r.store.SyncLeases(sctx, req)
		l.leaseResults <- leaseResult{state: st, err: err, started: started}
	}()
}

func (l *loop) onLeases(res leaseResult) {
	l.leaseBusy = false
	if l.leaseAgain {
		l.leaseAgain = false
		defer l.syncLeases(context.Background(), false) // after this answer is applied
	}
	if res.err != nil {
		// Rounds are retried within a fifth of a second: in an outage, the first failure
		// and then one line per leaseLogEvery say it.
		if now := time.Now(); l.leaseFails == 0 || now.Sub(l.lastLeaseLog) >= leaseLogEvery {
			l.lastLeaseLog = now
			args := []any{"err", res.err}
			if d := l.leases.deadline(); !d.IsZero() { // holding none, there is nothing to run out
				args = append(args, "seconds_left", time.Until(d).Seconds())
			}
			l.log.Error("lease renewal failed; sending stops when the leases run out", append(args, "consecutive", l.leaseFails+1)...)
		}
		if l.leaseFails == 0 {
			l.leaseFailedAt = res.started
		}
		l.leases.failed()
		// Try again soon rather than at the next renewal: after a database outage
		// longer than the sending margin, sending resumes with the first round that
		// succeeds. A round that failed only after waiting as long as the backoff
		// (its deadline, in an outage) tries again at once.
		l.leaseFails++
		l.leaseRetryAt = res.started.Add(dbRetry(l.leaseFails))
		return
	}
	if l.leaseFails > 0 {
		l.log.Info("lease renewal succeeded again", "failed_rounds", l.leaseFails,
			"after", time.Since(l.leaseFailedAt).Round(time.Millisecond))
	}
	l.leaseFails, l.leaseRetryAt = 0, time.Time{}
	l.logGiveWay(res.state)
	c := l.leases.apply(res.state, res.started)
	if !l.stopping {
		l.src.leased(res.state, res.started)
	}
	if len(c.lost) > 0 || len(c.drain) > 0 {
		gone := map[int]bool{}
		for _, s := range append(c.lost, c.drain...) {
			gone[s] = true
		}
		l.hand.dropUnsent(func(ln *lane) bool { return gone[ln.shard] })
	}
	held := l.leases.count()
	l.r.stats.shards.Store(int64(held))
	if len(c.lost) > 0 || len(c.gained) > 0 {
		l.cfg.Observer.LeasesChanged(LeaseEvent{Held: held, Gained: c.gained, Lost: c.lost, Live: res.state.Live})
		l.log.Info("leases changed", "held", held, "target", res.state.Target, "live_relays", res.state.Live,
			"gained", fmt.Sprint(c.gained), "lost", fmt.Sprint(c.lost))
	}
	if len(c.gained) > 0 {
		l.fetch.gained()
		l.src.gained()
	}
	// Lanes skipped while the leases had lapsed locally become sendable again.
	l.hand.requeue(l.sendable)
}

// destinationStater is a publisher of several destinations (Router): a relay records
// their states with its heartbeat.
type destinationStater interface {
	DestinationStates() []outboxdriver.DestinationState
}

// logGiveWay says when the relay starts or stops giving way to relays of another
// fingerprint (LeaseState.GiveWay).
func (l *loop) logGiveWay(st outboxdriver.LeaseState) {
	ids, fps := st.GiveWayTo()
	key := strings.Join(ids, ",")
	if key == l.givingWay {
		return
	}
	l.givingWay = key
	if key == "" {
		l.log.Info("no relay of another destinations and routing holds shards now: this relay takes its share")
		return
	}
	l.log.Warn("taking no shards: relays of other destinations and routing hold them; this relay waits until they stop (a rolling change of the routing), else compare their configuration with this one's",
		"relays", key, "their_fingerprints", strings.Join(fps, ","), "fingerprint", l.cfg.Fingerprint)
}

// sendable reports whether messages of shard may be sent now.
func (l *loop) sendable(shard int) bool {
	if broken.Has(broken.NoKeyGate) {
		return true // canary: leases ignored
	}
	return l.leases.sendable(shard, time.Now())
}

// dispatch hands ready lane heads to free publish workers.
func (l *loop) dispatch(ctx context.Context) {
	if !l.outage.open() {
		return
	}
	for l.freeWorkers > 0 && l.hand.readyLen() > 0 && l.inFlight+l.outcomes.inHand() < l.cfg.MaxInFlight {
		// Lanes whose shard is not sendable are passed over: lost or draining shards are
		// dropped by the lease round (dropUnsent), lapsed leases re-queued by the next one.
		n := min(l.cfg.PublishBatchSize, l.cfg.MaxInFlight-l.inFlight-l.outcomes.inHand())
		var dest string
		var allow func(*item) bool
		if l.destOf != nil {
			chosen := false
			allow = func(it *item) bool {
				if !it.routed {
					it.dest, it.routed = l.destOf(it.m), true
				}
				d := it.dest
				if !chosen {
					if l.destWorkers[d] >= l.destMaxWorkers || l.destInFlight[d] >= l.destMaxInFlight {
						return false
					}
					dest, chosen = d, true
				}
				if d != dest || l.destInFlight[d] >= l.destMaxInFlight {
					return false
				}
				l.destInFlight[d]++
				return true
			}
		}
		batch := l.hand.takeReadyIf(n, l.sendable, allow)
		if len(batch) == 0 {
			return
		}
		if l.destOf != nil {
			l.destWorkers[dest]++
		}
		l.inFlight += len(batch)
		l.freeWorkers--
		go l.publish(ctx, dest, batch)
	}
}

func (l *loop) publish(ctx context.Context, dest string, batch []*item) {
	msgs := make([]*Message, len(batch))
	for i, it := range batch {
		msgs[i] = it.m
	}
	pctx, cancel := context.WithTimeout(ctx, l.cfg.PublishTimeout)
	start := time.Now()
	errs := publishAll(pctx, l.r.pub, msgs)
	took := time.Since(start)
	cancel()
	for i, err := range errs {
		if err != nil && !IsUnavailable(err) && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
			errs[i] = Outage(err) // unknown outcome: send again, count no attempt
		}
	}
	l.pubResults <- pubResult{dest: dest, items: batch, msgs: msgs, errs: errs, start: start, took: took}
}

func (l *loop) onPublished(res pubResult) {
	l.cfg.Observer.PublishDone(PublishEvent{Batch: res.msgs, Errs: res.errs, Start: res.start, Took: res.took})
	l.freeWorkers++
	l.inFlight -= len(res.items)
	if l.destOf != nil {
		l.destWorkers[res.dest]--
		l.destInFlight[res.dest] -= len(res.items)
	}
	outage := false
	confirmed := 0
	for i, it := range res.items {
		var err error
		if res.errs != nil {
			err = res.errs[i]
		}
		if broken.Has(broken.MarkBeforeConfirm) {
			err = nil // canary: recorded as published whatever the broker answered
		}
		switch {
		case err == nil:
			confirmed++
			l.outcomes.confirmed(outboxdriver.Outcome{Seq: it.m.Seq, Token: it.token})
			l.hand.confirmed(it, l.sendable)
		case IsOutage(err):
			outage = true
			// One line a second is enough to see an outage; the pause is logged below.
			if now := time.Now(); now.Sub(l.lastOutageLog) >= time.Second {
				l.lastOutageLog = now
				l.log.Warn("broker outage", "event_id", it.m.ID.String(), "dedup_key", it.m.DedupKey,
					"aggregate_id", it.m.Key, "event_type", it.m.EventType, "topic", it.m.Topic,
					"attempt", it.m.Attempts+1, "err", err)
			}
			l.hand.unsent(it, l.sendable)
		case IsUnavailable(err): // not the broker's outage: its destination's
			l.deferTo(it, err)
		default:
			l.reject(it, err)
		}
	}
	if confirmed > 0 {
		l.outage.confirmed()
	}
	if outage {
		if d := l.outage.outage(time.Now()); d > 0 {
			l.paused(d, nil)
		}
	}
}

// paused reports a pause the outage gate began: cause is the failed ping, or nil after
// a batch found the broker unreachable.
func (l *loop) paused(d time.Duration, cause error) {
	l.r.stats.outages.Add(1)
	l.cfg.Observer.Paused(PauseEvent{Pause: d})
	streak, _ := l.outage.current()
	if cause != nil {
		l.log.Warn("broker still unreachable; pausing", "pause", d.Round(time.Millisecond), "consecutive", streak, "err", cause)
	} else {
		l.log.Warn("pausing after broker outage", "pause", d.Round(time.Millisecond), "consecutive", streak)
	}
}

// resume ends a pause: at once, or, when the publisher can tell, once the broker answers
// a ping, so that a broker still down costs a ping rather than a batch of timeouts.
func (l *loop) resume(ctx context.Context) {
	pinger, ok := l.r.pub.(Pinger)
	if !ok {
		l.outage.reopen()
		return
	}
	l.outage.ping()
	go func() {
		pctx, cancel := context.WithTimeout(ctx, min(l.cfg.PublishTimeout, 10*time.Second))
		defer cancel()
		l.pings <- pinger.Ping(pctx)
	}()
}

// reject records a rejected attempt of it, its lane's head, and holds the key back.
func (l *loop) reject(it *item, err error) {
	attempt := it.m.Attempts + 1
	f := outboxdriver.Failure{Outcome: outboxdriver.Outcome{Seq: it.m.Seq, Token: it.token}, Error: truncate(err.Error(), 2000)}
	if attempt >= l.cfg.MaxAttempts || IsPermanent(err) {
		f.Dead = true
		l.log.Error("message dead-lettered", "event_id", it.m.ID.String(), "dedup_key", it.m.DedupKey,
			"aggregate_id", it.m.Key, "event_type", it.m.EventType, "topic", it.m.Topic, "attempt", attempt, "err", err)
	} else {
		f.Delay = backoff(attempt, l.cfg.RetryMinDelay, l.cfg.RetryMaxDelay)
		l.log.Warn("publish rejected; will retry", "event_id", it.m.ID.String(), "dedup_key", it.m.DedupKey,
			"aggregate_id", it.m.Key, "event_type", it.m.EventType, "topic", it.m.Topic, "attempt", attempt,
			"retry_in", f.Delay.Round(time.Millisecond), "err", err)
	}
	l.cfg.Observer.Rejected(RejectEvent{Message: it.m, Err: err, Attempt: attempt, Dead: f.Dead})
	// The head stays in hand until the failure is recorded; later messages of the key are
	// dropped now and fetched again once the store knows the key is blocked.
	l.outcomes.rejected(f, l.hand.rejected(it))
}

// deferTo holds back it, its lane's head, whose destination is unavailable: recorded with
// no attempt counted, due again after the destination's backoff (destBackoff), and its
// key held back meanwhile, in the store as for a retry; other keys and destinations go on.
func (l *loop) deferTo(it *item, err error) {
	dest, _ := AsDestinationOutage(err)
	delay, log := l.dests.deferral(dest, time.Now())
	f := outboxdriver.Failure{Outcome: outboxdriver.Outcome{Seq: it.m.Seq, Token: it.token}, Error: truncate(err.Error(), 2000),
		Delay: delay, Deferred: true}
	if log {
		l.log.Warn("destination unavailable; its messages wait, the others go on", "destination", dest,
			"event_id", it.m.ID.String(), "topic", it.m.Topic, "retry_in", delay.Round(time.Millisecond), "err", err)
	}
	l.cfg.Observer.Rejected(RejectEvent{Message: it.m, Err: err, Attempt: it.m.Attempts, Destination: dest})
	l.outcomes.rejected(f, l.hand.rejected(it))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// dropStaleOutcomes refuses, without asking the store, outcomes fetched under a lease
// token the relay no longer holds for the message's shard: the shard moved on (perhaps
// back to this relay under a new token), and its current owner publishes the message.
// settle is the fetch source's settler for the record being sent.
func (l *loop) dropStaleOutcomes(settle func(seq int64)) (dropped int) {
	stale := func(o outboxdriver.Outcome) bool {
		shard, ok := l.hand.shardOf(o.Seq)
		if ok && l.leases.holds(shard, o.Token) {
			return false
		}
		l.hand.forget(o.Seq)
		settle(o.Seq) // the shard's next owner fetches it
		l.r.stats.refused.Add(1)
		return true
	}
	if dropped = l.outcomes.dropStale(stale); dropped > 0 {
		l.log.Warn("outcomes dropped: the lease moved on, its owner publishes these messages again", "refused", dropped)
	}
	return dropped
}

// startComplete records the outcomes gathered so far, unless a complete is running or
// the last one failed moments ago.
func (l *loop) startComplete(ctx context.Context) {
	if !l.outcomes.ready(time.Now()) {
		return
	}
	settle := l.src.settler()
	dropped := l.dropStaleOutcomes(settle)
	c := outboxdriver.Completion{RelayID: l.cfg.ID}
	var lanes []*lane
	c.Published, c.Failed, lanes = l.outcomes.take()
	go func() {
		res := completeResult{c: c, lanes: lanes, dropped: dropped, settle: settle}
		if len(c.Published) > 0 || len(c.Failed) > 0 {
			// A graceful stop still records outcomes; only a hard kill abandons them.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			start := time.Now()
			res.refused, res.err = l.r.store.Complete(cctx, c)
			res.took = time.Since(start)
			cancel()
		}
		l.completes <- res
	}()
}

func (l *loop) onComplete(res completeResult) {
	c := res.c
	if res.err != nil {
		l.cfg.Observer.RecordDone(RecordEvent{Refused: res.dropped, Took: res.took, Err: res.err})
		// Keep the outcomes and try again shortly; the messages stay in hand.
		l.log.Error("recording outcomes failed; retrying", "err", res.err, "published", len(c.Published), "failed", len(c.Failed))
		l.outcomes.failedAt(c, res.lanes, time.Now())
		return
	}
	l.outcomes.recorded(c)
	refused := make(map[int64]bool, len(res.refused))
	for _, s := range res.refused {
		refused[s] = true
	}
	c, again := l.refusedFromLog(c, refused)
	if n := len(res.refused) - len(again); n > 0 { // those recorded again are not counted yet
		l.r.stats.refused.Add(int64(n))
		l.log.Warn("outcomes refused: the lease moved to another relay, which will publish these messages again",
			"refused", n)
	}
	var retried, dead int
	var published []int64                 // the seqs published, gone from the table
	var waiting []outboxdriver.WaitingRow // the rows left pending in the table, holding their keys back
	// settle takes seq out of hand and resolves it for the fetch source, but for a message
	// from the log whose record was refused (refusedFromLog): it is left waiting, its seq
	// open (ok false).
	settle := func(seq int64) (key string, ok bool) {
		fromLog := refused[seq] && l.hand.fromLog(seq)
		key = l.hand.settle(seq)
		if fromLog {
			waiting = append(waiting, outboxdriver.WaitingRow{Seq: seq, Key: key})
			return key, false
		}
		res.settle(seq)
		return key, true
	}
	for _, o := range c.Published {
		key, ok := settle(o.Seq)
		if !ok {
			continue
		}
		if !refused[o.Seq] {
			published = append(published, o.Seq)
			l.floors.raise(key, o.Seq)
		}
	}
	l.r.stats.published.Add(int64(len(published)))
	for _, f := range c.Failed {
		key, ok := settle(f.Seq)
		switch {
		case !ok || refused[f.Seq]:
		case f.Dead:
			dead++
			l.floors.raise(key, f.Seq)
			l.r.stats.dead.Add(1)
		default: // a retry, counted or deferred: the row waits in the table
			retried++
			waiting = append(waiting, outboxdriver.WaitingRow{Seq: f.Seq, Key: key})
			if !f.Deferred {
				l.r.stats.rejected.Add(1)
			}
		}
	}
	for _, ln := range res.lanes { // the rows of the key a failure dropped: pending, behind it
		for _, seq := range ln.dropped {
			waiting = append(waiting, outboxdriver.WaitingRow{Seq: seq, Key: ln.key})
		}
	}
	l.src.recorded(published, waiting)
	if len(again) > 0 {
		l.outcomes.again(again, time.Now().Add(logRefusedDelay<<(l.logRefusals[again[0].Seq]-1)))
	}
	if len(c.Published)+len(c.Failed)+res.dropped > 0 {
		l.cfg.Observer.RecordDone(RecordEvent{Published: len(published), Retried: retried, Dead: dead, Refused: len(res.refused) - len(again) + res.dropped, Took: res.took})
	}
	l.hand.failureRecorded(res.lanes)
	// Draining shards may now be empty: release them soon.
	if l.leases.drainedAny(l.hand.idle) {
		l.leaseRoundSoon(context.Background())
	}
}

// A message the WAL stream brought can reach the relay before its writer's transaction
// is visible to other sessions (the walsender may send a commit before the committing
// session leaves the list of running transactions, or while it waits for a synchronous
// standby): its record then finds no row, and is refused. The relay records such a
// published outcome again, logRefusedDelay later and doubling, up to logRefusedTries
// times, the message kept in hand; after that, or for a failure, the message leaves hand
// unrecorded, its key is left to the fetch path (waiting), and the tracker keeps its seq
// open, so that a full fetch, which sees it once visible, publishes it again or shows it
// gone (a lease that really moved).
const (
	logRefusedDelay = time.Millisecond
	logRefusedTries = 8
)

// refusedFromLog takes out of c the published outcomes of messages from the WAL stream
// that the store refused and that are to be recorded again (again), counting the tries
// in logRefusals; it forgets the count of each outcome recorded or given up.
func (l *loop) refusedFromLog(c outboxdriver.Completion, refused map[int64]bool) (rest outboxdriver.Completion, again []outboxdriver.Outcome) {
	rest = c
	rest.Published = nil
	for _, o := range c.Published {
		if refused[o.Seq] && l.hand.fromLog(o.Seq) && l.logRefusals[o.Seq] < logRefusedTries {
			if l.logRefusals == nil {
				l.logRefusals = map[int64]int{}
			}
			l.logRefusals[o.Seq]++
			again = append(again, o)
			continue
		}
		delete(l.logRefusals, o.Seq)
		rest.Published = append(rest.Published, o)
	}
	return rest, again
}

// onListenNews takes what the listener said: the gate's news, and the fetches the
// notifications call for.
func (l *loop) onListenNews() {
	froms, unknown, started, news, full := l.news.take()
	if g := l.gate; g != nil {
		if started {
			g.listening(true)
		}
		switch news.kind {
		case newsWritten:
			g.woken()
		case newsAnswer:
			g.answered(news.answer, time.Now())
		case newsStopped:
			g.listening(false)
		}
	}
	if !l.src.polling() {
		return
	}
	if full {
		l.fetch.wantFull()
	}
	l.notified(froms, unknown)
	// A notification that asks for no fetch (the relay holds what it announced) leaves
	// nothing to come back short: ask now, or writers would no longer notify.
	if !l.fetch.planned() && l.gate != nil && l.gate.short() {
		l.askGate()
	}
}

// askGate asks the listener for the gate (an ask already out is as good).
func (l *loop) askGate() {
	select {
	case l.gateAsks <- struct{}{}:
	default:
	}
}

// recheckGate asks for the gate again if another relay held it (wakeGate.recheck).
func (l *loop) recheckGate() {
	if l.gate != nil && l.src.polling() && l.gate.recheck() {
		l.askGate()
	}
}

// gateWakeAt is when the next fetch while the gate is open is due, for the loop's timer.
func (l *loop) gateWakeAt() time.Time {
	if l.gate == nil {
		return time.Time{}
	}
	return l.gate.wakeAt()
}

// notified plans the fetches for what the notifications announced: each the lowest seq
// its transaction wrote. A transaction whose lowest message is in hand at or below the
// cursor needs none: the fetch that read that message saw all of its rows (they became
// visible together), and those it did not return lie above the cursor, or are held back
// by their key's gate until a full fetch. That is the usual case at a steady rate, where
// the fetch woken by one commit often reads the next one too.
func (l *loop) notified(froms []int64, unknown bool) {
	if unknown {
		l.fetch.notified(0)
		return
	}
	for _, from := range froms {
		if _, inHand := l.hand.shardOf(from); inHand && from <= l.fetch.at() {
			continue
		}
		l.fetch.notified(from)
	}
}

// startFetch reads more due messages when there is room for them and the fetch plan
// (fetchplan.go) wants them. A continuation must not let a key's newer message overtake
// an older one the relay does not hold, so it sends the keys it holds and, through a
// backlog, every remembered key's floor (floors.go): the store takes a message only if
// its key has no older pending message above the key's floor, or the relay holds the
// key's lane. Messages skipped (a key
// released after a rejection, a shard just gained) come with the next full fetch.
func (l *loop) startFetch(ctx context.Context) {
	room := l.cfg.BatchSize + l.cfg.MaxInFlight - l.hand.size()
	now := time.Now()
	if l.hand.fetchRunning() || !now.Before(l.leases.deadline()) {
		return
	}
	if l.fetch.nextPriority(now, room, l.cfg.BatchSize, l.hand.prioritized()) {
		l.startPriorityFetch(ctx, room, now)
		return
	}
	ok, full, after := l.fetch.next(now, room, l.cfg.BatchSize)
	if !ok {
		return
	}
	if broken.Has(broken.CursorPolling) {
		if a, ok := l.fetch.cursorPolling(); ok {
			full, after = false, a // canary: "id > cursor" polling
		}
	}
	req := &outboxdriver.FetchRequest{RelayID: l.cfg.ID, Limit: min(room, l.cfg.BatchSize)}
	req.Leases = l.leases.active()
	if len(req.Leases) == 0 {
		return
	}
	l.fetch.started(full, now)
	if full {
		req.Exclude = l.hand.seqs()
	} else {
		req.After = after
		req.Keys, req.KeySeqs = l.floors.bounds(l.hand.held(), l.fetch.backlog())
	}
	l.runFetch(ctx, req, false, l.src.fetch(req))
}

// startPriorityFetch reads a backlog's higher-priority messages ahead of it (fetchPlan's
// prio). Like a full fetch it excludes what is in hand, and like a continuation it sends
// the keys held: the store takes a message only if its key has no earlier pending
// message the relay has not handled and of another priority, so the key's order holds.
func (l *loop) startPriorityFetch(ctx context.Context, room int, now time.Time) {
	req := &outboxdriver.FetchRequest{RelayID: l.cfg.ID, Limit: min(room, l.cfg.BatchSize), Leases: l.leases.active()}
	if len(req.Leases) == 0 {
		return
	}
	l.fetch.priorityStarted(now)
	req.Exclude = l.hand.seqs()
	// The keys held, without the floors: the store probes each candidate key once, and
	// the floors (thousands of keys) would cost every fetch more than they save.
	req.Keys, req.KeySeqs = l.floors.bounds(l.hand.held(), false)
	l.runFetch(ctx, req, true, func(ctx context.Context) ([]*Message, func(fetchResult), error) {
		msgs, err := l.prio.FetchPriority(ctx, *req)
		return msgs, nil, err
	})
}

// runFetch runs fetch, for req, on a goroutine of its own, and hands its result to the
// loop.
func (l *loop) runFetch(ctx context.Context, req *outboxdriver.FetchRequest, prio bool, fetch fetchRun) {
	l.hand.fetchStarted()
	go func() {
		fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		start := time.Now()
		msgs, done, err := fetch(fctx)
		cancel()
		l.fetches <- fetchResult{req: req, fetched: msgs, err: err, took: time.Since(start), done: done, prio: prio}
	}()
}

func (l *loop) onFetch(ctx context.Context, res fetchResult) {
	l.cfg.Observer.FetchDone(FetchEvent{Messages: len(res.fetched), Took: res.took, Err: res.err})
	switch {
	case res.err != nil && res.prio:
		l.hand.fetched(nil, nil)
		l.fetch.priorityDone(0, false)
		if errors.Is(res.err, outboxdriver.ErrNoPriorities) {
			l.fetch.prio = false
			l.log.Info("priorities off: reading the backlog in seq order alone", "reason", res.err)
			return
		}
		l.log.Error("fetch by priority failed", "err", res.err)
		return
	case res.err != nil:
		l.hand.fetched(nil, nil)
		l.log.Error("fetch failed", "err", res.err)
		l.fetch.failed(time.Now())
		return
	}
	full := len(res.fetched) == res.req.Limit
	if res.prio {
		l.fetch.priorityDone(len(res.fetched), full)
	} else {
		l.fetched(res, full)
	}
	tokens := make(map[int]int64, len(res.req.Leases))
	for _, ls := range res.req.Leases {
		tokens[ls.Shard] = ls.Token
	}
	l.hand.fetched(res.fetched, func(m *Message) (int64, bool) {
		token, ok := tokens[m.Shard]
		if broken.Has(broken.NoKeyGate) {
			token, ok = l.leases.tokenOf(m.Shard), true // canary: rows of any shard taken
		}
		// The lease may have changed while fetching.
		return token, ok && l.leases.fetchable(m.Shard, token)
	})
	if res.done != nil {
		res.done(res)
	}
}

// fetched moves the fetch plan on after a fetch (not a priority fetch) that came back
// full or not, and tells the gate what it found.
func (l *loop) fetched(res fetchResult, full bool) {
	var top int64
	for _, m := range res.fetched {
		top = max(top, m.Seq)
	}
	l.fetch.done(top, full, res.req.After)
	if g := l.gate; !full && g != nil && l.src.polling() {
		if len(res.fetched) > 0 {
			g.found(time.Now())
		} else if g.short() {
			l.askGate()
		}
	}
}

// leaseRoundSoon starts a lease round trip now, or as soon as the one out returns (it may
// have read the leases before what prompted this one).
func (l *loop) leaseRoundSoon(ctx context.Context) {
	if l.leaseBusy {
		l.leaseAgain = true
		return
	}
	l.syncLeases(ctx, false)
}
