package outbox

import "time"

// Observer receives what a relay does, for metrics and tracing (outboxprom and
// outboxotel implement it; root stays free of their dependencies). The relay calls it
// from its loop goroutine, one call at a time: methods must return quickly and must not
// call back into the relay. Embed NopObserver to implement only some methods.
type Observer interface {
	// Running reports that the relay started (true) or stopped (false).
	Running(relayID string, running bool)
	// FetchDone reports one fetch: the messages it returned, how long it took, and its
	// error.
	FetchDone(n int, took time.Duration, err error)
	// PublishDone reports one Publisher.Publish call: the batch, its per-message errors
	// (nil when all were confirmed; an entry wrapped with Outage is an outage), when the
	// call started and how long it took. The messages must not be retained.
	PublishDone(batch []*Message, errs []error, start time.Time, took time.Duration)
	// Rejected reports a message the broker refused: the attempt it was (1 for the
	// first), and whether it is dead-lettered (the attempt limit was reached) or will be
	// retried.
	Rejected(m *Message, err error, attempt int, dead bool)
	// RecordDone reports one recording of outcomes: how many were published, retried and
	// dead-lettered, how many the store refused because the relay's lease had moved on
	// (fenced), how long it took, and its error.
	RecordDone(published, retried, dead, refused int, took time.Duration, err error)
	// LeasesChanged reports a lease round that changed the relay's shards: how many it
	// holds now, the shards gained and lost, and the live relays.
	LeasesChanged(held int, gained, lost []int, live int)
	// Paused reports a pause of sending after a broker outage.
	Paused(pause time.Duration)
}

// NopObserver implements Observer with methods that do nothing.
type NopObserver struct{}

func (NopObserver) Running(string, bool)                                      {}
func (NopObserver) FetchDone(int, time.Duration, error)                       {}
func (NopObserver) PublishDone([]*Message, []error, time.Time, time.Duration) {}
func (NopObserver) Rejected(*Message, error, int, bool)                       {}
func (NopObserver) RecordDone(int, int, int, int, time.Duration, error)       {}
func (NopObserver) LeasesChanged(int, []int, []int, int)                      {}
func (NopObserver) Paused(time.Duration)                                      {}

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

func (m multiObserver) Running(relayID string, running bool) {
	for _, o := range m {
		o.Running(relayID, running)
	}
}

func (m multiObserver) FetchDone(n int, took time.Duration, err error) {
	for _, o := range m {
		o.FetchDone(n, took, err)
	}
}

func (m multiObserver) PublishDone(batch []*Message, errs []error, start time.Time, took time.Duration) {
	for _, o := range m {
		o.PublishDone(batch, errs, start, took)
	}
}

func (m multiObserver) Rejected(msg *Message, err error, attempt int, dead bool) {
	for _, o := range m {
		o.Rejected(msg, err, attempt, dead)
	}
}

func (m multiObserver) RecordDone(published, retried, dead, refused int, took time.Duration, err error) {
	for _, o := range m {
		o.RecordDone(published, retried, dead, refused, took, err)
	}
}

func (m multiObserver) LeasesChanged(held int, gained, lost []int, live int) {
	for _, o := range m {
		o.LeasesChanged(held, gained, lost, live)
	}
}

func (m multiObserver) Paused(pause time.Duration) {
	for _, o := range m {
		o.Paused(pause)
	}
}
