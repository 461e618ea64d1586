package torture

import (
	"fmt"
	"strings"
	"testing"

	"github.com/outboxkit/outbox"
)

// fixture builds hand-written histories: keys "a" and "b", each event's payload the text
// "key/seq", so checksums are predictable.
type fixture struct {
	h   History
	log DeliveryLog
	ids map[string]outbox.ID // "a1" -> id
}

func newFixture() *fixture { return &fixture{ids: map[string]outbox.ID{}} }

func (f *fixture) event(name string, poison bool) Event {
	id := outbox.NewID()
	f.ids[name] = id
	key, seq := name[:1], int64(name[1]-'0')
	return Event{ID: id, Key: key, Seq: seq, Sum: Checksum([]byte(name)), Poison: poison, Size: len(name)}
}

// txn records a transaction of the named events ("a1", "a2": key a, seqs 1 and 2); a
// name ending in "!" is poison.
func (f *fixture) txn(o Outcome, names ...string) {
	t := Txn{Outcome: o}
	for _, n := range names {
		poison := strings.HasSuffix(n, "!")
		t.Events = append(t.Events, f.event(strings.TrimSuffix(n, "!"), poison))
	}
	f.h.Record(t)
}

// deliver adds copies of the named events, in broker order.
func (f *fixture) deliver(names ...string) {
	for _, n := range names {
		id, ok := f.ids[n]
		if !ok {
			panic("unknown event " + n)
		}
		f.log.Add(Delivery{ID: id, Key: n[:1], Seq: int64(n[1] - '0'), Sum: Checksum([]byte(n))})
	}
}

// clean is a run with no anomaly: two keys, a multi-event transaction, a rollback, a
// poison event dead-lettered, a duplicate within the bound.
func clean() *fixture {
	f := newFixture()
	f.txn(Committed, "a1", "a2")
	f.txn(Committed, "b1")
	f.txn(RolledBack, "a3")
	f.txn(Committed, "a4")
	f.txn(Committed, "b2!")
	f.deliver("a1", "b1", "a2", "a4", "a2")
	f.log.AddDead(f.ids["b2"], "broker refused: poison")
	return f
}

var bounds = Bounds{InFlight: 1, Faults: 1}

func TestCheckClean(t *testing.T) {
	f := clean()
	r := Check(&f.h, &f.log, bounds)
	want := Report{Events: 6, Committed: 5, RolledBack: 1, Delivered: 4, Copies: 5, Dup: 1, DupBound: 1, Dead: 1, Poison: 1, Faults: 1, Bounds: bounds}
	if !r.OK() || fmt.Sprint(r) != fmt.Sprint(want) {
		t.Fatalf("clean run:\n got %+v\nwant %+v", r, want)
	}
	if got, wantLine := r.String(), "seed=0 events=6 committed=5 faults=1 lost=0 phantom=0 order=0 dup=1 dup_bound=1 dead=1 poison=1 mismatch=0 recovery_s=0.0 rss_mib=0 result=ok"; got != wantLine {
		t.Errorf("summary line\n got %s\nwant %s", got, wantLine)
	}
	r.Label, r.Seed, r.RecoverySeconds, r.RSSMiB = "chaos nats", 42, 14.24, 143.4
	if got := r.String(); !strings.HasPrefix(got, "chaos nats seed=42 events=6 ") || !strings.Contains(got, " recovery_s=14.2 rss_mib=143 ") {
		t.Errorf("summary line with runner fields: %s", got)
	}
}

// anomalies are the counts that fail a run; dupOver is 1 when duplicates exceed the bound.
type anomalies struct{ lost, phantom, phantomAborted, order, mismatch, dupOver, deadUnexpected, poisonAlive, unresolved int }

func anomaliesOf(r Report) anomalies {
	a := anomalies{r.Lost, r.Phantom, r.PhantomAborted, r.Order, r.Mismatch, 0, r.DeadUnexpected, r.PoisonAlive, r.Unresolved}
	if !r.DupWithinBound() {
		a.dupOver = 1
	}
	return a
}

