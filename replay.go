package outbox

import (
	"cmp"
	"context"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// ReplayConfig configures Replay.
type ReplayConfig struct {
	// Filter selects the published history to publish again; Since and Until are
	// required.
	Filter outboxdriver.HistoryFilter

	// Name names the replay: every message it publishes carries it in the
	// Outbox-Replay header (HeaderReplay). Required.
	Name string

	// From resumes a replay: the Cursor of its last ReplayProgress. Zero starts at
	// Filter.Since.
	From time.Time

	// BatchSize caps the messages of one Publisher.Publish call. Defaults to 250.
	BatchSize int

	// Workers is how many Publish calls run at once. Defaults to 4.
	Workers int

	// Rate caps the messages published per second, so that the live relays keep their
	// share of the machines and the broker. Defaults to ReplayRateDefault; -1 sets no cap.
	Rate float64

	// LiveBacklog lets live traffic go first: while at least this many of the outbox's
	// pending messages have waited over a second while a relay could send them
	// (HistoryReader.LiveBehind), the replay pauses. Defaults to 100; -1 never pauses.
	LiveBacklog int

	// MaxAttempts is how many times a message the destination rejects is tried before
	// it counts as failed and the replay goes on (a Permanent rejection fails at once).
	// Outages are waited out, never counted. Defaults to 5.
	MaxAttempts int

	// PublishTimeout bounds one Publish call. Defaults to 30s.
	PublishTimeout time.Duration

	// Progress is called after each span of the history was sent, with the progress so
	// far (what a resumable caller records), and when the replay pauses for live
	// traffic. An error from it stops the replay.
	Progress func(ReplayProgress) error

	// Logger receives the replay's log. Defaults to slog.Default().
	Logger *slog.Logger
}

// ReplayProgress is how far a replay got.
type ReplayProgress struct {
	// Cursor: every selected message published before it was sent (a replay resumed
	// with From = Cursor goes on from there).
	Cursor time.Time
	Total  int64 // messages the filter selects in all (counted when the replay started)
	Done   int64 // of them, handled before Cursor on earlier runs and this one: Sent + Failed + Skipped
	Sent   int64 // published by this run
	Failed int64 // rejected for good by this run (Permanent, or MaxAttempts rejections)
	// Skipped counts the messages before From when a resumed run started: sent by an
	// earlier run.
	Skipped int64
	Paused  bool // the replay waits for live traffic now
}

// ReplayRateDefault is ReplayConfig.Rate's default, in messages per second: on a
// two-core machine running PostgreSQL, NATS and a relay at 1,000 events a second, a
// replay of 1,000,000 messages at this rate left the live p99 at 1.42x its value
// without one (docs/benchmarks.md).
const ReplayRateDefault = 1000

// The span of history a replay reads at once: at most replaySpanRows messages; the span
// of publication time is halved when it holds more and doubled when it holds few.
const (
	replaySpanRows  = 5000
	replayFirstSpan = time.Minute
)

// Replay publishes again, to pub, the published messages cfg.Filter selects, in the
// order of their first publication (for each key, the order its messages were
// written). Each keeps its ID, dedup key and headers, and gains the Outbox-Replay
// header, so consumers that deduplicate by ID or dedup key skip what they processed. It
// reads the history in spans of publication time and publishes each span in waves: the
// first message of every key, then the second, and so on, so that a key's messages go
// one after the other while different keys go together. It returns when the whole range
// was sent, with the progress, or on the first error (ctx ending, the history not
// readable, Progress failing), with the progress up to then: a replay run again with
// From = Cursor goes on.
func Replay(ctx context.Context, history outboxdriver.HistoryReader, pub Publisher, cfg ReplayConfig) (ReplayProgress, error) {
	if err := cfg.Filter.Validate(); err != nil {
		return ReplayProgress{}, err
	}
	if cfg.Name == "" {
		return ReplayProgress{}, &ConfigError{Field: "Name", Reason: "required: it marks the messages a replay publishes"}
	}
	cfg.BatchSize = cmp.Or(cfg.BatchSize, 250)
	cfg.Rate = cmp.Or(cfg.Rate, ReplayRateDefault)
	cfg.Workers = cmp.Or(cfg.Workers, 4)
	cfg.LiveBacklog = cmp.Or(cfg.LiveBacklog, 100)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, 5)
	cfg.PublishTimeout = cmp.Or(cfg.PublishTimeout, 30*time.Second)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	if cfg.BatchSize < 0 || cfg.Workers < 0 || cfg.MaxAttempts < 0 || cfg.LiveBacklog < -1 || cfg.Rate < 0 && cfg.Rate != -1 {
		return ReplayProgress{}, &ConfigError{Field: "ReplayConfig", Reason: "BatchSize, Workers and MaxAttempts must not be negative, Rate and LiveBacklog not below -1"}
	}
	r := &replayer{history: history, pub: pub, cfg: cfg, log: cfg.Logger.With("replay", cfg.Name)}
	return r.run(ctx)
}

