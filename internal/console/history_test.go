package console

import (
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// TestHistoryCharts: the charts draw the readings of the last hour, one point each
// (throughput: one per pair), the highest value at the top; readings crowded closer than
// minHistoryStep, older than the hour, or across a clock step back are left out, and a
// published count that falls (retention) gives no throughput point.
func TestHistoryCharts(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	var h history
	st := func(pending, published int64, oldest time.Duration) outboxdriver.Status {
		return outboxdriver.Status{Pending: pending, Published: published, OldestPendingAge: oldest}
	}
	h.add(t0.Add(-2*time.Hour), st(999, 0, time.Hour)) // dropped: older than the hour
	h.add(t0, st(10, 100, 2*time.Second))
	h.add(t0.Add(time.Second), st(11, 105, time.Second)) // too soon after the last
	h.add(t0.Add(10*time.Second), st(40, 400, 30*time.Second))
	h.add(t0.Add(20*time.Second), st(0, 350, 0)) // retention deleted: no rate point
	h.add(t0.Add(30*time.Second), st(20, 550, time.Second))
	now := t0.Add(30 * time.Second)

	charts := h.charts(now)
	byKey := map[string]chart{}
	for _, c := range charts {
		byKey[c.Key] = c
	}
	pending, oldest, rate := byKey["pending"], byKey["oldest"], byKey["throughput"]
	if pending.N != 4 || pending.Max != "40" || pending.Last != "20" {
		t.Errorf("pending: %+v", pending)
	}
	if oldest.N != 4 || oldest.Max != "30s" || oldest.Last != "1s" {
		t.Errorf("oldest: %+v", oldest)
	}
	if rate.N != 2 || rate.Max != "30/s" || rate.Last != "20/s" {
		t.Errorf("throughput: %+v", rate)
	}
	// The highest reading is at the top (y 1), the latest at the right edge.
	pts := strings.Fields(pending.Points)
	if len(pts) != 4 || !strings.HasSuffix(pts[1], ",1.0") || !strings.HasPrefix(pts[3], "300.0,") {
		t.Errorf("pending points %q", pending.Points)
	}

	// A clock step back starts over.
	h.add(t0.Add(-time.Minute), st(5, 0, 0))
	if c := h.charts(t0); c[0].N != 1 {
		t.Errorf("after a step back: %d points, want 1", c[0].N)
	}
	// Nothing read yet: no points, and nothing to draw.
	var empty history
	for _, c := range empty.charts(now) {
		if c.N != 0 || c.Points != "" {
			t.Errorf("empty %s: %+v", c.Key, c)
		}
	}
}
