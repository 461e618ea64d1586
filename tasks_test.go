package outbox

import (
	"testing"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// TestRecycleWait: a relay with nothing published and nothing held since the last call
// recycles half as often each time, down to every recycleIdleMax; any activity brings it
// back to every recycleInterval, and a rotation or a draining bucket to recycleDraining.
func TestRecycleWait(t *testing.T) {
	var none outboxdriver.Recycling
	wait := recycleInterval
	var idle []time.Duration
	for range 6 {
		wait = recycleWait(none, true, wait)
		idle = append(idle, wait)
	}
	want := []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second, 8 * time.Second, 8 * time.Second}
	for i := range want {
		if idle[i] != want[i] {
			t.Fatalf("idle waits %v, want %v", idle, want)
		}
	}
	if got := recycleWait(none, false, recycleIdleMax); got != recycleInterval {
		t.Errorf("after activity: %v, want %v", got, recycleInterval)
	}
	for _, done := range []outboxdriver.Recycling{{Rotated: true}, {Draining: true}} {
		for _, idle := range []bool{false, true} {
			if got := recycleWait(done, idle, recycleIdleMax); got != recycleDraining {
				t.Errorf("%+v, idle %v: %v, want %v", done, idle, got, recycleDraining)
			}
		}
	}
	if got := recycleWait(none, true, recycleDraining); got != recycleInterval {
		t.Errorf("idle after a draining wait: %v, want %v", got, recycleInterval)
	}
}
