// Package nemesis injects faults into a torture run (issue 7): a seeded scheduler that,
// while the workload runs, picks a fault, injects it, holds it for a while, heals it, and
// waits a random gap before the next one. Faults never overlap, so every one has a clear
// start and end, and the time the last one healed marks the start of recovery.
//
// Kinds are drawn in rounds: each round is a seeded permutation of every configured
// kind, so a run long enough for one round has injected every kind at least once
// (RoundDone). Every fault is logged, as one JSON line to Config.Log and one line to
// Config.Logf, with its kind, target, start and end.
package nemesis

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"time"
)

// Fault is one kind of fault.
type Fault struct {
	// Kind names it in the log: "relay-kill", "nats-restart", ...
	Kind string
	// Inject starts the fault and returns what it aimed at, and a function that heals it
	// (nil when the fault heals itself at once, such as a killed connection). rnd is the
	// nemesis's seeded source, for picking a target. An error is logged and the fault is
	// counted as not injected.
	Inject func(rnd *rand.Rand) (target string, heal func() error, err error)
	// MinHold and MaxHold bound how long the fault is held before it is healed.
	MinHold, MaxHold time.Duration
}

// Config configures a Nemesis.
type Config struct {
	Seed   uint64
	Faults []Fault
	// MinGap and MaxGap bound the quiet time between one fault's end and the next start.
	MinGap, MaxGap time.Duration
	// Log receives one JSON line per fault (a Record). Optional.
	Log io.Writer
	// Logf receives one human line per fault, such as testing.T.Logf. Optional.
	Logf func(format string, args ...any)
}

// Record is one injected fault.
type Record struct {
	Kind   string    `json:"kind"`
	Target string    `json:"target"`
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"` // when it was healed
	Err    string    `json:"err,omitempty"`
}

// Nemesis is a running fault scheduler. Its methods are safe for concurrent use.
type Nemesis struct {
	cfg       Config
	stop      chan struct{}
	done      chan struct{}
	roundDone chan struct{}
	once      sync.Once

	mu         sync.Mutex
	records    []Record
	lastHealed time.Time
}

// Start starts injecting faults at once (after a first gap) and returns.
func Start(cfg Config) *Nemesis {
	n := &Nemesis{cfg: cfg, stop: make(chan struct{}), done: make(chan struct{}), roundDone: make(chan struct{})}
	go n.run()
	return n
}

// RoundDone is closed once every configured kind has been injected at least once (a
// full round), or when the nemesis stops.
func (n *Nemesis) RoundDone() <-chan struct{} { return n.roundDone }

// Stop stops scheduling, heals the fault in progress (cutting its hold short) and waits
// for the scheduler to return. Stopping twice is safe.
func (n *Nemesis) Stop() {
	n.once.Do(func() { close(n.stop) })
	<-n.done
}

// Records returns the faults injected so far.
func (n *Nemesis) Records() []Record {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]Record(nil), n.records...)
}

// Count returns the number of faults injected without error: Bounds.Faults.
func (n *Nemesis) Count() int {
	c := 0
	for _, r := range n.Records() {
		if r.Err == "" {
			c++
		}
	}
	return c
}

// Kinds counts the faults injected without error, per kind.
func (n *Nemesis) Kinds() map[string]int {
	out := map[string]int{}
	for _, r := range n.Records() {
		if r.Err == "" {
			out[r.Kind]++
		}
	}
	return out
}

// LastHealed returns when the last fault was healed (zero if none was injected).
func (n *Nemesis) LastHealed() time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.lastHealed
}

func between(rnd *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(rnd.Int64N(int64(hi-lo)))
}

func (n *Nemesis) run() {
	defer close(n.done)
	rnd := rand.New(rand.NewPCG(n.cfg.Seed, 0x6e656d65736973))
	var round []int
	var roundOnce sync.Once
	defer roundOnce.Do(func() { close(n.roundDone) })
	for started := false; ; started = true {
		if len(round) == 0 {
			if len(n.cfg.Faults) == 0 {
				<-n.stop
				return
			}
			if started {
				roundOnce.Do(func() { close(n.roundDone) })
			}
			round = rnd.Perm(len(n.cfg.Faults))
		}
		if !n.sleep(between(rnd, n.cfg.MinGap, n.cfg.MaxGap)) {
			return
		}
		f := n.cfg.Faults[round[0]]
		round = round[1:]
		hold := between(rnd, f.MinHold, f.MaxHold)
		rec := Record{Kind: f.Kind, Start: time.Now()}
		var target string
		var heal func() error
		err := guard(func() (err error) { target, heal, err = f.Inject(rnd); return err })
		rec.Target = target
		if err != nil {
			rec.Err = err.Error()
		} else if heal != nil {
			n.sleep(hold) // a stop cuts the hold short; healing always happens
			if err := guard(heal); err != nil {
				rec.Err = "heal: " + err.Error()
			}
		}
		rec.End = time.Now()
		n.record(rec)
		select {
		case <-n.stop:
			return
		default:
		}
	}
}

// errExited reports a fault function that never returned: it called runtime.Goexit,
// as testing.T.FailNow does.
var errExited = errors.New("nemesis: the fault function exited without returning (t.FailNow?)")

// guard runs f on its own goroutine, so that a t.Fatal inside a fault function fails
// the test without killing the scheduler (which must go on to heal and return).
func guard(f func() error) error {
	var err error
	returned := false
	done := make(chan struct{})
	go func() {
		defer close(done)
		err = f()
		returned = true
	}()
	<-done
	if !returned {
		return errExited
	}
	return err
}

// sleep waits d, or less if the nemesis is stopped; it reports whether it was not.
func (n *Nemesis) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-n.stop:
		return false
	case <-t.C:
		return true
	}
}

func (n *Nemesis) record(rec Record) {
	n.mu.Lock()
	n.records = append(n.records, rec)
	if rec.Err == "" {
		n.lastHealed = rec.End
	}
	n.mu.Unlock()
	if n.cfg.Log != nil {
		b, _ := json.Marshal(rec)
		_, _ = n.cfg.Log.Write(append(b, '\n'))
	}
	if n.cfg.Logf != nil {
		status := "ok"
		if rec.Err != "" {
			status = "ERROR " + rec.Err
		}
		n.cfg.Logf("nemesis: %s %s start=%s end=%s held=%s %s", rec.Kind, rec.Target,
			rec.Start.UTC().Format("15:04:05.000"), rec.End.UTC().Format("15:04:05.000"),
			rec.End.Sub(rec.Start).Round(time.Millisecond), status)
	}
}

// String describes a record on one line.
func (r Record) String() string {
	return fmt.Sprintf("%s %s %s..%s %s", r.Kind, r.Target, r.Start.UTC().Format(time.RFC3339Nano), r.End.UTC().Format(time.RFC3339Nano), r.Err)
}
