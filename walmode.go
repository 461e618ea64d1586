package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox/internal/broken"
	"github.com/outboxkit/outbox/outboxdriver"
)

// WALConfig turns on WAL mode (docs/design-wal.md): the relay follows the database's log
// through the replication slot `outbox wal setup` made. It publishes a fresh message as
// the log brings it when the log can be trusted for it (its key holds nothing back, it
// committed after the relay caught up: docs/design-wal.md, §2b), and fetches the others
// when a transaction that wrote to the outbox commits, instead of when it is notified or
// polls (same order, key gate and fencing as polling). The slot keeps the log until the
// relay acknowledges it, and its position moves only past transactions whose messages
// were recorded or shown by a fetch to be the polling path's, so losing the slot loses
// nothing: the relay falls back to polling, loudly, and the rows are still in the table.
//
// It needs a store that can stream (outboxdriver.Streamer: outboxpgx) and PostgreSQL
// with wal_level=logical.
type WALConfig struct {
	// Slot and Publication name what `outbox wal setup` made; empty means the store's
	// defaults (outbox_wal and outbox_pub for an outbox in public without a prefix).
	Slot        string
	Publication string
	// SafetyPoll is how often a full fetch runs anyway while the stream is live; it
	// should find nothing the stream had not announced. Defaults to 1m; -1 turns it off.
	SafetyPoll time.Duration
	// Heartbeat is how often the slot's reader writes a heartbeat into the log (a
	// logical decoding message, in its lease round) while it streams. The stream shows
	// each one: when neither a heartbeat nor anything else arrives for three of these
	// intervals while one is owed, the relay takes the stream for dead (a half-open
	// connection, a stuck server process) and opens it again. Defaults to 10s; -1 turns
	// it off.
	Heartbeat time.Duration
	// KeepLostSlot leaves a lost slot (invalidated: it held more WAL than
	// max_slot_wal_keep_size allows) or a missing one (dropped by hand, or not on the
	// server after a failover) for an operator: the relays poll until 'outbox wal setup'
	// makes it again. By default the slot's reader makes it anew at once and catches up
	// from the outbox table, losing nothing (the slot never holds the only copy of a
	// message), and says so at ERROR. A slot removed by 'outbox wal drop' is never made
	// again.
	KeepLostSlot bool
}

// WALSafetyPollDefault is WALConfig.SafetyPoll's default.
const WALSafetyPollDefault = time.Minute

// WALHeartbeatDefault is WALConfig.Heartbeat's default.
const WALHeartbeatDefault = 10 * time.Second

// walAckEvery spaces the acknowledgements sent to the stream: each is a status update
// the walsender takes in and a wake-up of the stream's reader, and a position held back
// that long only keeps that much more WAL.
const walAckEvery = 20 * time.Millisecond

// After a fetch missed rows the log announced, the relay looks again at once, then
// walMissDelay later, doubling, walMissLooks looks in all, then with the usual paced
// full fetch every fullFetchEvery. The walsender may send a commit before the committing
// session has left the server's list of running transactions (on a busy machine the
// walsender's wake-up can preempt it), so that a fetch right after does not see the rows
// yet, for a moment: in a trickle at 1,000 commits a second, 5-10% of the fetches. The
// first look goes at once because its round trip is wait enough, and a timer cannot wait
// less than about a millisecond.
const (
	walMissDelay = time.Millisecond
	walMissLooks = 6
)

// walSilentBeats is how many heartbeat intervals the stream may stay silent, with a
// heartbeat owed, before the relay opens it again; each reopening for silence doubles
// the allowance, up to walSilentMaxDoublings times, until a heartbeat arrives: a server
// busy decoding gigabytes of other tables' log sends nothing for a while, and opening
// the stream again would only start that work over.
const (
	walSilentBeats        = 3
	walSilentMaxDoublings = 4
)

const (
	// walRetryMin and walRetryMax space the attempts to open the stream again after a
	// connection failure (as the database's fetches and records are); walFallbackAfter
	// is how long such failures may last before the relay says, at ERROR, that it fell
	// back to polling (it polls from the first failure on).
	walRetryMin      = 25 * time.Millisecond
	walRetryMax      = time.Second
	walFallbackAfter = 30 * time.Second
	// walBrokenMin and walBrokenMax space the attempts after a failure an operator has
	// to fix (wal_level, privileges, a missing or lost slot or publication).
	walBrokenMin = 30 * time.Second
	walBrokenMax = 5 * time.Minute
)

