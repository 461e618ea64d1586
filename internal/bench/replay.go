package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
)

// ReplayPhase is what the replay phase measured (Config.Replay): the live latency at
// Config.Rate right before a replay of the history, and while it runs, in the same run.
type ReplayPhase struct {
	History int // messages of the published history replayed
	// ReplayEPS is the replay's rate over its whole run; ReplaySeconds its length.
	ReplayEPS     float64
	ReplaySeconds float64
	// BaseP50/BaseP99: the live latency with no replay; P50/P99: while the replay ran.
	BaseP50, BaseP99, P50, P99 time.Duration
	// Paused says the replay paused for live traffic at least once.
	Paused bool
}

// X is the live p99 while the replay ran over the p99 right before it.
func (r ReplayPhase) X() float64 { return div(float64(r.P99), float64(r.BaseP99)) }

// replayPhase seeds cfg.Replay messages into the published history (spread over the last
// ten minutes), measures the live latency, then measures it again while outbox.Replay
// publishes the history to a destination of its own, and lets the replay finish.
func (m *measurer) replayPhase(ctx context.Context, pg *postgres) (*ReplayPhase, error) {
	cfg, say := m.cfg, m.say
	rp := &ReplayPhase{History: cfg.Replay}
	say("replay: seeding %d messages of published history", cfg.Replay)
	since, until, err := pg.seedHistory(ctx, cfg.Replay, cfg.Keys, m.payload)
	if err != nil {
		return nil, fmt.Errorf("seed the history: %w", err)
	}
	if err := m.db.settle(ctx); err != nil {
		return nil, err
	}
	say("replay: live latency at %d events/s for %s, no replay", cfg.Rate, cfg.Duration)
	base, err := steadyLatency(ctx, m.db, cfg, m.payload, m.confirmed, say)
	if err != nil {
		return nil, err
	}
	rp.BaseP50, _, rp.BaseP99 = percentiles(base)

	dest, drop, err := m.target.Prepare(ctx, "bench_replay_"+m.tag)
	if err != nil {
		return nil, err
	}
	defer drop()
	pub, closePub, err := openPublisher(ctx, m.target, dest)
	if err != nil {
		return nil, err
	}
	defer closePub()
	store, closeStore, err := m.db.store(ctx)
	if err != nil {
		return nil, err
	}
	defer closeStore()
	history, ok := store.(outboxdriver.HistoryReader)
	if !ok {
		return nil, errors.New("bench: the store reads no history")
	}
	type outcome struct {
		p   outbox.ReplayProgress
		err error
		d   time.Duration
	}
	done := make(chan outcome, 1)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	go func() {
		p, err := outbox.Replay(rctx, history, pub, outbox.ReplayConfig{
			Filter: outboxdriver.HistoryFilter{Since: since, Until: until, Topic: "history"}, Name: "bench", Rate: cfg.ReplayRate,
			Progress: func(p outbox.ReplayProgress) error {
				rp.Paused = rp.Paused || p.Paused
				return nil
			}})
		done <- outcome{p, err, time.Since(start)}
	}()
	say("replay: live latency at %d events/s for %s while %d messages are replayed", cfg.Rate, cfg.Duration, cfg.Replay)
	during, err := steadyLatency(ctx, m.db, cfg, m.payload, m.confirmed, say)
	if err != nil {
		return nil, err
	}
	rp.P50, _, rp.P99 = percentiles(during)
	o := <-done
	if o.err != nil {
		return nil, fmt.Errorf("replay: %w", o.err)
	}
	if o.p.Sent != int64(cfg.Replay) {
		return nil, fmt.Errorf("replay: sent %d of %d", o.p.Sent, cfg.Replay)
	}
	rp.ReplaySeconds = o.d.Seconds()
	rp.ReplayEPS = float64(o.p.Sent) / o.d.Seconds()
	say("replay: %d messages in %.1f s (%.0f/s); live p99 %s ms with it, %s ms without (x%.2f)",
		o.p.Sent, rp.ReplaySeconds, rp.ReplayEPS, msText(rp.P99), msText(rp.BaseP99), rp.X())
	return rp, nil
}

// seedHistory writes n published messages over keys keys straight into the published
// history, published over the ten minutes before now, and returns a range that holds
// exactly them.
func (p *postgres) seedHistory(ctx context.Context, n, keys int, payload []byte) (since, until time.Time, err error) {
	names, err := p.names()
	if err != nil {
		return since, until, err
	}
	var now time.Time
	if err := p.pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return since, until, err
	}
	since, until = now.Add(-10*time.Minute), now
	// The days the span covers need their partitions (today's exists; yesterday's when
	// the span starts before midnight).
	if _, err := p.pool.Exec(ctx, `SELECT `+names.PartitionFunc+`(($1::timestamptz AT TIME ZONE 'UTC')::date)`, since); err != nil {
		return since, until, err
	}
	const chunk = 100_000
	for from := 0; from < n; from += chunk {
		to := min(from+chunk, n)
		_, err := p.pool.Exec(ctx, `INSERT INTO `+names.Published+` (seq, id, topic, key, aggregate_type, event_type, content_type, payload, headers,
    dedup_key, shard, created_at, attempts, published_at)
SELECT -g, gen_random_uuid(), 'history', 'k' || (g % $3::bigint), 'order', 'e', 'application/octet-stream', $4::bytea, '{}',
    'history-' || g, g % 64, $1::timestamptz, 1, $1::timestamptz + (g * (600000000.0 / $2::bigint)) * interval '1 microsecond'
FROM generate_series($5::bigint, $6::bigint - 1) g`, since, n, keys, payload, from, to)
		if err != nil {
			return since, until, err
		}
	}
	return since, until.Add(time.Microsecond), nil
}
