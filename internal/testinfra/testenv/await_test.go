package testenv

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

func TestProgressDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := 0
		err := Progress(context.Background(), "three calls", time.Second, func() (any, bool) {
			n++
			return n, n == 3
		})
		if err != nil || n != 3 {
			t.Fatalf("err %v after %d calls; want nil after 3", err, n)
		}
	})
}

// Work that keeps moving is not cut off, however long it takes in all.
func TestProgressSlowButMoving(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		err := Progress(context.Background(), "slow work", time.Second, func() (any, bool) {
			elapsed := time.Since(start)
			return elapsed / (500 * time.Millisecond), elapsed > time.Minute // a step every 0.5 s
		})
		if err != nil {
			t.Fatalf("work advancing every 0.5 s with a 1 s stall limit: %v", err)
		}
	})
}

func TestProgressStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		err := Progress(context.Background(), "the consumer", time.Second, func() (any, bool) {
			if time.Since(start) < 3*time.Second {
				return "handled " + time.Since(start).Truncate(time.Second).String(), false
			}
			return "handled 41 of 100", false
		})
		var se *StallError
		if !errors.As(err, &se) {
			t.Fatalf("err %v; want a StallError", err)
		}
		if se.Seen != "handled 41 of 100" || se.What != "the consumer" {
			t.Fatalf("stall reported %+v", se)
		}
		if took := time.Since(start); took < 4*time.Second || took > 4200*time.Millisecond {
			t.Fatalf("stall reported after %v; want 1 s after the last change at 3 s", took)
		}
		want := "waiting for the consumer: no progress for 1s; last seen: handled 41 of 100"
		if err.Error() != want {
			t.Fatalf("message %q; want %q", err, want)
		}
	})
}

func TestProgressContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err := Progress(ctx, "nothing", time.Hour, func() (any, bool) { return 0, false })
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err %v; want the context's", err)
		}
	})
}

func TestStallFromEnvironment(t *testing.T) {
	t.Setenv("OUTBOX_TEST_STALL", "7s")
	if got := Stall(); got != 7*time.Second {
		t.Fatalf("Stall() = %v with OUTBOX_TEST_STALL=7s", got)
	}
	t.Setenv("OUTBOX_TEST_STALL", "soon")
	if got := Stall(); got != StallDefault {
		t.Fatalf("Stall() = %v with an invalid OUTBOX_TEST_STALL; want the default", got)
	}
}