// TestCheckAnomalies breaks the clean run one way at a time and expects exactly that
// anomaly, counted once, and nothing else.
func TestCheckAnomalies(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(f *fixture)
		want   anomalies
	}{
		{"lost", func(f *fixture) {
			f.txn(Committed, "b3")
		}, anomalies{lost: 1}},
		{"phantom rolled back", func(f *fixture) {
			f.deliver("a3")
		}, anomalies{phantom: 1, phantomAborted: 1}},
		{"phantom never written", func(f *fixture) {
			f.log.Add(Delivery{ID: outbox.NewID(), Key: "a", Seq: 9, Sum: Checksum([]byte("a9"))})
		}, anomalies{phantom: 1}},
		{"order violation", func(f *fixture) {
			f.txn(Committed, "b3")
			f.txn(Committed, "b4")
			f.deliver("b4", "b3")
		}, anomalies{order: 1}},
		{"duplicate beyond the bound", func(f *fixture) {
			f.deliver("a1")
		}, anomalies{dupOver: 1}},
		{"payload mismatch", func(f *fixture) {
			f.txn(Committed, "b3")
			f.log.Add(Delivery{ID: f.ids["b3"], Key: "b", Seq: 3, Sum: Checksum([]byte("b3 truncated"))})
		}, anomalies{mismatch: 1}},
		{"poison not dead", func(f *fixture) {
			f.txn(Committed, "b3!")
			f.deliver("b3")
		}, anomalies{poisonAlive: 1}},
		{"poison neither dead nor delivered", func(f *fixture) {
			f.txn(Committed, "b3!")
		}, anomalies{poisonAlive: 1, lost: 1}},
		{"dead non-poison", func(f *fixture) {
			f.txn(Committed, "b3")
			f.log.AddDead(f.ids["b3"], "broker refused")
		}, anomalies{deadUnexpected: 1}},
		{"dead rolled back poison", func(f *fixture) {
			f.txn(RolledBack, "b3!")
			f.log.AddDead(f.ids["b3"], "broker refused")
		}, anomalies{deadUnexpected: 1}},
		{"unresolved", func(f *fixture) {
			f.txn(Unknown, "b3")
		}, anomalies{unresolved: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := clean()
			tc.break_(f)
			r := Check(&f.h, &f.log, bounds)
			if r.OK() {
				t.Fatalf("OK() = true, want the anomaly caught: %s", r)
			}
			if got := anomaliesOf(r); got != tc.want {
				t.Fatalf("anomalies %+v, want %+v\n%s", got, tc.want, r)
			}
			if len(r.Examples) == 0 {
				t.Errorf("no example line for the anomaly")
			}
			t.Log(r)
			for _, e := range r.Examples {
				t.Log("  ", e)
			}
		})
	}
}

// TestCheckLimits: recovery time and RSS, filled by the runner, fail the run past their
// limits.
func TestCheckLimits(t *testing.T) {
	f := clean()
	r := Check(&f.h, &f.log, Bounds{InFlight: 1, Faults: 1, MaxRecoverySeconds: 60, MaxRSSMiB: 256})
	r.RecoverySeconds, r.RSSMiB = 59, 255
	if !r.OK() {
		t.Fatalf("within limits: %s", r)
	}
	if r.RecoverySeconds = 61; r.OK() {
		t.Fatalf("recovery over the limit passed: %s", r)
	}
	if r.RecoverySeconds, r.RSSMiB = 59, 257; r.OK() {
		t.Fatalf("RSS over the limit passed: %s", r)
	}
}

// TestCheckDuplicateWithinBound: a later copy of an already delivered event, after
// higher seqs of its key, is a duplicate and not an order violation.
func TestCheckDuplicateWithinBound(t *testing.T) {
	f := clean()
	f.deliver("a1", "a4")
	r := Check(&f.h, &f.log, Bounds{InFlight: 3, Faults: 1})
	if !r.OK() || r.Dup != 3 || r.DupBound != 3 || r.Order != 0 {
		t.Fatalf("got %s", r)
	}
}

// TestCheckOrderCountsEachLateEvent: a1 a4 a2 counts a2 once, and a seq equal to one
// already delivered (two events claiming the same seq) is a violation too.
func TestCheckOrderCountsEachLateEvent(t *testing.T) {
	f := newFixture()
	f.txn(Committed, "a1", "a2", "a3", "a4")
	f.deliver("a1", "a4", "a2", "a3")
	if r := Check(&f.h, &f.log, Bounds{}); r.Order != 2 || r.OK() {
		t.Fatalf("got %s", r)
	}
}

func TestParseDelivery(t *testing.T) {
	id := outbox.NewID()
	body := []byte(`{"id":"` + id.String() + `","key":"agg-1","seq":7,"filler":"xyz"}`)
	d, err := ParseDelivery(map[string]string{outbox.HeaderID: id.String(), outbox.HeaderKey: "agg-1"}, body)
	if err != nil || d.ID != id || d.Key != "agg-1" || d.Seq != 7 || d.Sum != Checksum(body) {
		t.Fatalf("got %+v, %v", d, err)
	}
	// Truncated payload, no headers: the id is lost with the JSON, so it is an error.
	if _, err := ParseDelivery(nil, body[:20]); err == nil {
		t.Fatal("no id anywhere: want an error")
	}
	// Truncated payload with headers: a delivery whose checksum will not match.
	d, err = ParseDelivery(map[string]string{outbox.HeaderID: id.String()}, body[:20])
	if err != nil || d.ID != id || d.Sum == Checksum(body) {
		t.Fatalf("truncated: got %+v, %v", d, err)
	}
}
