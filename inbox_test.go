package outbox

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// mapInbox is an InboxDriver over a map, for the Inbox's own logic.
type mapInbox struct{ seen map[string]bool }

func (m *mapInbox) Claim(_ context.Context, _ struct{}, consumer string, ids []string) ([]bool, error) {
	out := make([]bool, len(ids))
	for i, id := range ids {
		if !m.seen[consumer+"/"+id] {
			m.seen[consumer+"/"+id] = true
			out[i] = true
		}
	}
	return out, nil
}

func TestInbox(t *testing.T) {
	drv := &mapInbox{seen: map[string]bool{}}
	in, err := NewInbox[struct{}](drv, InboxConfig{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ran := 0
	work := func(context.Context) error { ran++; return nil }
	for range 3 {
		if _, err := in.Process(ctx, struct{}{}, "m1", work); err != nil {
			t.Fatal(err)
		}
	}
	if ran != 1 {
		t.Fatalf("work ran %d times for one id", ran)
	}
	fresh, err := in.ClaimBatch(ctx, struct{}{}, []string{"m1", "m2", "m2", "m3"})
	if err != nil || !slices.Equal(fresh, []bool{false, true, false, true}) {
		t.Fatalf("ClaimBatch = %v, %v", fresh, err)
	}
	if _, err := in.Claim(ctx, struct{}{}, ""); !errors.Is(err, ErrNoMessageID) {
		t.Fatalf("empty id: %v", err)
	}
	other, _ := NewInbox[struct{}](drv, InboxConfig{Consumer: "shipping"})
	if ok, _ := other.Claim(ctx, struct{}{}, "m1"); !ok {
		t.Fatal("another consumer saw m1 as processed")
	}
}

func TestInboxConfig(t *testing.T) {
	for _, c := range []string{"", string(make([]byte, 201)), "\xff"} {
		if _, err := NewInbox[struct{}](&mapInbox{}, InboxConfig{Consumer: c}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("consumer %q: %v", c, err)
		}
	}
}

type countingCleaner struct {
	calls, rows int
	left        int
}

func (c *countingCleaner) DeleteInbox(_ context.Context, _ time.Duration, limit int) (int, error) {
	c.calls++
	n := min(limit, c.left)
	c.left -= n
	c.rows += n
	return n, nil
}

// TestCleanInbox runs in a synctest bubble: the deadline (an input here, the way the
// caller stops the cleaner) passes on the fake clock, whatever the machine's speed.
func TestCleanInbox(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &countingCleaner{left: 25}
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Minute)
		defer cancel()
		if err := CleanInbox(ctx, c, InboxCleanupConfig{Retention: time.Hour, Interval: time.Hour, Batch: 10}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("CleanInbox returned %v", err)
		}
		// 10 + 10 + 5: the first round deletes until a batch comes back short; the
		// second, an interval later, finds nothing left (one call).
		if c.rows != 25 || c.calls != 4 {
			t.Fatalf("deleted %d rows in %d calls, want 25 in 4", c.rows, c.calls)
		}
	})
}
