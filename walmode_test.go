package outbox

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// WAL mode's timing rules, run against its source alone on synctest's clock: the
// heartbeat's silence, the acknowledgement's pace, the quick looks after a fetch that
// missed announced rows, and waiting rows coming due. The same rules against a
// logical-decoding PostgreSQL are in outboxpgx's TestWALRelay.

// fakeStreamer streams nothing: each Stream call goes live at once and lasts until its
// context ends.
type fakeStreamer struct {
	end     chan error // a value sent ends the running Stream call with it
	mu      sync.Mutex
	streams int       // Stream calls so far
	due     time.Time // NextDue's answer
	dues    int       // NextDue calls so far
}

func (s *fakeStreamer) Stream(ctx context.Context, req outboxdriver.StreamRequest, emit func(outboxdriver.StreamBatch)) error {
	s.mu.Lock()
	s.streams++
	s.mu.Unlock()
	req.Started()
	select {
	case <-ctx.Done():
		return nil
	case err := <-s.end:
		return err
	}
}

func (s *fakeStreamer) NextDue(context.Context, []outboxdriver.Lease) (time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dues++
	return s.due, nil
}

func (s *fakeStreamer) RecordStreamState(context.Context, outboxdriver.StreamRequest, outboxdriver.StreamState, outboxdriver.StreamReason) error {
	return nil
}

func (s *fakeStreamer) counts() (streams, dues int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams, s.dues
}

// walEvents records WAL mode's news to the observer.
type walEvents struct {
	NopObserver
	events []WALStreamEvent
}

func (o *walEvents) WALStream(e WALStreamEvent) { o.events = append(o.events, e) }

// walHarness runs a walSource as the loop does, on the test's goroutine.
type walHarness struct {
	t      *testing.T
	w      *walSource
	st     *fakeStreamer
	obs    *walEvents
	plan   *fetchPlan
	leases *leaseBook
	bg     sync.WaitGroup
}

// newWALHarness returns a source that reads the slot, live, holding shard 0 and a
// sending deadline a lease TTL away. Call it inside a synctest bubble.
func newWALHarness(t *testing.T, cfg WALConfig) *walHarness {
	h := &walHarness{t: t, st: &fakeStreamer{end: make(chan error)}, obs: &walEvents{}}
	l := &loop{r: &Relay{}, cfg: RelayConfig{ID: "r1", PollInterval: time.Second, Observer: h.obs},
		log: slog.New(slog.DiscardHandler), hand: newHand(), leases: newLeaseBook(30 * time.Second)}
	h.w = newWALSource(cfg, h.st, l)
	h.plan, h.leases = &l.fetch, l.leases
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); h.bg.Wait() })
	h.w.start(ctx, &h.bg)
	h.leases.apply(outboxdriver.LeaseState{Held: []outboxdriver.Lease{{Shard: 0, Token: 1}}}, time.Now())
	h.w.leased(outboxdriver.LeaseState{SlotToken: 7, SlotHolder: "r1"}, time.Now())
	h.settle()
	if !h.w.live {
		t.Fatal("the stream did not go live")
	}
	return h
}

// settle lets the source's goroutines run until they block, and runs what they sent.
func (h *walHarness) settle() {
	for {
		synctest.Wait()
		select {
		case f := <-h.w.news():
			f()
		case f := <-h.w.arrivals():
			f()
		default:
			h.w.tick(time.Now())
			return
		}
	}
}

// leaseRound runs a lease round that writes the heartbeat when asked to.
func (h *walHarness) leaseRound() (beat bool) {
	started := time.Now()
	var req outboxdriver.LeaseRequest
	h.w.leaseRequest(&req, false, started)
	beat = req.Slot != nil && req.Slot.Beat
	h.leases.apply(outboxdriver.LeaseState{Held: []outboxdriver.Lease{{Shard: 0, Token: 1}}}, started)
	h.w.leased(outboxdriver.LeaseState{SlotToken: 7, SlotHolder: "r1", SlotBeat: beat}, started)
	return beat
}

// snapshotter answers full fetches with no rows, in a snapshot that saw transaction 1
// still running or not.
type snapshotter struct{ running bool }

func (s snapshotter) FetchSnapshot(context.Context, outboxdriver.FetchRequest) ([]*Message, outboxdriver.Snapshot, error) {
	if s.running {
		return nil, outboxdriver.Snapshot{Xmin: 1, Xmax: 1}, nil
	}
	return nil, outboxdriver.Snapshot{Xmin: 100, Xmax: 100}, nil
}