// walSource is the fetch source of WAL mode: the tracker of what the stream announced,
// and the stream's state. It drives the loop's fetch plan (plan), and reads the hand and
// the leases through their methods. Only the loop's goroutine calls its methods; the
// stream and NextDue goroutines reach it through arrived and notes.
type walSource struct {
	cfg     WALConfig
	st      outboxdriver.Streamer
	store   outboxdriver.Store
	snap    outboxdriver.SnapshotFetcher // nil: the store gives no snapshot with a fetch
	tracker *walTracker
	// The log path (walLog): rows published from the stream, with no fetch; nil when the
	// store cannot say which rows wait (outboxdriver.WaitingReader).
	fromLog  *walLog
	waiter   outboxdriver.WaitingReader
	capacity int  // the most messages in hand (BatchSize + MaxInFlight), as the fetches keep
	logOn    bool // fromLog was on at the last tick, as logged
	// reading: a read of the rows that wait is out; readAgain: an arming came after it.
	reading, readAgain bool
	stats              *relayStats
	// wholeRows is fromLog.on() as of the last tick, for the stream's goroutine: whole
	// rows only while the log path may take them, keys only otherwise.
	wholeRows atomic.Bool

	relayID      string
	pollInterval time.Duration
	log          *slog.Logger
	observer     Observer
	plan         *fetchPlan
	hand         *hand
	leases       *leaseBook
	ctx          context.Context // the loop's background context (start)
	bg           *sync.WaitGroup // counts the source's goroutines

	arrived chan func()                 // stream batches, from the stream goroutine
	notes   chan func()                 // the stream's state and NextDue's answers
	acks    chan outboxdriver.StreamAck // to the stream: the latest only (capacity 1)

	// The slot reader's lease, as of the last lease round: only its holder reads the
	// slot. Each stream goroutine the source starts has a generation; the news of an
	// earlier one is stale.
	token  int64              // the lease held, 0: none
	holder string             // who holds it ("" none, or no slot recorded)
	gen    uint64             // the running (or last) stream goroutine's generation
	cancel context.CancelFunc // stops the running stream goroutine; nil when none runs

	live      bool                      // the stream runs: polls and write wake-ups are off
	reason    outboxdriver.StreamReason // why it does not, as last logged
	acked     uint64                    // the last position sent
	ackUntil  time.Time                 // its deadline
	ackedAt   time.Time                 // when it was sent
	ackAt     time.Time                 // when a newer one may go (walAckEvery); zero: none waits
	drops     int                       // hand.dropped() when last looked at
	due       time.Time                 // when a waiting row becomes due (NextDue); zero: none known
	dueStale  bool                      // the next due row may have changed since the last NextDue
	handed    uint64                    // tracker.handed at the last NextDue
	missAt    time.Time                 // when to look again for announced rows a fetch missed; zero: not asked
	misses    int                       // quick looks in a row (walMissDelay)
	dueBusy   bool                      // a NextDue query is out
	dueAgain  bool                      // another was wanted meanwhile
	safetyAt  time.Time                 // the next safety poll; zero: off
	safetyOut bool                      // the fetch out is a safety poll

	// The heartbeat (WALConfig.Heartbeat), while the stream is live.
	beatNext  time.Time // when the next one is to be written
	beatOwed  time.Time // when the oldest one written and not yet seen was; zero: none
	heardAt   time.Time // when the stream last delivered anything
	silences  int       // reopenings for silence since the last heartbeat seen
	beatErred bool      // writing one failed, as logged
}

// walState is the stream goroutine's news: it started (live), or it stopped.
type walState struct {
	gen    uint64 // the goroutine's generation
	live   bool
	reason outboxdriver.StreamReason
	err    error
	// fallback: the failure is one an operator must fix, or connection failures lasted
	// walFallbackAfter; the relay says so loudly.
	fallback bool
	// recreated: the slot was lost or missing (reason, err) and the relay made it anew.
	recreated bool
}

