package reconnect

import (
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	for _, c := range []struct {
		attempt  int
		min, max time.Duration
	}{
		{-1, 25 * time.Millisecond, 31250 * time.Microsecond},
		{0, 25 * time.Millisecond, 31250 * time.Microsecond},
		{1, 50 * time.Millisecond, 62500 * time.Microsecond},
		{2, 100 * time.Millisecond, 125 * time.Millisecond},
		{50, 100 * time.Millisecond, 125 * time.Millisecond},
	} {
		for range 100 {
			if d := Delay(c.attempt); d < c.min || d > c.max {
				t.Fatalf("Delay(%d) = %v, want within [%v, %v]", c.attempt, d, c.min, c.max)
			}
		}
	}
}
