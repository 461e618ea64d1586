package console

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
)

// rateWindow is how far back the throughput looks: the rate is taken between the oldest
// sample younger than this and the newest.
const rateWindow = time.Minute

// sampler turns successive readings of a counter into a rate. It keeps the readings of
// the last rateWindow; a reading lower than the one before (a relay restarted, or the
// retention cleanup shrank the published table) starts over. It is safe for concurrent
// use.
type sampler struct {
	mu      sync.Mutex
	samples []sample
}

type sample struct {
	at time.Time
	n  int64
}

// add records n at time at and returns the rate per second since the oldest sample in
// the window; ok is false until two samples at least a second apart exist.
func (s *sampler) add(at time.Time, n int64) (rate float64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k := len(s.samples); k > 0 && (n < s.samples[k-1].n || at.Before(s.samples[k-1].at)) {
		s.samples = s.samples[:0]
	}
	// Keep one sample older than the window, so the rate always spans about the window.
	drop := 0
	for drop+1 < len(s.samples) && at.Sub(s.samples[drop+1].at) >= rateWindow {
		drop++
	}
	s.samples = append(s.samples[drop:], sample{at, n})
	first := s.samples[0]
	span := at.Sub(first.at)
	if span < time.Second {
		return 0, false
	}
	return float64(n-first.n) / span.Seconds(), true
}

// sampleEvery is how often Sample reads the counters behind the throughput card and the
// charts, so that they span the last minute and hour whether or not a page was loaded.
const sampleEvery = 10 * time.Second

// Sample reads the published counters (the store's, and the relay's when there is one)
// every sampleEvery until ctx ends, for the throughput the overview shows; page loads add
// readings too. A failed read is skipped: the next one fills in.
func (h *Handler) Sample(ctx context.Context) {
	if h.fleet != nil {
		return // a fleet console's outboxes are read while their pages are open
	}
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	for {
		h.sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sample takes one reading of the counters.
func (h *Handler) sample(ctx context.Context) {
	if st, err := h.cfg.Admin.Status(ctx); err == nil {
		now := h.now()
		h.storeRate.add(now, st.Published)
		h.history.add(now, st)
	}
	if h.cfg.RelayStats != nil {
		h.relayRate.add(h.now(), h.cfg.RelayStats().Published)
	}
}

type overviewData struct {
	Status    outboxdriver.Status
	Now       time.Time
	StoreRate rate
	Relay     *relayData // nil without a relay
	Self      string     // the id of the relay serving the console, marked in the relays table
	Paused    bool       // auto-refresh turned off by ?refresh=off
	Charts    []chart    // the last hour
}

type rate struct {
	PerSecond float64
	Known     bool
}

type relayData struct {
	ID    string
	Stats outbox.RelayStats
	Rate  rate
}

func (h *Handler) overview(w http.ResponseWriter, r *http.Request) {
	st, err := h.cfg.Admin.Status(r.Context())
	if err != nil {
		h.storeFailed(w, r, "read the outbox status", err)
		return
	}
	now := h.now()
	d := overviewData{Status: st, Now: now, Self: h.cfg.RelayID, Paused: r.URL.Query().Get("refresh") == "off"}
	d.StoreRate.PerSecond, d.StoreRate.Known = h.storeRate.add(now, st.Published)
	h.history.add(now, st)
	d.Charts = h.history.charts(now)
	if h.cfg.RelayStats != nil {
		rs := h.cfg.RelayStats()
		d.Relay = &relayData{ID: h.cfg.RelayID, Stats: rs}
		d.Relay.Rate.PerSecond, d.Relay.Rate.Known = h.relayRate.add(now, rs.Published)
	}
	p := page{Nav: "overview", Data: d}
	if h.cfg.Refresh > 0 && !d.Paused {
		p.Refresh = max(1, int(h.cfg.Refresh.Round(time.Second)/time.Second))
	}
	h.renderPage(w, r, http.StatusOK, "overview", p)
}
