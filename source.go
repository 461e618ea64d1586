package outbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// A fetchSource tells the relay's loop when there is something to fetch, beyond the
// loop's own reasons (a backlog, a lease change, a recorded failure): polls and the
// writers' notifications (pollSource), or the database's log (walSource, walmode.go).
// The loop calls it at fixed points and never asks which one it is. Only the loop's
// goroutine calls its methods; its own goroutines reach the loop through the two
// channels.
type fetchSource interface {
	// start begins the source's work under ctx, the loop's background context; bg
	// counts the goroutines it starts.
	start(ctx context.Context, bg *sync.WaitGroup)
	// polling reports whether polls and write notifications start fetches.
	polling() bool
	// arrivals is what the source read, for the loop to run; nil while the source holds
	// it back (the loop has too much of it to resolve) or has none.
	arrivals() <-chan func()
	// news is the state of the source's goroutines, for the loop to run; never held back.
	news() <-chan func()
	// tick does the source's work after each event of the loop.
	tick(now time.Time)
	// wakeAt is when the loop must wake for the source; zero: never.
	wakeAt() time.Time

	// leaseRequest adds the source's part to a lease round starting at started.
	leaseRequest(req *outboxdriver.LeaseRequest, final bool, started time.Time)
	// leased takes the answer of a lease round that started at started.
	leased(st outboxdriver.LeaseState, started time.Time)
	// gained records shards gained.
	gained()
	// recorded takes what a record of outcomes left: the seqs published (gone from the
	// table), and the rows recorded failures left waiting in the table, with the rows of
	// their keys the hand let go of with them.
	recorded(published []int64, waiting []outboxdriver.WaitingRow)

	// fetch returns the fetch to run for req, which the loop sends now.
	fetch(req *outboxdriver.FetchRequest) fetchRun
	// settler returns what to call for each outcome of a record being sent now, once it
	// is recorded or dropped.
	settler() func(seq int64)

	// stop stops what the source reads (WAL mode's stream) until a lease round makes it
	// read again; why, when not empty, is logged. The loop calls it when it has drained.
	stop(why string)
}

// checkSource says why store cannot give config's fetch source, if it cannot.
func checkSource(store outboxdriver.Store, config RelayConfig) error {
	if _, ok := store.(outboxdriver.Streamer); config.WAL != nil && !ok {
		return &ConfigError{Field: "WAL", Reason: fmt.Sprintf("WAL mode needs a store that can follow the database's log (outboxpgx); %T cannot", store)}
	}
	return nil
}

// newFetchSource returns the fetch source the relay of loop l is configured for.
func newFetchSource(l *loop) fetchSource {
	if l.cfg.WAL != nil {
		return newWALSource(*l.cfg.WAL, l.r.store.(outboxdriver.Streamer), l)
	}
	return pollSource{store: l.r.store}
}

// A fetchRun runs a fetch on a goroutine of its own. done, when not nil, is called on the
// loop's goroutine with the result, after the hand took the rows.
type fetchRun func(ctx context.Context) (msgs []*Message, done func(fetchResult), err error)

// pollSource is the fetch source of polling: the loop's poll ticker and the writers'
// notifications start fetches, and there is nothing else to track.
type pollSource struct {
	store outboxdriver.Store
}

func (pollSource) start(context.Context, *sync.WaitGroup)      {}
func (pollSource) polling() bool                               { return true }
func (pollSource) arrivals() <-chan func()                     { return nil }
func (pollSource) news() <-chan func()                         { return nil }
func (pollSource) tick(time.Time)                              {}
func (pollSource) wakeAt() time.Time                           { return time.Time{} }
func (pollSource) gained()                                     {}
func (pollSource) recorded([]int64, []outboxdriver.WaitingRow) {}
func (pollSource) settler() func(seq int64)                    { return func(int64) {} }
func (pollSource) stop(string)                                 {}

func (pollSource) leaseRequest(*outboxdriver.LeaseRequest, bool, time.Time) {}
func (pollSource) leased(outboxdriver.LeaseState, time.Time)                {}

func (s pollSource) fetch(req *outboxdriver.FetchRequest) fetchRun {
	return func(ctx context.Context) ([]*Message, func(fetchResult), error) {
		msgs, err := s.store.Fetch(ctx, *req)
		return msgs, nil, err
	}
}
