package testenv

import (
	"context"
	"fmt"
	"os"
	"time"
)

// StallDefault is how long a test waits without seeing progress before it calls the work
// stalled. It is generous on purpose: it bounds a hang, not how long the work may take, so
// it must hold on the slowest machine that runs the suite (two cores, the race detector,
// another build beside it). OUTBOX_TEST_STALL (a Go duration) overrides it.
const StallDefault = 2 * time.Minute

// Stall returns how long to wait without progress: OUTBOX_TEST_STALL if set and valid,
// else StallDefault.
func Stall() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("OUTBOX_TEST_STALL")); err == nil && d > 0 {
		return d
	}
	return StallDefault
}

// StallError says that work stopped making progress: what was awaited, for how long
// nothing changed, and the last thing seen.
type StallError struct {
	What  string
	Stall time.Duration
	Seen  string
}

func (e *StallError) Error() string {
	return fmt.Sprintf("waiting for %s: no progress for %v; last seen: %s", e.What, e.Stall, e.Seen)
}

// Progress calls check until it reports done, and returns nil then. check also returns
// what it sees now (a count, a state, the last error): Progress returns a *StallError when
// that has not changed for stall, and ctx's error if ctx ends first. Work that keeps
// moving is never cut off however slow the machine is; work that stops is reported after
// stall, with what it was last seen doing. A check whose seen value never changes (a single
// event awaited) makes stall a plain hang bound.
//
// check is called every few milliseconds at first, then every 100 ms.
func Progress(ctx context.Context, what string, stall time.Duration, check func() (seen any, done bool)) error {
	const maxPoll = 100 * time.Millisecond
	poll := time.Millisecond
	var last string
	changed := time.Now()
	for first := true; ; first = false {
		seen, done := check()
		if done {
			return nil
		}
		if s := fmt.Sprint(seen); first || s != last {
			last, changed = s, time.Now()
		} else if time.Since(changed) >= stall {
			return &StallError{What: what, Stall: stall, Seen: last}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s (last seen: %s): %w", what, last, ctx.Err())
		case <-time.After(poll):
		}
		poll = min(2*poll, maxPoll)
	}
}

// Await is Progress for a test: it fails t when the work stalls for Stall(), saying what
// was awaited and what was last seen. Call it from the test's own goroutine.
func Await(t TB, what string, check func() (seen any, done bool)) {
	t.Helper()
	if err := Progress(context.Background(), what, Stall(), check); err != nil {
		t.Fatal(err)
	}
}

// AwaitCond waits for cond to hold, failing t after Stall() without it. It suits a single
// event (a lease taken, a server up), where there is no progress to show; for work that
// advances in steps, use Await with a count, so a slow machine is told from a stall.
func AwaitCond(t TB, what string, cond func() bool) {
	t.Helper()
	Await(t, what, func() (any, bool) { return "not yet", cond() })
}

// AwaitChan waits for done to close, failing t when seen reports no change for Stall().
func AwaitChan(t TB, what string, done <-chan struct{}, seen func() any) {
	t.Helper()
	Await(t, what, func() (any, bool) {
		select {
		case <-done:
			return nil, true
		default:
			return seen(), false
		}
	})
}

// Context returns a context for one call or a short sequence of them that should finish
// promptly but may be slow on a loaded machine: it ends Stall() after it was made, which
// bounds a hang without guessing how fast the machine is, or when the test ends. Make a
// new one for each call of a long workload (or use CallContext in a loop): one context
// shared by the whole workload would be a budget on all of it. Report its error with
// what was being done, so a hang names what hung.
func Context(t TB) context.Context {
	ctx, cancel := CallContext()
	t.Cleanup(cancel)
	return ctx
}

// CallContext is Context for a call made in a loop or a poll: the caller cancels it when
// the call returns, so no timer outlives the call.
func CallContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), Stall())
}

// AwaitRecv waits for a value from ch and returns it, failing t after Stall() without
// one: for a goroutine's result (a Stop, a Publish running in the background) whose wait
// has no progress to show.
func AwaitRecv[T any](t TB, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(Stall()):
		t.Fatalf("waiting for %s: nothing after %v", what, Stall())
		panic("unreachable")
	}
}