type replayer struct {
	history outboxdriver.HistoryReader
	pub     Publisher
	cfg     ReplayConfig
	log     *slog.Logger
	next    time.Time // with a Rate, when the next batch may go
	p       ReplayProgress
}

// pace waits, with a Rate, until n more messages may go: the batches are spaced at the
// rate, and a replay that fell behind it (a slow destination) does not burst to catch up.
func (r *replayer) pace(ctx context.Context, n int) error {
	if r.cfg.Rate <= 0 {
		return nil
	}
	now := time.Now()
	if r.next.Before(now) {
		r.next = now
	}
	wait := r.next.Sub(now)
	r.next = r.next.Add(time.Duration(float64(n) / r.cfg.Rate * float64(time.Second)))
	if wait <= 0 {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(wait):
		return nil
	}
}

func (r *replayer) run(ctx context.Context) (ReplayProgress, error) {
	f := r.cfg.Filter
	total, first, err := r.history.CountHistory(ctx, f)
	if err != nil {
		return r.p, err
	}
	r.p.Total = total
	cursor := f.Since
	if !r.cfg.From.IsZero() && r.cfg.From.After(cursor) {
		cursor = r.cfg.From
		done := f
		if cursor.Before(f.Until) {
			done.Until = cursor
		}
		if r.p.Skipped, _, err = r.history.CountHistory(ctx, done); err != nil {
			return r.p, err
		}
		r.p.Done = r.p.Skipped
	}
	if total == 0 {
		cursor = f.Until
	} else if first.After(cursor) {
		cursor = first // nothing selected before the first message
	}
	r.p.Cursor = cursor
	span := replayFirstSpan
	for cursor.Before(f.Until) {
		if err := r.yield(ctx); err != nil {
			return r.p, err
		}
		end := cursor.Add(span)
		if end.After(f.Until) || end.Before(cursor) {
			end = f.Until
		}
		rows, err := r.history.History(ctx, f, cursor, end, replaySpanRows)
		if err != nil {
			return r.p, err
		}
		if len(rows) > replaySpanRows {
			if span > time.Microsecond { // the stores keep microseconds
				span = max(span/4, time.Microsecond)
				continue
			}
			// More than a span's rows at one microsecond: read them all.
			if rows, err = r.history.History(ctx, f, cursor, end, 1<<30); err != nil {
				return r.p, err
			}
		}
		if err := r.send(ctx, rows); err != nil {
			return r.p, err
		}
		cursor, r.p.Cursor = end, end
		if err := r.progress(); err != nil {
			return r.p, err
		}
		if len(rows) < replaySpanRows/4 && span < 24*time.Hour {
			span *= 2
		}
	}
	return r.p, nil
}

func (r *replayer) progress() error {
	if r.cfg.Progress == nil {
		return nil
	}
	return r.cfg.Progress(r.p)
}