// fullFetch runs a full fetch through the source, as the loop does, that returns no rows
// in a snapshot that saw transaction 1 running (or not).
func (h *walHarness) fullFetch(running bool) {
	h.t.Helper()
	h.w.snap = snapshotter{running: running}
	req := &outboxdriver.FetchRequest{Limit: 10, Leases: h.leases.active()}
	msgs, done, err := h.w.fetch(req)(context.Background())
	if err != nil || done == nil {
		h.t.Fatalf("fetch: err %v, done %v", err, done != nil)
	}
	done(fetchResult{req: req, fetched: msgs})
	h.settle()
}

// sleepTo sleeps until the source's wakeAt, which must be set, then settles.
func (h *walHarness) sleepTo() time.Time {
	h.t.Helper()
	at := h.w.wakeAt()
	if at.IsZero() {
		h.t.Fatal("wakeAt is zero: the source would never wake the loop")
	}
	time.Sleep(time.Until(at))
	h.settle()
	return at
}

func TestWALSourceSilentStreamReopens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newWALHarness(t, WALConfig{Heartbeat: 10 * time.Second})
		if !h.leaseRound() {
			t.Fatal("the first lease round while live did not ask for a heartbeat")
		}
		owed := time.Now()
		if h.leaseRound() {
			t.Fatal("a heartbeat was asked for before Heartbeat had passed")
		}
		// Nothing arrives: silent three intervals after the heartbeat owed.
		at := h.sleepTo()
		if want := owed.Add(3 * 10 * time.Second); !at.Equal(want) {
			t.Fatalf("woke at +%v, want +%v", at.Sub(owed), want.Sub(owed))
		}
		if h.w.live || h.w.cancel != nil {
			t.Fatalf("after silence: live %v, stream running %v; want the stream stopped", h.w.live, h.w.cancel != nil)
		}
		if !h.plan.want {
			t.Error("polling after the stream stopped did not start with a full fetch")
		}
		if last := h.obs.events[len(h.obs.events)-1]; !last.Silent {
			t.Errorf("the observer's last WAL event is %+v, want Silent", last)
		}
		// The next lease round opens it again; the next silence is allowed twice as long.
		h.leaseRound()
		h.settle()
		if streams, _ := h.st.counts(); streams != 2 || !h.w.live {
			t.Fatalf("after the next lease round: %d streams, live %v; want 2 and live", streams, h.w.live)
		}
		h.leaseRound()
		owed = time.Now()
		if at := h.w.wakeAt(); !at.Equal(owed.Add(2 * 3 * 10 * time.Second)) {
			t.Fatalf("second silence allowed until +%v, want +60s", at.Sub(owed))
		}
		// A heartbeat seen in time clears the debt and the doubling.
		time.Sleep(5 * time.Second)
		h.w.onBatch(outboxdriver.StreamBatch{Beat: 1, Idle: 1})
		h.settle()
		if !h.w.silentAt().IsZero() || h.w.silences != 0 {
			t.Fatalf("after a heartbeat: silent at %v, silences %d; want none", h.w.silentAt(), h.w.silences)
		}
	})
}

func TestWALSourceAcksPaced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newWALHarness(t, WALConfig{Heartbeat: -1})
		ack := func() (outboxdriver.StreamAck, bool) {
			select {
			case a := <-h.w.acks:
				return a, true
			default:
				return outboxdriver.StreamAck{}, false
			}
		}
		// Going live answers the server at once.
		if a, ok := ack(); !ok || a.LSN != 0 || !a.Until.Equal(h.leases.deadline()) {
			t.Fatalf("ack on going live %+v (sent %v), want LSN 0 until the leases' deadline", a, ok)
		}
		sent := time.Now()
		h.w.onBatch(outboxdriver.StreamBatch{Idle: 100})
		h.settle()
		if a, ok := ack(); ok {
			t.Fatalf("an ack went %v after the last one: %+v; want none before walAckEvery", time.Since(sent), a)
		}
		if at := h.sleepTo(); !at.Equal(sent.Add(walAckEvery)) {
			t.Fatalf("woke %v after the last ack, want walAckEvery (%v)", at.Sub(sent), walAckEvery)
		}
		if a, ok := ack(); !ok || a.LSN != 100 {
			t.Fatalf("ack after walAckEvery %+v (sent %v), want LSN 100", a, ok)
		}
		// Nothing new: nothing sent, nothing to wake for.
		h.settle()
		if a, ok := ack(); ok || !h.w.wakeAt().IsZero() {
			t.Fatalf("with nothing new: ack %+v (sent %v), wake at %v; want neither", a, ok, h.w.wakeAt())
		}
		// Past the sending deadline the relay vouches for nothing.
		time.Sleep(time.Until(h.leases.deadline()))
		h.w.onBatch(outboxdriver.StreamBatch{Idle: 300})
		h.settle()
		if a, ok := ack(); ok {
			t.Fatalf("ack %+v sent after the leases lapsed", a)
		}
	})
}