// newWALSource returns the WAL mode source of the loop l, which runs on the store st
// streams from.
func newWALSource(cfg WALConfig, st outboxdriver.Streamer, l *loop) *walSource {
	w := &walSource{cfg: cfg, st: st, store: l.r.store, tracker: newWALTracker(),
		relayID: l.cfg.ID, pollInterval: l.cfg.PollInterval, log: l.log, observer: l.cfg.Observer,
		plan: &l.fetch, hand: l.hand, leases: l.leases, stats: &l.r.stats,
		arrived: make(chan func()), notes: make(chan func(), 2),
		acks: make(chan outboxdriver.StreamAck, 1)}
	w.snap, _ = l.r.store.(outboxdriver.SnapshotFetcher)
	if wr, ok := l.r.store.(outboxdriver.WaitingReader); ok {
		w.waiter, w.fromLog = wr, newWALLog()
		w.capacity = l.cfg.BatchSize + l.cfg.MaxInFlight
		w.wholeRows.Store(broken.Has(broken.WALTrustAll))
	}
	return w
}

func (w *walSource) start(ctx context.Context, bg *sync.WaitGroup) { w.ctx, w.bg = ctx, bg }

// polling reports whether polls and write wake-ups should start fetches: while the
// stream is not live.
func (w *walSource) polling() bool { return !w.live }

// leaseRequest asks for the slot reader's lease: with a heartbeat when one is due.
func (w *walSource) leaseRequest(req *outboxdriver.LeaseRequest, final bool, started time.Time) {
	beat := !final && w.live && w.token != 0 && w.cfg.Heartbeat > 0 && !started.Before(w.beatNext)
	req.Slot = &outboxdriver.SlotLease{Slot: w.cfg.Slot, Token: w.token, Release: final, Beat: beat}
}

// leased takes a lease round's answer: its word on the heartbeat, and on the slot.
func (w *walSource) leased(st outboxdriver.LeaseState, started time.Time) {
	w.beatWritten(st, started)
	w.slotLeased(st)
}

// beatWritten takes a lease round's word on the heartbeat it was asked to write; the
// round started at started.
func (w *walSource) beatWritten(st outboxdriver.LeaseState, started time.Time) {
	switch {
	case st.SlotBeat:
		w.beatNext = started.Add(w.cfg.Heartbeat)
		if w.beatOwed.IsZero() {
			w.beatOwed = started
		}
		w.beatErred = false
	case st.SlotBeatErr != nil:
		w.beatNext = started.Add(w.cfg.Heartbeat)
		if !w.beatErred {
			w.log.Warn("writing the WAL heartbeat failed; the stream's liveness goes unchecked", "err", st.SlotBeatErr)
			w.beatErred = true
		}
	}
}

// silentAt is when the stream counts as silent, zero while no heartbeat is owed:
// walSilentBeats intervals (doubled per reopening for silence) after both the oldest
// heartbeat owed and the last thing the stream delivered. While the loop holds the
// stream back, the silence is its own doing and does not count (arrivals).
func (w *walSource) silentAt() time.Time {
	if !w.live || w.beatOwed.IsZero() || w.cfg.Heartbeat <= 0 {
		return time.Time{}
	}
	allow := walSilentBeats * w.cfg.Heartbeat << min(w.silences, walSilentMaxDoublings)
	last := w.beatOwed
	if w.heardAt.After(last) {
		last = w.heardAt
	}
	return last.Add(allow)
}

