// Package demo is `outbox demo`: a small order service that writes orders and their
// events in one transaction (rolling some back), the relay publishing them, and a
// consumer with an inbox, all in one process; then a summary that checks the guarantees
// on what just happened. By default everything is embedded (a SQLite file and a NATS
// JetStream server in the process); flags point it at a real PostgreSQL or NATS.
package demo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxnats"
)

// Config sizes a run. Zero values take the defaults.
type Config struct {
	Orders      int     // orders to place. Defaults to 2,000.
	Writers     int     // concurrent order transactions. Defaults to 8.
	Rollback    float64 // share of order transactions rolled back. Defaults to 0.1.
	Crash       float64 // share of deliveries whose ack is "lost" after the work committed. Defaults to 0.05.
	DatabaseURL string  // PostgreSQL URL; empty means a SQLite file in Dir.
	BrokerURL   string  // NATS URL; empty means an embedded server.
	Dir         string  // where the SQLite file and the embedded server's store go; empty means a temporary directory.
	Command     string  // how the user runs the CLI, for the commands the summary suggests. Defaults to "outbox".
	Out         io.Writer
	Log         *slog.Logger // the relay's and consumer's log; nil discards it
}

func (c Config) withDefaults() Config {
	c.Orders = cmp.Or(c.Orders, 2000)
	c.Writers = cmp.Or(c.Writers, 8)
	c.Command = cmp.Or(c.Command, "outbox")
	if c.Rollback == 0 {
		c.Rollback = 0.1
	}
	if c.Crash == 0 {
		c.Crash = 0.05
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	if c.Log == nil {
		c.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// Events of one order, in the order the service writes them: its key is the order id,
// so the consumer must see them in this order.
var orderEvents = []string{"order.placed", "order.paid"}

// backend is the database side of a run: the order service's transactions, the relay's
// store and the consumer's inbox, over one database.
type backend struct {
	name  string
	store outboxdriver.Store
	admin outboxdriver.Admin
	// placeOrder inserts the order and writes its events in one transaction, then
	// commits it, or rolls it back when rollback is set. It returns when the commit
	// (or rollback) returned.
	placeOrder func(ctx context.Context, id, customer string, cents int, events []outbox.Message, rollback bool) error
	// consume handles deliveries in one transaction: claims their ids in the inbox with
	// one batch claim, and records the effect (a shipment row) of each fresh one. It
	// reports which ids were fresh.
	consume func(ctx context.Context, ds []*outbox.Delivery) (fresh []bool, err error)
	// effects counts the shipment rows and their distinct event ids.
	effects func(ctx context.Context) (rows, distinct int, err error)
	// next is what to run after the demo, to look at what it left; {cli} stands for
	// Config.Command.
	next  []string
	close func()
}

// Result is what a run saw, and the verdict.
type Result struct {
	Committed, RolledBack   int // events
	Delivered, DeliveredRB  int // distinct committed / rolled-back events the consumer handled
	Orders, OrderViolations int
	// LostAcks counts the deliveries whose work committed and whose ack was then "lost"
	// (Config.Crash); Redeliveries the deliveries the inbox found already processed and
	// skipped; Duplicates the effects recorded more than once.
	LostAcks, Redeliveries, Duplicates int
	// Published counts the broker's confirmations the relay saw; PublishedP50 and
	// PublishedP99 are the relay's commit-to-published latency: from the message's
	// created_at (the database's clock, in the writing transaction) to the broker's
	// confirm.
	Published                  int
	PublishedP50, PublishedP99 time.Duration
	// P50 and P99 are commit-to-handled: from the order's COMMIT returning to the
	// consumer's transaction committing.
	P50, P99    time.Duration
	Elapsed     time.Duration
	Interrupted bool
	// Next is what to run after the demo, to look at what it left.
	Next []string
}

// OK reports whether every guarantee held.
func (r Result) OK() bool {
	return !r.Interrupted && r.Delivered == r.Committed && r.DeliveredRB == 0 && r.OrderViolations == 0 && r.Duplicates == 0 &&
		r.Redeliveries >= r.LostAcks
}

// Run runs the demo until every committed event was handled, or ctx ends.
func Run(ctx context.Context, cfg Config) (Result, error) {
	cfg = cfg.withDefaults()
	start := time.Now()
	say := func(format string, args ...any) { fmt.Fprintf(cfg.Out, format+"\n", args...) }

	dir := cfg.Dir
	if dir == "" {
		tmp, err := tempDir()
		if err != nil {
			return Result{}, err
		}
		defer tmp.remove()
		dir = tmp.path
	}
	broker, err := startBroker(ctx, cfg.BrokerURL, dir)
	if err != nil {
		return Result{}, err
	}
	defer broker.close()
	say("broker:   %s", broker.describe)

	var b *backend
	if cfg.DatabaseURL != "" {
		b, err = postgresBackend(ctx, cfg.DatabaseURL)
	} else {
		b, err = sqliteBackend(ctx, dir, cfg.Dir != "")
	}
	if err != nil {
		return Result{}, err
	}
	defer b.close()
	say("database: %s", b.name)

	pub, err := outboxnats.New(broker.js, outboxnats.Config{Route: broker.subjectPrefix + "{topic}"})
	if err != nil {
		return Result{}, err
	}
	t := newTracker()
	relay, err := outbox.NewRelay(b.store, pub, outbox.RelayConfig{ID: "demo-relay", Logger: cfg.Log, PollInterval: 20 * time.Millisecond,
		Observer: publishTimes{t}})
	if err != nil {
		return Result{}, err
	}
	if err := relay.Start(ctx); err != nil {
		return Result{}, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = relay.Stop(sctx)
	}()

	cctx, stopConsumer := context.WithCancel(ctx)
	defer stopConsumer()
	// The handlers (one per lane of keys) hand their deliveries to one committer, which
	// claims and ships everything waiting in one transaction: one commit (one fsync on
	// SQLite) per batch instead of per event.
	// It serves the handlers until the consumer has stopped, and they finished.
	batches := newCommitter(b.consume, consumerBatch)
	commitCtx, stopCommitter := context.WithCancel(context.WithoutCancel(ctx))
	defer stopCommitter()
	go batches.run(commitCtx)
	consumerDone := make(chan error, 1)
	go func() {
		consumerDone <- outboxnats.Consume(cctx, broker.js, outboxnats.ConsumerConfig{
			Stream: broker.stream, Durable: "shipping", Concurrency: consumerBatch, RetryDelay: 10 * time.Millisecond, Logger: cfg.Log,
		}, func(ctx context.Context, d *outbox.Delivery) error {
			fresh, err := batches.consume(ctx, d)
			if err != nil {
				return err
			}
			t.handled(d, fresh)
			if fresh && rand.Float64() < cfg.Crash {
				// The work committed; pretend the process died before the ack. The broker
				// delivers the event again and the inbox must absorb it.
				t.lostAck()
				return outbox.Retry(fmt.Errorf("simulated crash before ack"), 0)
			}
			return nil
		})
	}()

	say("placing %d orders (%d writers, %.0f%% rolled back); the relay publishes, the consumer ships\n", cfg.Orders, cfg.Writers, cfg.Rollback*100)
	writeErr := make(chan error, 1)
	go func() { writeErr <- placeOrders(ctx, cfg, b, t) }()

	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	var res Result
	written := false
loop:
	for {
		select {
		case err := <-writeErr:
			if err != nil && ctx.Err() == nil {
				return res, err
			}
			written = true
		case err := <-consumerDone:
			if ctx.Err() == nil {
				return res, fmt.Errorf("consumer stopped: %w", err)
			}
			break loop
		case <-tick.C:
			if written && t.complete() {
				break loop // the final line follows
			}
			say("%s", t.progress(ctx, b, relay.Stats().Published))
		case <-ctx.Done():
			break loop
		}
	}
	stopConsumer()
	if ctx.Err() == nil {
		<-consumerDone
	}
	stopCommitter()
	res = t.result()
	res.Interrupted = ctx.Err() != nil
	if rows, distinct, err := b.effects(context.WithoutCancel(ctx)); err == nil {
		res.Duplicates = rows - distinct
	}
	res.Elapsed = time.Since(start)
	for _, n := range b.next {
		res.Next = append(res.Next, strings.ReplaceAll(n, "{cli}", cfg.Command))
	}
	say("%s", t.progress(context.WithoutCancel(ctx), b, relay.Stats().Published))
	return res, nil
}

// consumerBatch is the consumer's concurrency, and so the largest batch its committer
// claims in one transaction.
const consumerBatch = 32

// committer runs the consumer's deliveries in batches: one transaction claims every
// delivery waiting (ClaimBatch) and records the fresh ones' effects. Each handler waits
// for its batch to commit, so a delivery is acked only after its work committed, and a
// key's deliveries (one lane, one at a time) stay in order.
type committer struct {
	commit  func(ctx context.Context, ds []*outbox.Delivery) ([]bool, error)
	max     int
	reqs    chan commitReq
	stopped chan struct{} // closed when run returns
}

type commitReq struct {
	d     *outbox.Delivery
	reply chan commitRes
}

type commitRes struct {
	fresh bool
	err   error
}

func newCommitter(consume func(context.Context, []*outbox.Delivery) ([]bool, error), max int) *committer {
	return &committer{commit: consume, max: max, reqs: make(chan commitReq, max), stopped: make(chan struct{})}
}

var errCommitterStopped = errors.New("the consumer's committer stopped")

// consume queues d for the next batch and waits until that batch committed or failed.
func (c *committer) consume(ctx context.Context, d *outbox.Delivery) (bool, error) {
	reply := make(chan commitRes, 1)
	select {
	case c.reqs <- commitReq{d: d, reply: reply}:
	case <-ctx.Done():
		return false, ctx.Err()
	case <-c.stopped:
		return false, errCommitterStopped
	}
	select {
	case r := <-reply:
		return r.fresh, r.err
	case <-c.stopped:
		return false, errCommitterStopped
	}
}

// run commits batches until ctx ends; a batch begun runs to its end.
func (c *committer) run(ctx context.Context) {
	defer close(c.stopped)
	for {
		var batch []commitReq
		select {
		case r := <-c.reqs:
			batch = append(batch, r)
		case <-ctx.Done():
			return
		}
	more:
		for len(batch) < c.max {
			select {
			case r := <-c.reqs:
				batch = append(batch, r)
			default:
				break more
			}
		}
		ds := make([]*outbox.Delivery, len(batch))
		for i, r := range batch {
			ds[i] = r.d
		}
		fresh, err := c.commit(context.WithoutCancel(ctx), ds)
		if err == nil && len(fresh) != len(ds) {
			err = fmt.Errorf("batch claim: %d answers for %d deliveries", len(fresh), len(ds))
		}
		for i, r := range batch {
			res := commitRes{err: err}
			if err == nil {
				res.fresh = fresh[i]
			}
			r.reply <- res
		}
	}
}

// publishTimes is the relay's observer: it times each confirmed message from its
// created_at to the broker's confirm.
type publishTimes struct{ t *tracker }

func (p publishTimes) Running(outbox.RunningEvent)     {}
func (p publishTimes) FetchDone(outbox.FetchEvent)     {}
func (p publishTimes) Rejected(outbox.RejectEvent)     {}
func (p publishTimes) RecordDone(outbox.RecordEvent)   {}
func (p publishTimes) LeasesChanged(outbox.LeaseEvent) {}
func (p publishTimes) Paused(outbox.PauseEvent)        {}

func (p publishTimes) PublishDone(e outbox.PublishEvent) {
	confirmed := e.Start.Add(e.Took)
	p.t.mu.Lock()
	defer p.t.mu.Unlock()
	for i, m := range e.Batch {
		if (e.Errs == nil || e.Errs[i] == nil) && !m.CreatedAt.IsZero() {
			p.t.published = append(p.t.published, max(confirmed.Sub(m.CreatedAt), 0))
		}
	}
}

// placeOrders runs the order service: cfg.Writers goroutines placing cfg.Orders orders.
func placeOrders(ctx context.Context, cfg Config, b *backend, t *tracker) error {
	var next atomic.Int64
	run := randomTag()
	var wg sync.WaitGroup
	errs := make(chan error, cfg.Writers)
	for range cfg.Writers {
		wg.Go(func() {
			for ctx.Err() == nil {
				n := next.Add(1)
				if n > int64(cfg.Orders) {
					return
				}
				id := fmt.Sprintf("order-%s-%05d", run, n) // unique across runs on one --dir
				var events []outbox.Message
				for _, typ := range orderEvents {
					events = append(events, outbox.Message{
						ID: outbox.NewID(), Topic: "orders", Key: id, AggregateType: "order", EventType: typ,
						Payload: fmt.Appendf(nil, `{"order":%q,"event":%q}`, id, typ),
					})
				}
				rollback := rand.Float64() < cfg.Rollback
				// Known before the commit: the relay and the consumer may be done with the
				// events before placeOrder returns.
				t.placing(events, rollback)
				if err := b.placeOrder(ctx, id, fmt.Sprintf("customer-%d", n%97), 100+int(n%5000), events, rollback); err != nil {
					if ctx.Err() == nil {
						errs <- fmt.Errorf("place %s: %w", id, err)
					}
					return
				}
				t.written(events, rollback, time.Now())
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// tracker follows every event from commit to handling.
type tracker struct {
	mu          sync.Mutex
	committedAt map[string]time.Time // event id -> when its transaction committed
	handledAt   map[string]time.Time // event id -> when handled, if before committedAt was known
	rolledBack  map[string]bool
	order       map[string]int // event id -> its index in orderEvents
	seen        map[string]bool
	lastOfKey   map[string]int
	res         Result
	latencies   []time.Duration // commit -> handled
	published   []time.Duration // created_at -> broker confirm (the relay's observer)
}

func newTracker() *tracker {
	return &tracker{committedAt: map[string]time.Time{}, handledAt: map[string]time.Time{}, rolledBack: map[string]bool{},
		order: map[string]int{}, seen: map[string]bool{}, lastOfKey: map[string]int{}}
}

// placing registers an order's events before its transaction ends.
func (t *tracker) placing(events []outbox.Message, rollback bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, m := range events {
		id := m.ID.String()
		t.order[id] = i
		if rollback {
			t.rolledBack[id] = true
		}
	}
}

// written records that an order's transaction committed (or rolled back) at at.
func (t *tracker) written(events []outbox.Message, rollback bool, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range events {
		id := m.ID.String()
		if rollback {
			t.res.RolledBack++
			continue
		}
		t.committedAt[id] = at
		t.res.Committed++
		if h, ok := t.handledAt[id]; ok { // handled before placeOrder returned
			t.latencies = append(t.latencies, max(h.Sub(at), 0))
			delete(t.handledAt, id)
		}
	}
	if !rollback {
		t.res.Orders++
	}
}

func (t *tracker) handled(d *outbox.Delivery, fresh bool) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if !fresh || t.seen[d.ID] {
		t.res.Redeliveries++
		return
	}
	t.seen[d.ID] = true
	idx, ok := t.order[d.ID]
	if !ok {
		return // not from this run
	}
	if t.rolledBack[d.ID] {
		t.res.DeliveredRB++
		return
	}
	t.res.Delivered++
	if at, ok := t.committedAt[d.ID]; ok {
		t.latencies = append(t.latencies, now.Sub(at))
	} else {
		t.handledAt[d.ID] = now
	}
	if last, ok := t.lastOfKey[d.Key]; ok && idx <= last || !ok && idx != 0 {
		t.res.OrderViolations++
	}
	t.lastOfKey[d.Key] = idx
}

func (t *tracker) lostAck() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.res.LostAcks++
}

// complete reports whether every committed event was handled, and every event whose
// ack was lost delivered again (and skipped by the inbox).
func (t *tracker) complete() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.res.Delivered >= t.res.Committed && t.res.Redeliveries >= t.res.LostAcks
}

func (t *tracker) result() Result {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.res
	r.P50, r.P99 = percentiles(t.latencies)
	r.Published = len(t.published)
	r.PublishedP50, r.PublishedP99 = percentiles(t.published)
	return r
}

// percentiles returns the 50th and 99th percentiles of l, or zeros when it is empty.
func percentiles(l []time.Duration) (p50, p99 time.Duration) {
	n := len(l)
	if n == 0 {
		return 0, 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	return s[n*50/100], s[n*99/100]
}

func (t *tracker) progress(ctx context.Context, b *backend, published int64) string {
	r := t.result()
	pending := "?"
	if st, err := b.admin.Status(ctx); err == nil {
		pending = fmt.Sprint(st.Pending)
	}
	return fmt.Sprintf("  written %5d (rolled back %4d) · pending %5s · published %5d · handled %5d · redelivered %4d · p99 commit -> published %s, -> handled %s",
		r.Committed, r.RolledBack, pending, published, r.Delivered, r.Redeliveries, ms(r.PublishedP99), ms(r.P99))
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}

// Summary renders the verdict, one line per guarantee.
func (r Result) Summary() string {
	var b strings.Builder
	check := func(ok bool, format string, args ...any) {
		mark := "ok  "
		if !ok {
			mark = "FAIL"
		}
		fmt.Fprintf(&b, "  %s %s\n", mark, fmt.Sprintf(format, args...))
	}
	fmt.Fprintf(&b, "\nsummary (%s):\n", r.Elapsed.Round(100*time.Millisecond))
	if r.Interrupted {
		fmt.Fprintf(&b, "  stop nothing committed was lost:        not checked: interrupted with %d of %d events handled\n", r.Delivered, r.Committed)
	} else {
		check(r.Delivered == r.Committed, "nothing committed was lost:        %d events committed, %d handled", r.Committed, r.Delivered)
	}
	check(r.DeliveredRB == 0, "nothing rolled back was published:  %d events rolled back, %d handled", r.RolledBack, r.DeliveredRB)
	check(r.OrderViolations == 0, "per-key order held:                 %d orders, %d events out of order", r.Orders, r.OrderViolations)
	check(r.Duplicates == 0 && r.Redeliveries >= r.LostAcks, "duplicates absorbed by the inbox:   %d acks lost after the work committed, %d redeliveries skipped, %d extra effects",
		r.LostAcks, r.Redeliveries, r.Duplicates)
	fmt.Fprintf(&b, "  latency commit -> published: p50 %s, p99 %s (the relay: created_at to broker confirm, %d events)\n", ms(r.PublishedP50), ms(r.PublishedP99), r.Published)
	fmt.Fprintf(&b, "  latency commit -> handled:   p50 %s, p99 %s (to the consumer's commit)\n", ms(r.P50), ms(r.P99))
	for i, n := range r.Next {
		if i == 0 {
			fmt.Fprintf(&b, "\nnext: %s\n", n)
		} else {
			fmt.Fprintf(&b, "      %s\n", n)
		}
	}
	return b.String()
}
