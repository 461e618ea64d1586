package console

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// historyLength is how far back the overview's charts look.
const historyLength = time.Hour

// minHistoryStep is the least time between two readings the history keeps: page loads
// add readings too, and a page refreshed every second would otherwise crowd the charts.
const minHistoryStep = sampleEvery / 2

// history keeps the readings of the last historyLength the overview's charts draw: the
// backlog, the age of the oldest pending message, and the published count (the
// throughput is its change from one reading to the next). It is safe for concurrent use.
type history struct {
	mu       sync.Mutex
	readings []reading
}

type reading struct {
	at        time.Time
	pending   int64
	oldest    time.Duration
	published int64
}

// add records st read at at. A reading earlier than the last (a clock step) starts over.
func (h *history) add(at time.Time, st outboxdriver.Status) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if k := len(h.readings); k > 0 {
		last := h.readings[k-1].at
		if at.Before(last) {
			h.readings = h.readings[:0]
		} else if at.Sub(last) < minHistoryStep {
			return
		}
	}
	drop := 0
	for drop < len(h.readings) && at.Sub(h.readings[drop].at) > historyLength {
		drop++
	}
	h.readings = append(h.readings[drop:], reading{at: at, pending: st.Pending, oldest: st.OldestPendingAge, published: st.Published})
}

// charts draws the history as of now.
func (h *history) charts(now time.Time) []chart {
	h.mu.Lock()
	rs := append([]reading(nil), h.readings...)
	h.mu.Unlock()
	var pending, oldest, rate []chartPoint
	for i, r := range rs {
		if now.Sub(r.at) > historyLength || r.at.After(now) {
			continue
		}
		pending = append(pending, chartPoint{r.at, float64(r.pending)})
		age := r.oldest
		if r.pending == 0 {
			age = 0
		}
		oldest = append(oldest, chartPoint{r.at, age.Seconds()})
		// The published count falls when retention deletes: no rate across that.
		if i > 0 && r.published >= rs[i-1].published {
			rate = append(rate, chartPoint{r.at, float64(r.published-rs[i-1].published) / r.at.Sub(rs[i-1].at).Seconds()})
		}
	}
	count := func(v float64) string { return strconv.FormatInt(int64(v+0.5), 10) }
	seconds := func(v float64) string { return age(time.Duration(v * float64(time.Second))) }
	return []chart{
		draw("pending", "Pending", now, pending, count),
		draw("oldest", "Oldest pending", now, oldest, seconds),
		draw("throughput", "Throughput", now, rate, perSecond),
	}
}

type chartPoint struct {
	at time.Time
	v  float64
}

// chart is one of the overview's charts: a line over the last hour, drawn as an SVG
// polyline on a chartWidth by chartHeight box (time across, 0 at the bottom and the
// highest value at the top), with that highest value and the latest one as text.
type chart struct {
	Key, Title string
	Points     string // the polyline's points: "x,y x,y ..."
	N          int    // how many
	Max, Last  string
}

const (
	chartWidth  = 300
	chartHeight = 60
)

func draw(key, title string, now time.Time, ps []chartPoint, format func(float64) string) chart {
	c := chart{Key: key, Title: title, N: len(ps)}
	if len(ps) == 0 {
		return c
	}
	top := 0.0
	for _, p := range ps {
		top = max(top, p.v)
	}
	start := now.Add(-historyLength)
	var b strings.Builder
	for i, p := range ps {
		x := float64(chartWidth) * p.at.Sub(start).Seconds() / historyLength.Seconds()
		y := float64(chartHeight - 1) // a flat line at zero stays visible
		if top > 0 {
			y = float64(chartHeight-1) - (float64(chartHeight)-2)*p.v/top
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.1f,%.1f", x, y)
	}
	c.Points = b.String()
	c.Max, c.Last = format(top), format(ps[len(ps)-1].v)
	return c
}