// slotLeased takes a lease round's answer about the slot (docs/design-wal.md, §4): the
// holder of the slot reader's lease reads the slot, under its token; the other relays
// stand by, polling their shards (none while the reader streams and every live relay is
// in WAL mode). With no holder at all (the slot is not recorded: not set up, dropped,
// or the outbox lacks schema version 5) the relay tries anyway, for the error that says
// why, and polls.
func (w *walSource) slotLeased(st outboxdriver.LeaseState) {
	if st.SlotHolder != w.holder || (st.SlotToken != 0) != (w.token != 0) {
		switch {
		case st.SlotToken != 0:
			w.log.Info("this relay reads the WAL slot", "token", st.SlotToken)
		case st.SlotHolder == w.relayID: // two processes run under one ID
			w.log.Warn("another process with this relay's ID reads the WAL slot; standing by")
		case st.SlotHolder != "":
			w.log.Info("another relay reads the WAL slot; standing by", "reader", st.SlotHolder)
		}
		w.holder = st.SlotHolder
	}
	read := st.SlotToken != 0 || st.SlotHolder == ""
	if st.SlotToken == w.token && read == (w.cancel != nil) {
		return
	}
	w.stop("the slot's lease changed hands")
	w.token = st.SlotToken
	if read {
		ctx, cancel := context.WithCancel(w.ctx)
		w.gen++
		w.cancel = cancel
		w.bg.Add(1)
		go func(gen uint64, token int64) { defer w.bg.Done(); w.stream(ctx, gen, token) }(w.gen, w.token)
	}
}

// stop stops the stream goroutine, if one runs: the relay polls until it reads again.
// why, when not empty, is logged.
func (w *walSource) stop(why string) {
	if w.cancel == nil {
		return
	}
	w.cancel()
	w.cancel = nil
	if w.live {
		if why != "" {
			w.log.Info("WAL stream stopped; polling", "why", why)
		}
		w.setLive(false)
	}
}

// setLive records whether the stream is live, asks for a full fetch (what committed
// while it was not, or what polling must find from now on), and tells the observer of a
// change.
func (w *walSource) setLive(live bool) {
	w.plan.wantFull()
	w.dueStale = true
	if w.live != live {
		w.live = live
		w.observe(WALStreamEvent{Reading: live})
	}
	if live {
		w.armLog()
	} else if w.fromLog != nil {
		w.fromLog.off()
	}
}

// armLog (re)starts the log path's catch-up (walLog.arm): a full fetch, and the read of
// the rows that wait.
func (w *walSource) armLog() {
	if w.fromLog == nil {
		return
	}
	w.fromLog.arm()
	w.plan.wantFull()
	w.readWaiting()
}

// readWaiting reads the rows that wait for the latest arming, one read at a time: asked
// while a read runs, it reads again when that one answers (whose answer, for an earlier
// arming, walLog.waitsRead ignores).
func (w *walSource) readWaiting() {
	if w.reading {
		w.readAgain = true
		return
	}
	w.reading = true
	gen := w.fromLog.gen
	leases := w.leases.active()
	w.ask(func(ctx context.Context) func() {
		rows, pos, err := w.waiter.Waiting(ctx, leases, walWaitsMax)
		return func() { w.onWaiting(gen, rows, pos, err) }
	})
}

// ask runs call on a goroutine of its own, under the source's context and a 30 s bound,
// and hands what it returns to the loop (notes).
func (w *walSource) ask(call func(ctx context.Context) func()) {
	ctx := w.ctx
	w.bg.Add(1)
	go func() {
		defer w.bg.Done()
		qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		answer := call(qctx)
		select {
		case w.notes <- answer:
		case <-ctx.Done():
		}
	}()
}

// onWaiting takes the read of the rows that wait, at the log's position pos, for the
// arming gen.
func (w *walSource) onWaiting(gen uint64, rows []outboxdriver.WaitingRow, pos uint64, err error) {
	w.reading = false
	if w.readAgain {
		w.readAgain = false
		w.readWaiting()
		return // an answer for an earlier arming
	}
	switch {
	case err != nil:
		w.log.Warn("reading the messages that wait failed; publishing from the WAL stream stays off until the next safety poll", "err", err)
	case len(rows) > walWaitsMax:
		w.log.Info("too many messages wait to publish from the WAL stream; fetching every message until the next safety poll", "waiting", len(rows))
	}
	w.fromLog.waitsRead(gen, rows, pos, err == nil && len(rows) <= walWaitsMax)
}