// yield waits while the live relays are behind.
func (r *replayer) yield(ctx context.Context) error {
	if r.cfg.LiveBacklog < 0 {
		return nil
	}
	for {
		behind, err := r.history.LiveBehind(ctx, time.Second, r.cfg.LiveBacklog)
		if err != nil {
			return err
		}
		if behind != r.p.Paused {
			r.p.Paused = behind
			if behind {
				r.log.Info("replay paused: live messages wait; they go first")
			} else {
				r.log.Info("replay resumed")
			}
			if err := r.progress(); err != nil {
				return err
			}
		}
		if !behind {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// send publishes rows, in publication order, in waves of one message per key.
func (r *replayer) send(ctx context.Context, rows []outboxdriver.Published) error {
	var waves [][]*Message
	depth := map[string]int{} // a key's messages so far: the wave of its next one
	for i := range rows {
		m := r.marked(&rows[i].Message)
		w := 0
		if m.Key != "" { // messages without a key have no order to keep
			w = depth[m.Key]
			depth[m.Key]++
		}
		if w == len(waves) {
			waves = append(waves, nil)
		}
		waves[w] = append(waves[w], m)
	}
	for _, wave := range waves {
		if err := r.sendWave(ctx, wave); err != nil {
			return err
		}
	}
	return nil
}

// marked returns a copy of m for publishing again: its headers gain Outbox-Replay.
func (r *replayer) marked(m *Message) *Message {
	c := *m
	c.Headers = maps.Clone(m.Headers)
	if c.Headers == nil {
		c.Headers = map[string]string{}
	}
	c.Headers[HeaderReplay] = r.cfg.Name
	return &c
}

// sendWave publishes the messages of one wave (no two of one key), BatchSize at a time
// on up to Workers calls at once, until each is confirmed or failed for good.
func (r *replayer) sendWave(ctx context.Context, wave []*Message) error {
	attempts := make([]int, len(wave))
	pending := make([]int, len(wave))
	for i := range pending {
		pending[i] = i
	}
	for outages := 0; len(pending) > 0; {
		var mu sync.Mutex
		var again []int
		outage := false
		sem := make(chan struct{}, r.cfg.Workers)
		var wg sync.WaitGroup
		for start := 0; start < len(pending); start += r.cfg.BatchSize {
			idx := pending[start:min(start+r.cfg.BatchSize, len(pending))]
			if err := r.pace(ctx, len(idx)); err != nil {
				wg.Wait()
				return err
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				wg.Wait()
				return ctx.Err()
			}
			wg.Go(func() {
				defer func() { <-sem }()
				batch := make([]*Message, len(idx))
				for j, i := range idx {
					batch[j] = wave[i]
				}
				pctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
				errs := publishAll(pctx, r.pub, batch)
				cancel()
				mu.Lock()
				defer mu.Unlock()
				for j, i := range idx {
					var err error
					if errs != nil {
						err = errs[j]
					}
					switch {
					case err == nil:
						r.p.Sent++
						r.p.Done++
					case IsOutage(err) || isDestinationOutage(err):
						outage = true
						again = append(again, i)
					case IsPermanent(err) || attempts[i]+1 >= r.cfg.MaxAttempts:
						r.p.Failed++
						r.p.Done++
						r.log.Warn("replay: the destination rejected a message for good; going on", "event_id", wave[i].ID, "topic", wave[i].Topic, "key", wave[i].Key, "err", err)
					default:
						attempts[i]++
						again = append(again, i)
					}
				}
			})
		}
		wg.Wait()
		if err := ctx.Err(); err != nil {
			return err
		}
		pending = again
		if len(pending) == 0 {
			break
		}
		// Outages are waited out (the destination comes back); rejections are tried
		// again after a shorter pause.
		delay := backoff(1, 100*time.Millisecond, time.Second)
		if outage {
			outages++
			delay = backoff(outages, 500*time.Millisecond, 30*time.Second)
			r.log.Warn("replay: the destination is unavailable; waiting", "messages", len(pending), "retry_in", delay.Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
	return nil
}

func isDestinationOutage(err error) bool {
	_, ok := AsDestinationOutage(err)
	return ok
}
