package outbox

import "time"

// Observer receives what a relay does, for metrics and tracing (outboxprom and
// outboxotel implement it; root stays free of their dependencies). The relay calls it
// from its loop goroutine, one call at a time: methods must return quickly and must not
// call back into the relay. Embed NopObserver to implement only some methods.
//
// Each method takes one event struct, so that a field added later breaks no
// implementation.
type Observer interface {
	// Running reports that the relay started or stopped.
	Running(RunningEvent)
	// FetchDone reports one fetch.
	FetchDone(FetchEvent)
	// PublishDone reports one Publisher.Publish call.
	PublishDone(PublishEvent)
	// Rejected reports a message the broker refused.
	Rejected(RejectEvent)
	// RecordDone reports one recording of outcomes.
	RecordDone(RecordEvent)
	// LeasesChanged reports a lease round that changed the relay's shards.
	LeasesChanged(LeaseEvent)
	// Paused reports a pause of sending after a broker outage.
	Paused(PauseEvent)
}

// RunningEvent: the relay started (Running true) or stopped.
type RunningEvent struct {
	RelayID string
	Running bool
}

// FetchEvent: one fetch returned Messages messages in Took, or failed with Err.
type FetchEvent struct {
	Messages int
	Took     time.Duration
	Err      error
}

// PublishEvent: one Publisher.Publish call on Batch, started at Start and answered in
// Took. Errs holds the per-message errors (nil when all were confirmed; an entry wrapped
// with Outage is an outage). The messages must not be retained.
type PublishEvent struct {
	Batch []*Message
	Errs  []error
	Start time.Time
	Took  time.Duration
}

// RejectEvent: the broker refused Message with Err at its Attempt-th attempt (1 for the
// first); Dead says it is dead-lettered (the attempt limit was reached or the error is
// Permanent) rather than retried.
type RejectEvent struct {
	Message *Message
	Err     error
	Attempt int
	Dead    bool
	// Destination is set when the message's destination was unavailable
	// (DestinationOutage): no attempt was counted and the message waits.
	Destination string
}

// RecordEvent: one recording of outcomes, in Took: how many were Published, Retried and
// dead-lettered (Dead), how many the store Refused because the relay's lease had moved
// on (fenced), and the recording's error.
type RecordEvent struct {
	Published, Retried, Dead, Refused int
	Took                              time.Duration
	Err                               error
}

// LeaseEvent: a lease round changed the relay's shards: it holds Held now, Gained and
// Lost these shards, and Live relays run.
type LeaseEvent struct {
	Held         int
	Gained, Lost []int
	Live         int
}

// PauseEvent: sending stops for Pause after a broker outage.
type PauseEvent struct {
	Pause time.Duration
}

// WALObserver is an Observer that also takes WAL mode's news (outboxprom's Metrics does).
// A relay in WAL mode calls WALStream as it calls the Observer's methods.
type WALObserver interface {
	Observer
	WALStream(WALStreamEvent)
}

// WALStreamEvent: the relay began (Reading) or stopped reading the replication slot; a
// heartbeat it wrote into the log came back through the stream (Beat, when it arrived);
// the stream stayed silent too long and the relay opens it again (Silent); the slot
// was lost or missing and the relay made it anew (Recreated); or the relay took messages
// from the stream to publish without fetching them (FromLog, how many).
type WALStreamEvent struct {
	Reading   bool
	Beat      time.Time
	Silent    bool
	Recreated bool
	FromLog   int
}

// NopObserver implements Observer with methods that do nothing.
type NopObserver struct{}

func (NopObserver) Running(RunningEvent)     {}
func (NopObserver) FetchDone(FetchEvent)     {}
func (NopObserver) PublishDone(PublishEvent) {}
func (NopObserver) Rejected(RejectEvent)     {}
func (NopObserver) RecordDone(RecordEvent)   {}
func (NopObserver) LeasesChanged(LeaseEvent) {}
func (NopObserver) Paused(PauseEvent)        {}

var _ Observer = NopObserver{}

// MultiObserver returns an Observer that passes each event to every one of observers, in
// order, like io.MultiWriter: metrics (outboxprom) and tracing (outboxotel) at once. Nil
// entries are skipped. The observers share each call's arguments and must not modify them.
func MultiObserver(observers ...Observer) Observer {
	var all multiObserver
	for _, o := range observers {
		switch o := o.(type) {
		case nil:
		case multiObserver:
			all = append(all, o...)
		default:
			all = append(all, o)
		}
	}
	switch len(all) {
	case 0:
		return NopObserver{}
	case 1:
		return all[0]
	}
	return all
}

type multiObserver []Observer

func (m multiObserver) Running(e RunningEvent) {
	for _, o := range m {
		o.Running(e)
	}
}

func (m multiObserver) FetchDone(e FetchEvent) {
	for _, o := range m {
		o.FetchDone(e)
	}
}

func (m multiObserver) PublishDone(e PublishEvent) {
	for _, o := range m {
		o.PublishDone(e)
	}
}

func (m multiObserver) Rejected(e RejectEvent) {
	for _, o := range m {
		o.Rejected(e)
	}
}

func (m multiObserver) RecordDone(e RecordEvent) {
	for _, o := range m {
		o.RecordDone(e)
	}
}

func (m multiObserver) LeasesChanged(e LeaseEvent) {
	for _, o := range m {
		o.LeasesChanged(e)
	}
}

func (m multiObserver) Paused(e PauseEvent) {
	for _, o := range m {
		o.Paused(e)
	}
}

func (m multiObserver) WALStream(e WALStreamEvent) {
	for _, o := range m {
		if w, ok := o.(WALObserver); ok {
			w.WALStream(e)
		}
	}
}