// stream runs the stream under the slot lease token until ctx is done, opening it
// again after each failure; gen tags its news.
func (w *walSource) stream(ctx context.Context, gen uint64, token int64) {
	report := func(s walState) {
		s.gen = gen
		select {
		case w.notes <- func() { w.onState(s) }:
		case <-ctx.Done():
		}
	}
	req := outboxdriver.StreamRequest{RelayID: w.relayID, Slot: w.cfg.Slot, Publication: w.cfg.Publication, Token: token, Acks: w.acks,
		Rows: w.rowsWanted()}
	record := func(state outboxdriver.StreamState, reason outboxdriver.StreamReason) {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := w.st.RecordStreamState(rctx, req, state, reason); err != nil && ctx.Err() == nil {
			w.log.Warn("recording the WAL stream's state failed", "state", string(state), "err", err)
		}
	}
	var failingSince time.Time
	fails := 0
	for ctx.Err() == nil {
		req.Started = func() {
			failingSince, fails = time.Time{}, 0
			report(walState{live: true})
			record(outboxdriver.StreamStreaming, "")
		}
		err := w.st.Stream(ctx, req,
			func(b outboxdriver.StreamBatch) {
				select {
				case w.arrived <- func() { w.onBatch(b) }:
				case <-ctx.Done():
				}
			})
		if ctx.Err() != nil {
			return
		}
		reason := outboxdriver.StreamReasonOf(err)
		ok, tried := w.recreateSlot(ctx, req, reason, err, report)
		if ok {
			continue
		}
		fails++
		if failingSince.IsZero() {
			failingSince = time.Now()
		}
		var d time.Duration
		s := walState{reason: reason, err: err}
		switch reason {
		case outboxdriver.StreamTransient:
			d = backoff(min(fails, 8), walRetryMin, walRetryMax)
			s.fallback = time.Since(failingSince) >= walFallbackAfter
		case outboxdriver.StreamSlotActive: // a session the lease's fence could not end still reads it
			d = backoff(min(fails, 8), walRetryMin, walRetryMax)
			s.fallback = true
		case outboxdriver.StreamSlotMissing, outboxdriver.StreamSlotLost:
			d = backoff(min(fails, 8), walBrokenMin, walBrokenMax)
			if tried { // making it anew failed (its session ended, a limit): again soon
				d = backoff(min(fails, 8), walRetryMax, walBrokenMin)
			}
			s.fallback = true
		default:
			d = backoff(min(fails, 8), walBrokenMin, walBrokenMax)
			s.fallback = true
		}
		report(s)
		if s.fallback && reason != outboxdriver.StreamSlotActive { // the reader's state stands
			record(outboxdriver.StreamFallback, reason)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
	}
}

// recreateSlot makes a lost or missing slot anew for the stream goroutine (unless
// WALConfig.KeepLostSlot): ok says the stream may start again at once, tried that it
// tried and failed. The relay polls meanwhile: creating a logical slot waits for the
// transactions open when it starts, and on a busy server for the next snapshot of
// running transactions the server logs (up to 15 s).
func (w *walSource) recreateSlot(ctx context.Context, req outboxdriver.StreamRequest, reason outboxdriver.StreamReason, cause error, report func(walState)) (ok, tried bool) {
	rec, can := w.st.(outboxdriver.SlotRecreator)
	if !can || w.cfg.KeepLostSlot || req.Token == 0 ||
		(reason != outboxdriver.StreamSlotMissing && reason != outboxdriver.StreamSlotLost) {
		return false, false
	}
	report(walState{reason: reason, err: cause}) // not live: poll
	created, err := rec.RecreateSlot(ctx, req)
	if errors.Is(err, outboxdriver.ErrNotSlotReader) {
		return false, false // never set up, or dropped by 'outbox wal drop': as without
	}
	if err != nil {
		if ctx.Err() == nil {
			w.log.Error("making the WAL slot anew failed; polling, and trying again soon", "reason", string(reason), "err", err)
		}
		return false, true
	}
	if created {
		report(walState{recreated: true, reason: reason, err: cause})
	}
	return true, false
}

// onState takes the stream goroutine's news.
func (w *walSource) onState(s walState) {
	if s.gen != w.gen || w.cancel == nil {
		return // from a stream goroutine stopped since
	}
	switch {
	case s.recreated:
		w.log.Error("the WAL slot was lost or missing; made it anew and reading it: the relay catches up from the outbox table, losing nothing",
			"reason", string(s.reason), "err", s.err)
		w.observe(WALStreamEvent{Reading: w.live, Recreated: true})
	case s.live:
		if !w.live {
			w.log.Info("WAL stream live: publishing from the log, polling off")
		}
		w.reason = ""
		w.setLive(true)
		if w.cfg.SafetyPoll > 0 {
			w.safetyAt = time.Now().Add(w.cfg.SafetyPoll)
		}
		w.ackUntil, w.ackedAt = time.Time{}, time.Time{} // answer the server at once
		w.beatNext, w.beatOwed, w.heardAt = time.Time{}, time.Time{}, time.Now()
	case s.fallback:
		switch {
		case s.reason == w.reason && !w.live: // said already
		case s.reason == outboxdriver.StreamSlotActive:
			w.log.Warn("another session still reads the WAL slot; polling until it can be read here", "err", s.err)
		default:
			w.log.Error("WAL stream unavailable; polling until it is back", "reason", string(s.reason), "err", s.err)
		}
		w.reason = s.reason
		w.setLive(false)
	default:
		if w.live {
			w.log.Warn("WAL stream lost; polling while it is opened again", "reason", string(s.reason), "err", s.err)
		}
		w.setLive(false)
	}
}

// observe passes e to the observer if it takes WAL mode's news.
func (w *walSource) observe(e WALStreamEvent) {
	if o, ok := w.observer.(WALObserver); ok {
		o.WALStream(e)
	}
}

// onBatch takes in what committed.
func (w *walSource) onBatch(b outboxdriver.StreamBatch) {
	w.heardAt = time.Now()
	if b.Beat != 0 {
		w.beatOwed, w.silences = time.Time{}, 0
		w.observe(WALStreamEvent{Reading: w.live, Beat: w.heardAt})
	}
	if w.fromLog != nil && w.live {
		taken, rearm := w.fromLog.take(b, w.admit)
		if rearm {
			w.armLog()
		}
		if taken > 0 {
			w.stats.fromLog.Add(int64(taken))
			w.observe(WALStreamEvent{Reading: w.live, FromLog: taken})
		}
	}
	switch w.tracker.add(b, w.plan.at(), w.hand.has) {
	case walWantFull:
		w.plan.wantFull()
	case walWantMore:
		// Through a backlog, a continuation reads on from the cursor; in a trickle (the
		// last fetch came back short), a full fetch, which sends no key floors. (Polling
		// reads a notified trickle by a continuation with the held keys alone,
		// floors.bounds; WAL mode could do the same.)
		if w.plan.backlog() {
			w.plan.wantMore()
		} else {
			w.plan.wantFull()
		}
	}
}

// rowsWanted is StreamRequest.Rows for the log path, nil without it.
func (w *walSource) rowsWanted() func() bool {
	if w.fromLog == nil {
		return nil
	}
	return w.wholeRows.Load
}

// admit brings m, a row the log path takes, into hand as a fetched row: if the hand has
// room, m's shard is held and may be fetched, and its lane takes it.
func (w *walSource) admit(m *Message) bool {
	if w.hand.size() >= w.capacity {
		return false
	}
	token := w.leases.tokenOf(m.Shard)
	return token != 0 && w.leases.fetchable(m.Shard, token) && w.hand.streamed(m, token)
}

// arrivals is the stream's batches, or nil (the loop does not read them) while too many
// seqs are unresolved: the stream then waits, and the walsender with it.
func (w *walSource) arrivals() <-chan func() {
	if _, seqs := w.tracker.unresolved(); seqs >= walReadLimit {
		w.heardAt = time.Now() // the silence is the loop's own
		return nil
	}
	return w.arrived
}

func (w *walSource) news() <-chan func() { return w.notes }

// tick does WAL mode's work after each event of the loop: a full fetch when the hand
// dropped rows it had not recorded (nothing else would fetch them again), and the
// acknowledgement when it moved or its deadline did.
func (w *walSource) tick(now time.Time) {
	if w.fromLog != nil && w.fromLog.on() != w.logOn {
		w.logOn = !w.logOn
		w.wholeRows.Store(w.logOn || broken.Has(broken.WALTrustAll)) // the canary takes rows whenever it can
		if w.logOn {
			w.log.Debug("WAL stream: publishing fresh messages from the log")
		} else {
			w.log.Debug("WAL stream: fetching every message until the log path's catch-up")
		}
	}
	if !w.live {
		return
	}
	if d := w.hand.dropped(); d != w.drops {
		w.drops = d
		w.plan.pace()
		w.armLog() // the rows dropped are pending again, ahead of their keys' next ones
	}
	if len(w.leases.active()) == 0 && !w.hand.fetchRunning() {
		// No shard to fetch from: every row announced that is not in hand is another
		// relay's (a full fetch of no shards would return nothing).
		w.tracker.fetched(w.tracker.sent(0, nil), nil, true, w.hand.has)
	}
	if at := w.silentAt(); !at.IsZero() && !now.Before(at) {
		w.log.Warn("WAL stream silent: no heartbeat and nothing else arrived; opening it again",
			"heartbeat_owed_since", w.beatOwed, "last_heard", w.heardAt, "acknowledged", fmt.Sprintf("%X/%X", w.acked>>32, uint32(w.acked)))
		w.silences++
		w.stop("") // the next lease round opens it again
		w.observe(WALStreamEvent{Silent: true})
		return
	}
	if !w.safetyAt.IsZero() && !now.Before(w.safetyAt) && !w.hand.fetchRunning() {
		w.safetyAt = now.Add(w.cfg.SafetyPoll)
		w.safetyOut = true
		w.plan.wantFull()
		w.dueStale = true
		if w.fromLog != nil && w.fromLog.state == walLogOff {
			w.armLog()
		}
	}
	if !w.due.IsZero() && !now.Before(w.due) {
		w.due = time.Time{}
		w.plan.wantFull()
		w.dueStale = true
	}
	if !w.missAt.IsZero() && !now.Before(w.missAt) {
		w.missAt = time.Time{}
		w.plan.wantFull()
	}
	ack, until := w.tracker.ackable(), w.leases.deadline()
	w.ackAt = time.Time{}
	if ack == w.acked && !until.After(w.ackUntil) {
		return
	}
	if !now.Before(until) {
		return // the leases lapsed locally: vouch for nothing
	}
	if next := w.ackedAt.Add(walAckEvery); now.Before(next) {
		w.ackAt = next
		return
	}
	select { // keep only the latest
	case <-w.acks:
	default:
	}
	w.acks <- outboxdriver.StreamAck{LSN: ack, Until: until}
	w.acked, w.ackUntil, w.ackedAt = ack, until, now
}

// wakeAt is when the loop must wake for WAL mode: a waiting row coming due, a safety
// poll, a quick look for rows a fetch missed, an acknowledgement held back, the stream
// turning silent.
func (w *walSource) wakeAt() time.Time {
	if !w.live {
		return time.Time{}
	}
	return earliest(w.due, w.safetyAt, w.missAt, w.ackAt, w.silentAt())
}

// fetch records a fetch being sent, for the tracker, and returns it: with its snapshot
// when the tracker needs it (a full fetch while live, on a store that can say).
func (w *walSource) fetch(req *outboxdriver.FetchRequest) fetchRun {
	safety := w.safetyOut && req.After == 0
	w.safetyOut = false
	f := w.tracker.sent(req.After, req.Exclude)
	if w.fromLog != nil {
		w.fromLog.fetchSent(req.After == 0)
	}
	snap := w.live && w.snap != nil && req.After == 0
	return func(ctx context.Context) ([]*Message, func(fetchResult), error) {
		var msgs []*Message
		var err error
		if snap {
			var s outboxdriver.Snapshot
			msgs, s, err = w.snap.FetchSnapshot(ctx, *req)
			f.snap = &s
		} else {
			msgs, err = w.store.Fetch(ctx, *req)
		}
		return msgs, func(res fetchResult) { w.fetched(f, safety, res) }, err
	}
}

// fetched takes in a fetch's answer, sent as f, after the hand took its rows.
func (w *walSource) fetched(f walFetch, safety bool, res fetchResult) {
	short := len(res.fetched) < res.req.Limit
	full := res.req.After == 0
	// A continuation resolves nothing: it only says that a full fetch is wanted, which
	// is already asked for when paced is set. (Through a backlog the tracker holds tens
	// of thousands of seqs, and looking through them after every continuation was most
	// of the loop's time.)
	if !full && w.plan.pacing() {
		if w.fromLog != nil {
			w.fromLog.fetched(res.fetched, false)
		}
		return
	}
	again := w.tracker.fetched(f, res.fetched, short, w.hand.has)
	if w.fromLog != nil {
		w.fromLog.fetched(res.fetched, full && short && !again)
	}
	if again {
		w.plan.pace()
		// Quick looks are for commits a full fetch's snapshot saw running; what a
		// continuation skipped waits for the paced full fetch.
		if full && w.live && w.misses < walMissLooks && w.missAt.IsZero() {
			if w.misses == 0 {
				w.plan.wantFull()
			} else {
				w.missAt = time.Now().Add(walMissDelay << (w.misses - 1))
			}
			w.misses++
		}
	} else {
		w.misses = 0
	}
	if safety && len(res.fetched) > 0 && w.live {
		w.log.Warn("WAL safety poll found messages the stream had not announced", "messages", len(res.fetched))
	}
	// The next due row changes only when a row starts waiting or one comes due: a row
	// this fetch handed to polling (a delayed message, or one behind a waiting row), a
	// failure recorded, shards gained, the stream going live, the known due time come.
	if w.live && full && short && (w.dueStale || w.handed != w.tracker.handed) {
		w.dueStale, w.handed = false, w.tracker.handed
		w.nextDue(res.req.Leases)
	}
}

// nextDue asks the store when the next waiting row of leases comes due: nothing in the
// stream says so.
func (w *walSource) nextDue(leases []outboxdriver.Lease) {
	if w.dueBusy {
		w.dueAgain = true
		return
	}
	w.dueBusy = true
	w.ask(func(ctx context.Context) func() {
		at, err := w.st.NextDue(ctx, leases)
		return func() { w.onDue(at, err) }
	})
}

// onDue takes NextDue's answer: when the next waiting row comes due (zero: none).
func (w *walSource) onDue(at time.Time, err error) {
	w.dueBusy = false
	switch {
	case err != nil:
		w.log.Error("finding the next due message failed; polling once", "err", err)
		w.due = time.Now().Add(w.pollInterval)
	default:
		w.due = at
	}
	if w.dueAgain {
		w.dueAgain = false
		w.nextDue(w.leases.active())
	}
}

// recorded takes what a record left. Rows left waiting in the table: a full fetch soon,
// after which the relay asks when the next one comes due (without it a message whose
// destination was unavailable would wait for the next commit, or the safety poll), and
// the log path leaves their keys to the fetch path, or starts its catch-up again
// (walLog.failed). Rows published: the log path leaves no wait for them when the stream
// announces them late.
func (w *walSource) recorded(published []int64, waiting []outboxdriver.WaitingRow) {
	if w.fromLog != nil { // also while polling: the stream, once live, may announce them
		w.fromLog.published(published)
	}
	if len(waiting) == 0 {
		return
	}
	w.dueStale = true
	w.plan.pace()
	if w.fromLog != nil && w.fromLog.failed(waiting) {
		w.armLog()
	}
}

// gained records that the next due row may have changed (the new shards' waiting rows):
// the next short full fetch asks the store (NextDue).
func (w *walSource) gained() {
	w.dueStale = true
	if w.live {
		w.armLog() // the new shards' rows that wait, and their backlog
	}
}

// settler returns what records outcomes recorded (or dropped) for the tracker, for a
// record being sent now.
func (w *walSource) settler() func(seq int64) {
	gen := w.tracker.gen
	return func(seq int64) {
		if w.tracker.settled(seq, gen) {
			w.plan.pace()
		}
		if w.fromLog != nil {
			w.fromLog.settled(seq)
		}
	}
}

// earliest returns the earliest of ts that is not zero, or zero.
func earliest(ts ...time.Time) time.Time {
	var e time.Time
	for _, t := range ts {
		if !t.IsZero() && (e.IsZero() || t.Before(e)) {
			e = t
		}
	}
	return e
}