func TestWALSourceQuickLooksAfterAMiss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newWALHarness(t, WALConfig{Heartbeat: -1})
		h.w.onBatch(outboxdriver.StreamBatch{Txns: []outboxdriver.StreamTxn{{End: 100, Xid: 1, Seqs: []int64{5}}}})
		h.settle()
		// Full fetches that come back short without seq 5 (its commit is not yet
		// visible): the first look again goes at once, then after 1, 2, 4, 8 ms, then
		// only the paced full fetch.
		var gaps []time.Duration
		for range walMissLooks + 2 {
			h.plan.want = false
			start := time.Now()
			h.fullFetch(true)
			if h.plan.want {
				gaps = append(gaps, 0)
				continue
			}
			if h.w.wakeAt().IsZero() {
				break
			}
			h.sleepTo()
			if !h.plan.want {
				t.Fatal("a quick look came due without asking for a full fetch")
			}
			gaps = append(gaps, time.Since(start))
		}
		want := []time.Duration{0, time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond, 8 * time.Millisecond, 16 * time.Millisecond}
		if len(gaps) != len(want) {
			t.Fatalf("looks after a miss at %v, want %v", gaps, want)
		}
		for i := range want {
			if gaps[i] != want[i] {
				t.Fatalf("looks after a miss at %v, want %v", gaps, want)
			}
		}
		if !h.plan.paced {
			t.Error("after the quick looks, no paced full fetch is asked for")
		}
	})
}

func TestWALSourceWaitingRowsComeDue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newWALHarness(t, WALConfig{Heartbeat: -1})
		start := time.Now()
		h.st.mu.Lock()
		h.st.due = start.Add(5 * time.Second)
		h.st.mu.Unlock()
		// Going live made the next due row stale: the first short full fetch asks.
		h.fullFetch(false)
		if _, dues := h.st.counts(); dues != 1 {
			t.Fatalf("NextDue called %d times after a short full fetch, want 1", dues)
		}
		// Nothing changed: the next short full fetch does not ask again.
		h.fullFetch(false)
		if _, dues := h.st.counts(); dues != 1 {
			t.Fatalf("NextDue called again (%d) with nothing changed", dues)
		}
		h.plan.want = false
		if at := h.sleepTo(); !at.Equal(start.Add(5 * time.Second)) {
			t.Fatalf("woke at +%v, want when the row comes due (+5s)", at.Sub(start))
		}
		if !h.plan.want || !h.w.dueStale {
			t.Fatalf("a row come due: full fetch asked %v, next due stale %v; want both", h.plan.want, h.w.dueStale)
		}
		// A failure recorded leaves a row waiting: the due time is asked again.
		h.w.recorded(nil, []outboxdriver.WaitingRow{{Seq: 1, Key: "k"}})
		h.fullFetch(false)
		if _, dues := h.st.counts(); dues != 2 {
			t.Fatalf("NextDue called %d times after a failure was recorded, want 2", dues)
		}
	})
}

func TestWALSourceFallsBackToPollingAndBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newWALHarness(t, WALConfig{Heartbeat: -1})
		if h.w.polling() {
			t.Fatal("polling while the stream is live")
		}
		for i, tc := range []struct {
			err   error
			retry time.Duration // the longest wait before the stream is opened again
		}{
			{&outboxdriver.StreamError{Reason: outboxdriver.StreamTransient, Err: errors.New("connection reset")}, walRetryMax},
			{&outboxdriver.StreamError{Reason: outboxdriver.StreamPublication, Err: errors.New("publication missing")}, walBrokenMax},
		} {
			h.plan.want = false
			h.st.end <- tc.err
			h.settle()
			if !h.w.polling() || !h.plan.want {
				t.Fatalf("after %v: polling %v, full fetch asked %v; want both", tc.err, h.w.polling(), h.plan.want)
			}
			time.Sleep(tc.retry)
			h.settle()
			if streams, _ := h.st.counts(); streams != i+2 || h.w.polling() {
				t.Fatalf("%v after %v: %d streams, polling %v; want %d and the stream live again", tc.retry, tc.err, streams, h.w.polling(), i+2)
			}
		}
	})
}
