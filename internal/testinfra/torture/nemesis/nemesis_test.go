package nemesis

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRoundsHealAndLog: every kind is injected within the first round, every held fault
// is healed (also the one a Stop interrupts), failed injections are not counted, and
// every fault is logged as a JSON line.
func TestRoundsHealAndLog(t *testing.T) {
	var active atomic.Int32
	held := func(kind string) Fault {
		return Fault{Kind: kind, MinHold: 5 * time.Millisecond, MaxHold: 20 * time.Millisecond,
			Inject: func(rnd *rand.Rand) (string, func() error, error) {
				if active.Add(1) != 1 {
					t.Errorf("%s injected while another fault is active", kind)
				}
				return "target-" + kind, func() error { active.Add(-1); return nil }, nil
			}}
	}
	var instant atomic.Int32
	faults := []Fault{held("a"), held("b"), held("c"),
		{Kind: "instant", Inject: func(*rand.Rand) (string, func() error, error) { instant.Add(1); return "x", nil, nil }},
		{Kind: "broken", Inject: func(*rand.Rand) (string, func() error, error) { return "y", nil, errors.New("no target") }},
	}
	var log testenv.Buffer
	var lines atomic.Int32
	n := Start(Config{Seed: 7, Faults: faults, MinGap: time.Millisecond, MaxGap: 3 * time.Millisecond, Log: &log,
		Logf: func(string, ...any) { lines.Add(1) }})
	testenv.AwaitChan(t, "a full round of every kind", n.RoundDone(), func() any { return n.Kinds() })
	time.Sleep(30 * time.Millisecond) // a chance for a fault to be in progress, so that Stop cuts a hold short
	n.Stop()
	n.Stop()
	if a := active.Load(); a != 0 {
		t.Fatalf("%d faults left unhealed after Stop", a)
	}
	kinds := n.Kinds()
	for _, k := range []string{"a", "b", "c", "instant"} {
		if kinds[k] == 0 {
			t.Errorf("kind %s never injected in the first round: %v", k, kinds)
		}
	}
	if kinds["broken"] != 0 {
		t.Errorf("a failed injection was counted: %v", kinds)
	}
	recs := n.Records()
	if n.Count() != len(recs)-strings.Count(log.String(), `"err"`) {
		t.Errorf("Count %d does not match the records without error", n.Count())
	}
	if got := int(lines.Load()); got != len(recs) {
		t.Errorf("%d log lines for %d records", got, len(recs))
	}
	dec := json.NewDecoder(strings.NewReader(log.String()))
	for i := range recs {
		var r Record
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("JSON line %d: %v", i, err)
		}
		if r.Kind != recs[i].Kind || r.End.Before(r.Start) {
			t.Errorf("JSON line %d = %+v, record %+v", i, r, recs[i])
		}
	}
	var last time.Time
	for _, r := range recs {
		if r.Err == "" && r.End.After(last) {
			last = r.End
		}
	}
	if !n.LastHealed().Equal(last) {
		t.Errorf("LastHealed %v, want %v", n.LastHealed(), last)
	}
}

// TestSeedReplaysKinds: the same seed draws the same sequence of kinds.
func TestSeedReplaysKinds(t *testing.T) {
	seq := func() []string {
		var got []string
		var mu sync.Mutex
		done := make(chan struct{})
		var faults []Fault
		for _, k := range []string{"a", "b", "c", "d"} {
			faults = append(faults, Fault{Kind: k, Inject: func(*rand.Rand) (string, func() error, error) {
				mu.Lock()
				defer mu.Unlock()
				got = append(got, k)
				if len(got) == 12 {
					close(done)
				}
				return k, nil, nil
			}})
		}
		n := Start(Config{Seed: 42, Faults: faults})
		testenv.AwaitChan(t, "12 faults injected", done, func() any { return n.Count() })
		n.Stop()
		mu.Lock()
		defer mu.Unlock()
		return got[:12]
	}
	a, b := seq(), seq()
	if strings.Join(a, ",") != strings.Join(b, ",") {
		t.Fatalf("same seed, different kinds: %v and %v", a, b)
	}
}

// TestGoexitInFault: a fault function that exits its goroutine (t.FailNow) is recorded
// as an error and the scheduler carries on and stops.
func TestGoexitInFault(t *testing.T) {
	var calls atomic.Int32
	n := Start(Config{Seed: 1, Faults: []Fault{{Kind: "exit", Inject: func(*rand.Rand) (string, func() error, error) {
		calls.Add(1)
		runtime.Goexit()
		return "", nil, nil
	}}}})
	testenv.Await(t, "3 faults that exit", func() (any, bool) { c := calls.Load(); return c, c >= 3 })
	n.Stop()
	recs := n.Records()
	if len(recs) == 0 || recs[0].Err != errExited.Error() || n.Count() != 0 {
		t.Fatalf("records %v, count %d", recs, n.Count())
	}
}
