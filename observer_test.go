package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxtest"
)

// recorder is an Observer that counts what it is told.
type recorder struct {
	outbox.NopObserver
	mu                                sync.Mutex
	running                           []bool
	fetched, confirmed, outages       int
	rejected, dead                    int
	recPublished, recRetried, recDead int
	gained                            int
}

func (r *recorder) Running(e outbox.RunningEvent) {
	r.mu.Lock()
	r.running = append(r.running, e.Running)
	r.mu.Unlock()
}
func (r *recorder) FetchDone(e outbox.FetchEvent) {
	r.mu.Lock()
	r.fetched += e.Messages
	r.mu.Unlock()
}
func (r *recorder) PublishDone(e outbox.PublishEvent) {
	errs := e.Errs
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range e.Batch {
		switch {
		case errs == nil || errs[i] == nil:
			r.confirmed++
		case outbox.IsOutage(errs[i]):
			r.outages++
		}
	}
}
func (r *recorder) Rejected(e outbox.RejectEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rejected++
	if e.Dead {
		r.dead++
	}
}
func (r *recorder) RecordDone(e outbox.RecordEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recPublished += e.Published
	r.recRetried += e.Retried
	r.recDead += e.Dead
}
func (r *recorder) LeasesChanged(e outbox.LeaseEvent) {
	r.mu.Lock()
	r.gained += len(e.Gained)
	r.mu.Unlock()
}

// TestRelayObserver: the observer hears every publish, rejection, recording and lease
// change of a relay that publishes 20 messages, one of them poison.
func TestRelayObserver(t *testing.T) {
	db := testdb.Migrated(t)
	var msgs []outbox.Message
	for i := range 20 {
		msgs = append(msgs, outbox.Message{Topic: "t", Key: string(rune('a' + i)), Payload: []byte(`{}`)})
	}
	msgs[3].EventType = "poison"
	db.Write(t, msgs...)
	pub := &outboxtest.Publisher{Fail: func(m *outbox.Message) error {
		if m.EventType == "poison" {
			return errors.New("refused")
		}
		return nil
	}}
	rec := &recorder{}
	r, err := outbox.NewRelay(db.Driver, pub, outbox.RelayConfig{Observer: rec, MaxAttempts: 2,
		RetryMinDelay: 10 * time.Millisecond, RetryMaxDelay: 20 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(testenv.Context(t)) }) // on a failure below; stopping twice is safe
	testenv.Await(t, "19 published and 1 dead letter", func() (any, bool) {
		s := r.Stats()
		return fmt.Sprintf("published %d, rejected %d, dead %d", s.Published, s.Rejected, s.DeadLettered), s.Published >= 19 && s.DeadLettered >= 1
	})
	if err := r.Stop(testenv.Context(t)); err != nil {
		t.Fatalf("stop relay: %v", err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.confirmed != 19 || rec.rejected != 2 || rec.dead != 1 || rec.recPublished != 19 || rec.recRetried != 1 || rec.recDead != 1 {
		t.Fatalf("observer saw %+v", rec)
	}
	if rec.gained != 64 || rec.fetched < 20 || len(rec.running) != 2 || !rec.running[0] || rec.running[1] {
		t.Fatalf("observer saw gained %d, fetched %d, running %v", rec.gained, rec.fetched, rec.running)
	}
}

type orderObserver struct {
	outbox.NopObserver
	name string
	log  *[]string
}

func (o orderObserver) Paused(outbox.PauseEvent) { *o.log = append(*o.log, o.name) }

func TestMultiObserver(t *testing.T) {
	var log []string
	a, b, c := orderObserver{name: "a", log: &log}, orderObserver{name: "b", log: &log}, orderObserver{name: "c", log: &log}
	outbox.MultiObserver(a, nil, outbox.MultiObserver(b, c)).Paused(outbox.PauseEvent{Pause: time.Second})
	if got := strings.Join(log, ","); got != "a,b,c" {
		t.Fatalf("events reached %q, want a,b,c", got)
	}
	if got := outbox.MultiObserver(nil, a); got != outbox.Observer(a) {
		t.Fatalf("one observer came back as %T", got)
	}
	if _, ok := outbox.MultiObserver().(outbox.NopObserver); !ok {
		t.Fatal("no observers is not a NopObserver")
	}
}
