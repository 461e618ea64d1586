package bench

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/outboxkit/outbox"
)

// CriticalPhase is what the critical phase measured (Config.Critical): the same backlog,
// with a fraction of critical messages spread through it, drained with no priorities
// (the reference) and with the critical messages at a priority, in turn, Config.Runs
// times each; the figures are medians.
type CriticalPhase struct {
	Fraction float64
	Messages int // critical messages in the backlog
	// X is when the last critical message was confirmed, as a fraction of the whole
	// drain, with priorities; BaseX the same without.
	X, BaseX float64
	// EPS and BaseEPS are the drain rates with and without priorities.
	EPS, BaseEPS float64
}

// EPSX is the drain rate with priorities over the rate without.
func (c CriticalPhase) EPSX() float64 { return div(c.EPS, c.BaseEPS) }

// criticalPriority is the priority of the critical messages in the phase's second drain.
const criticalPriority = 5

func (m *measurer) criticalPhase(ctx context.Context) (*CriticalPhase, error) {
	cfg, say := m.cfg, m.say
	period := max(1, int(math.Round(1/cfg.Critical)))
	cp := &CriticalPhase{Fraction: cfg.Critical, Messages: (cfg.Events + period - 1) / period}
	// Critical messages have keys of their own, as when priority belongs to a topic
	// (payments against orders): as many as the others, each with fewer messages.
	keys := cfg.Keys
	runs := 0
	drain := func(label string, prio int) (x, eps float64, err error) {
		shape := func(i int, msg *outbox.Message) {
			if i%period == 0 {
				msg.Topic, msg.Key, msg.Priority = "payments", "c"+strconv.Itoa(i/period%keys), prio
			}
		}
		say("critical: %s: writing a backlog of %d events, %d of them critical", label, cfg.Events, cp.Messages)
		if err := writeBacklog(ctx, m.db, cfg, m.payload, shape, say); err != nil {
			return 0, 0, err
		}
		// Each drain on a vacuumed table (PostgreSQL): the last drain's dead rows, which
		// the fetches would walk until autovacuum came, count against neither.
		if pg, ok := m.db.(*postgres); ok {
			if err := pg.vacuum(ctx); err != nil {
				return 0, 0, err
			}
		}
		start := time.Now()
		crit := &criticalLog{start: start}
		runs++
		rs, err := startRelaysWith(ctx, cfg, m.db, fmt.Sprintf("%s-c%d", m.tag, runs), m.confirmed, func() (outbox.Publisher, func(), error) {
			pub, closePub, err := openPublisher(ctx, m.target, m.dest)
			return &criticalWatch{Publisher: pub, log: crit}, closePub, err
		})
		if err != nil {
			return 0, 0, err
		}
		defer rs.stop(ctx)
		if _, err := rs.waitPublished(ctx, int64(cfg.Events), func(n int64, elapsed time.Duration) {
			critical, _ := crit.result()
			say("critical: %s: %d/%d (%.0f/s), %d critical", label, n, cfg.Events, float64(n)/elapsed.Seconds(), critical)
		}); err != nil {
			return 0, 0, err
		}
		total := time.Since(start)
		n, last := crit.result()
		if n < cp.Messages {
			return 0, 0, fmt.Errorf("critical: %s: %d critical messages confirmed, want %d", label, n, cp.Messages)
		}
		x, eps = last.Seconds()/total.Seconds(), float64(cfg.Events)/total.Seconds()
		say("critical: %s: %.0f events/s; the last critical message confirmed %.2f s in, %.3f of the drain", label, eps, last.Seconds(), x)
		return x, eps, m.emptyDestinations(ctx)
	}
	// The two drains alternate, cfg.Runs times each: the figures are their medians.
	var xs, bxs, epss, beps []float64
	for run := 1; run <= cfg.Runs; run++ {
		bx, be, err := drain(fmt.Sprintf("run %d/%d: no priorities", run, cfg.Runs), 0)
		if err != nil {
			return nil, err
		}
		x, e, err := drain(fmt.Sprintf("run %d/%d: critical at priority %d", run, cfg.Runs, criticalPriority), criticalPriority)
		if err != nil {
			return nil, err
		}
		bxs, beps, xs, epss = append(bxs, bx), append(beps, be), append(xs, x), append(epss, e)
	}
	cp.X, cp.BaseX, cp.EPS, cp.BaseEPS = median(xs), median(bxs), median(epss), median(beps)
	say("critical: the critical messages took %.3f of the drain with priorities, %.3f without; drain %.2f of the rate without", cp.X, cp.BaseX, cp.EPSX())
	return cp, nil
}

// criticalLog is when the critical messages (topic "payments") of one drain were
// confirmed: how many, and how long after start the last.
type criticalLog struct {
	mu    sync.Mutex
	start time.Time
	n     int
	last  time.Duration
}

func (c *criticalLog) record(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n += n
	c.last = time.Since(c.start)
}

func (c *criticalLog) result() (int, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n, c.last
}

// criticalWatch is a relay's publisher that records its confirmed critical messages in
// log.
type criticalWatch struct {
	outbox.Publisher
	log *criticalLog
}

func (w *criticalWatch) Publish(ctx context.Context, batch []*outbox.Message) []error {
	errs := w.Publisher.Publish(ctx, batch)
	n := 0
	for i, m := range batch {
		if m.Topic == "payments" && (errs == nil || errs[i] == nil) {
			n++
		}
	}
	if n > 0 {
		w.log.record(n)
	}
	return errs
}
