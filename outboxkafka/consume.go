package outboxkafka

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/lanes"
)

// ConsumerConfig configures Consume. Group and Topics are required.
type ConsumerConfig struct {
	// Group names the consumer group. The members of a group share the partitions of
	// Topics, each partition read by one member at a time, and the group's committed
	// offsets say where each partition resumes. Required.
	Group string
	// Topics are the topics to consume, by name. Required; they must exist when Consume
	// starts.
	Topics []string

	// MaxAttempts is how many times the handler is called for one record, in place,
	// before the record is dead-lettered. -1 retries without limit: the partition waits
	// for the record until the handler succeeds or returns an outbox.Permanent error.
	// Defaults to 5 (MaxAttemptsDefault).
	MaxAttempts int
	// RetryDelay is the pause before the next attempt after a handler error not made
	// with outbox.Retry, and before producing a dead letter again after a failure.
	// Defaults to 1s.
	RetryDelay time.Duration
	// DeadLetterTopic, when set, receives a copy of every dead-lettered record (key,
	// value and headers, with HeaderDeadTopic, HeaderDeadPartition, HeaderDeadOffset,
	// HeaderDeadGroup, HeaderDeadReason and HeaderDeadAttempts added), produced with
	// acks=all before the record's offset is committed. It must exist when Consume
	// starts and must not be one of Topics. When empty, a dead-lettered record is logged
	// at error level and skipped: it stays in its topic at its offset (until retention
	// deletes it) and nothing else keeps it.
	DeadLetterTopic string

	// Concurrency caps how many handlers run at once over all partitions. Defaults to 0:
	// one per partition the member is assigned, no cap.
	Concurrency int
	// QueueSize is how many fetched records one partition may have waiting for its
	// handler. A partition whose queue is full stops being fetched until the queue is
	// half empty, so a partition held up by a record bounds its own memory and does not
	// hold up the others. Defaults to 500.
	QueueSize int
	// ShutdownTimeout bounds, once ctx is done and the handlers in progress have
	// finished, the final offset commit and leaving the group. Defaults to 10s.
	ShutdownTimeout time.Duration
	// Logger receives one line per retry, dead letter and failed commit. Defaults to
	// none.
	Logger *slog.Logger

	// TLS, when set, makes the client connect with TLS. Defaults to plain TCP.
	TLS *tls.Config
	// SASL, when set, authenticates the client (see Config.SASL). Defaults to none.
	SASL sasl.Mechanism
	// ClientID is the client id the client sends. Defaults to "outboxkafka".
	ClientID string
}

// Defaults of ConsumerConfig.
const (
	MaxAttemptsDefault     = 5
	RetryDelayDefault      = time.Second
	QueueSizeDefault       = 500
	ShutdownTimeoutDefault = 10 * time.Second
)

// Headers added to a record that Consume dead-letters to ConsumerConfig.DeadLetterTopic,
// next to the record's own headers. A dead-lettered record's earlier Outbox-Dead-*
// headers (a replayed record that died again) are replaced, not repeated.
const (
	HeaderDeadTopic     = "Outbox-Dead-Topic"     // the topic it was consumed from
	HeaderDeadPartition = "Outbox-Dead-Partition" // its partition there
	HeaderDeadOffset    = "Outbox-Dead-Offset"    // its offset there
	HeaderDeadGroup     = "Outbox-Dead-Group"     // the consumer group that gave up
	HeaderDeadReason    = "Outbox-Dead-Reason"    // the handler's last error
	HeaderDeadAttempts  = "Outbox-Dead-Attempts"  // how many times the handler was called
)

// Timeouts of one offset commit and of one dead-letter produce, and how long a fetch
// waits for records (Kafka's fetch.max.wait.ms default).
const (
	commitTimeout  = 10 * time.Second
	produceTimeout = 10 * time.Second
	fetchMaxWait   = 500 * time.Millisecond
)

func (c ConsumerConfig) withDefaults() ConsumerConfig {
	c.MaxAttempts = cmp.Or(c.MaxAttempts, MaxAttemptsDefault)
	c.RetryDelay = cmp.Or(c.RetryDelay, RetryDelayDefault)
	c.QueueSize = cmp.Or(c.QueueSize, QueueSizeDefault)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, ShutdownTimeoutDefault)
	c.ClientID = cmp.Or(c.ClientID, "outboxkafka")
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// Validate checks c as the consume functions do, without connecting: a
// *outbox.ConfigError names the field at fault.
func (c ConsumerConfig) Validate() error { return c.validate() }

func (c ConsumerConfig) validate() error {
	switch {
	case c.Group == "":
		return &outbox.ConfigError{Field: "Group", Reason: "required: name the consumer group"}
	case len(c.Topics) == 0:
		return &outbox.ConfigError{Field: "Topics", Reason: "required: name at least one topic"}
	case c.MaxAttempts < -1:
		return &outbox.ConfigError{Field: "MaxAttempts", Reason: "must be positive, 0 for the default or -1 for no limit"}
	case c.RetryDelay < 0:
		return &outbox.ConfigError{Field: "RetryDelay", Reason: "must not be negative"}
	case c.Concurrency < 0:
		return &outbox.ConfigError{Field: "Concurrency", Reason: "must not be negative"}
	case c.QueueSize < 0:
		return &outbox.ConfigError{Field: "QueueSize", Reason: "must not be negative"}
	case c.ShutdownTimeout < 0:
		return &outbox.ConfigError{Field: "ShutdownTimeout", Reason: "must not be negative"}
	}
	for _, t := range c.Topics {
		if reason := checkTopic(t); reason != "" {
			return &outbox.ConfigError{Field: "Topics", Reason: fmt.Sprintf("%q: %s", t, reason)}
		}
	}
	if c.DeadLetterTopic != "" {
		if reason := checkTopic(c.DeadLetterTopic); reason != "" {
			return &outbox.ConfigError{Field: "DeadLetterTopic", Reason: fmt.Sprintf("%q: %s", c.DeadLetterTopic, reason)}
		}
		if slices.Contains(c.Topics, c.DeadLetterTopic) {
			return &outbox.ConfigError{Field: "DeadLetterTopic", Reason: fmt.Sprintf("%q is also consumed: dead letters would come back to the handler", c.DeadLetterTopic)}
		}
	}
	return nil
}

// Consume joins the consumer group cfg.Group on the brokers seeds, runs handler for the
// records of cfg.Topics until ctx is done, then lets the handlers in progress finish,
// commits, leaves the group and returns nil. It returns early with an error if the
// configuration is invalid, a topic does not exist (errors.Is(err, ErrNoTopic)) or the
// brokers cannot be reached at start.
//
// The records of one partition are handled one at a time, in offset order, by a
// goroutine of their own; partitions are handled in parallel. A record's offset is
// committed only after handler returned nil for it or it was dead-lettered, so the
// group resumes after the last record handled. A handler error is retried in place,
// holding up the record's partition (which keeps its order), after
// outbox.RetryDelay(err, cfg.RetryDelay), until cfg.MaxAttempts calls; after that, or
// at once for outbox.Permanent errors, the record is dead-lettered (see
// ConsumerConfig.DeadLetterTopic). Delivery is at least once: wrap handler with
// outbox.InboxHandler for exactly-once effects. See the package documentation,
// section Consuming, for rebalances, shutdown and what is delivered twice.
//
// Consume builds the client itself, from seeds, cfg and opts (kgo.Dialer,
// kgo.SessionTimeout, kgo.ConsumeResetOffset, ...), and closes it before it returns.
// It sets kgo.ConsumerGroup, kgo.ConsumeTopics, kgo.DisableAutoCommit,
// kgo.BlockRebalanceOnPoll, kgo.OnPartitionsRevoked, kgo.OnPartitionsLost and
// kgo.RequiredAcks(kgo.AllISRAcks()) after opts, replacing any given there; opts
// override its defaults, kgo.FetchIsolationLevel(kgo.ReadCommitted()) and the client
// settings of cfg. Do not pass kgo.ConsumeRegex or kgo.ConsumePartitions.
//
// Handlers get a context that is not cancelled when ctx is: work in progress finishes
// during shutdown and rebalances. Give handlers their own timeouts, shorter than the
// group's rebalance timeout (kgo.RebalanceTimeout, 60s by default), or a rebalance
// waiting for one may remove this member from the group.
func Consume(ctx context.Context, seeds []string, cfg ConsumerConfig, handler outbox.Handler, opts ...kgo.Opt) error {
	if len(seeds) == 0 {
		return &outbox.ConfigError{Field: "seeds", Reason: "no seed broker given"}
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	if handler == nil {
		return &outbox.ConfigError{Field: "handler", Reason: "required"}
	}
	cfg = cfg.withDefaults()
	r := &runner{
		cfg:       cfg,
		hctx:      context.WithoutCancel(ctx),
		log:       cfg.Logger.With("group", cfg.Group),
		paused:    map[topicPartition]bool{},
		marks:     map[topicPartition]kgo.EpochOffset{},
		committed: map[topicPartition]kgo.EpochOffset{},
		kick:      make(chan struct{}, 1),
	}
	// A partition is a lane: its records are handled one at a time in offset order,
	// which is what lets a handled record's offset be committed. Records fetched and
	// not started are abandoned at shutdown (Quit) and stay uncommitted.
	r.lanes = lanes.New(lanes.Config{
		Handler:     handler,
		Context:     r.hctx,
		Limit:       cfg.Concurrency,
		MaxAttempts: cfg.MaxAttempts,
		RetryDelay:  cfg.RetryDelay,
		Quit:        ctx.Done(),
	})
	defaults := []kgo.Opt{
		kgo.ClientID(cfg.ClientID),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// A partition resumed after a pause is fetched with the next fetch request: do
		// not let an idle long poll hold it for franz-go's default of 5 s.
		kgo.FetchMaxWait(fetchMaxWait),
	}
	if cfg.TLS != nil {
		defaults = append(defaults, kgo.DialTLSConfig(cfg.TLS))
	}
	if cfg.SASL != nil {
		defaults = append(defaults, kgo.SASL(cfg.SASL))
	}
	required := []kgo.Opt{
		kgo.SeedBrokers(seeds...),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topics...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(r.revoked),
		kgo.OnPartitionsLost(r.lost),
		kgo.RequiredAcks(kgo.AllISRAcks()),
	}
	where := strings.Join(seeds, ",")
	cl, err := kgo.NewClient(slices.Concat(defaults, opts, required)...)
	if err != nil {
		return fmt.Errorf("outboxkafka: consumer client for %s: %w", where, err)
	}
	r.cl = cl
	if err := checkTopics(ctx, cl, append(slices.Clone(cfg.Topics), cfg.DeadLetterTopic)); err != nil {
		cl.Close()
		return fmt.Errorf("outboxkafka: consume from %s: %w", where, err)
	}
	r.run(ctx)
	return nil
}

// checkTopics returns an error matching ErrNoTopic for the first of topics that does not
// exist (empty names are skipped), or another error if it cannot tell.
func checkTopics(ctx context.Context, cl *kgo.Client, topics []string) error {
	ctx, cancel := withPingTimeout(ctx)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	for _, t := range topics {
		if t != "" {
			rt := kmsg.NewMetadataRequestTopic()
			rt.Topic = kmsg.StringPtr(t)
			req.Topics = append(req.Topics, rt)
		}
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("look up topics: %w", err)
	}
	for _, t := range resp.Topics {
		name := ""
		if t.Topic != nil {
			name = *t.Topic
		}
		switch err := kerr.ErrorForCode(t.ErrorCode); {
		case errors.Is(err, kerr.UnknownTopicOrPartition):
			return fmt.Errorf("topic %q does not exist: create it before starting the consumer, or fix ConsumerConfig.Topics or DeadLetterTopic: %w", name, ErrNoTopic)
		case err != nil:
			return fmt.Errorf("look up topic %q: %w", name, err)
		}
	}
	return nil
}

type topicPartition struct {
	topic     string
	partition int32
}

// runner is one Consume call: the poll loop, a lane per partition with records, and
// the committer.
type runner struct {
	cfg   ConsumerConfig
	hctx  context.Context // handlers' base context: never cancelled
	log   *slog.Logger
	cl    *kgo.Client
	lanes *lanes.Runner

	// qmu makes a partition's fetch pause follow its lane's length: the length is read
	// and the pause changed under it, on queueing and on starting a record.
	qmu    sync.Mutex
	paused map[topicPartition]bool // fetching of the partition is paused: its lane is full

	mu        sync.Mutex
	marks     map[topicPartition]kgo.EpochOffset // next offset to consume, per handled partition
	committed map[topicPartition]kgo.EpochOffset // what the group last accepted of marks

	// commitMu makes each commit take its snapshot of marks and send it before any
	// other commit takes one, so that commits reach the group in order and never rewind
	// a partition; a revoke's commit also forgets the partitions under it.
	commitMu sync.Mutex
	kick     chan struct{} // a record was marked
}

// run polls and hands records to the partitions' lanes until ctx is done, then shuts
// down.
func (r *runner) run(ctx context.Context) {
	cctx, stopCommitter := context.WithCancel(r.hctx)
	committerDone := make(chan struct{})
	go func() {
		defer close(committerDone)
		r.commitLoop(cctx)
	}()

	for {
		// With BlockRebalanceOnPoll, no rebalance runs between this poll and
		// AllowRebalance: the records go to lanes of partitions still assigned.
		fs := r.cl.PollRecords(ctx, r.cfg.QueueSize)
		if ctx.Err() != nil || fs.IsClientClosed() {
			r.cl.AllowRebalance()
			break
		}
		fs.EachError(func(topic string, partition int32, err error) {
			r.log.Warn("fetch failed; the client retries", "topic", topic, "partition", partition, "err", err)
		})
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) > 0 {
				r.push(topicPartition{p.Topic, p.Partition}, p.Records)
			}
		})
		r.cl.AllowRebalance()
	}

	// Shutdown: records polled but not started stay uncommitted for the next owner.
	r.lanes.Stop()
	r.resume(nil)
	stopCommitter()
	<-committerDone
	sctx, cancel := context.WithTimeout(r.hctx, r.cfg.ShutdownTimeout)
	defer cancel()
	if err := r.commit(sctx, nil, false); err != nil {
		r.log.Warn("final offset commit failed; records handled since the last commit will be delivered again", "err", err)
	}
	// Leaving runs the revoke callback one last time, with nothing left to do.
	if err := r.cl.LeaveGroupContext(sctx); err != nil {
		r.log.Warn("leaving the group failed; its partitions wait for the session timeout", "err", err)
	}
	r.cl.Close()
}

// lane names the lane of k: a partition is the unit of order and of commits.
func (k topicPartition) lane() string {
	return k.topic + "/" + strconv.FormatInt(int64(k.partition), 10)
}

// push queues records on their partition's lane, pausing the partition's fetches when the
// lane is full.
func (r *runner) push(k topicPartition, records []*kgo.Record) {
	r.qmu.Lock()
	defer r.qmu.Unlock()
	for _, rec := range records {
		r.lanes.Go(k.lane(), func(t *lanes.Turn) {
			r.started(k)
			r.process(t, rec)
		})
	}
	if !r.paused[k] && r.lanes.Len(k.lane()) >= r.cfg.QueueSize {
		r.paused[k] = true
		r.cl.PauseFetchPartitions(map[string][]int32{k.topic: {k.partition}})
	}
}

// started notes that a record of k left its lane's queue: a paused partition is fetched
// again once its lane is half empty.
func (r *runner) started(k topicPartition) {
	r.qmu.Lock()
	defer r.qmu.Unlock()
	if r.paused[k] && r.lanes.Len(k.lane()) <= r.cfg.QueueSize/2 {
		delete(r.paused, k)
		r.cl.ResumeFetchPartitions(map[string][]int32{k.topic: {k.partition}})
	}
}

// stop stops the lanes of partitions: each abandons its queue and its retry waits,
// finishes the handler call in progress and marks what it completed. stop returns when
// all have.
func (r *runner) stop(partitions []topicPartition) {
	keys := make([]string, len(partitions))
	for i, k := range partitions {
		keys[i] = k.lane()
	}
	r.lanes.Drop(keys...)
	r.resume(partitions)
}

// resume lifts the fetch pause of partitions (nil: all). A pause outlives the
// assignment: a partition that came back to this member would never be fetched again.
func (r *runner) resume(partitions []topicPartition) {
	r.qmu.Lock()
	defer r.qmu.Unlock()
	if partitions == nil {
		partitions = slices.Collect(maps.Keys(r.paused))
	}
	for _, k := range partitions {
		if r.paused[k] {
			delete(r.paused, k)
			r.cl.ResumeFetchPartitions(map[string][]int32{k.topic: {k.partition}})
		}
	}
}

// revoked is the OnPartitionsRevoked callback: the partitions go to another member
// once it returns. It finishes their work in progress and commits what was handled, so
// the next owner starts after the last handled record.
func (r *runner) revoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	tps := flatten(revoked)
	r.stop(tps)
	ctx, cancel := context.WithTimeout(ctx, commitTimeout)
	defer cancel()
	if err := r.commit(ctx, tps, true); err != nil {
		r.log.Warn("offset commit on revoke failed; the next owner handles again the records handled since the last commit", "err", err)
	}
}

// lost is the OnPartitionsLost callback: the member was removed from the group (its
// session expired, ...) and its commits would be refused. The next owner starts at the
// last commit.
func (r *runner) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	tps := flatten(lost)
	r.stop(tps)
	r.commitMu.Lock()
	r.forget(tps)
	r.commitMu.Unlock()
	if len(tps) > 0 {
		r.log.Warn("partitions lost; records handled since the last commit will be delivered again", "partitions", len(tps))
	}
}

func flatten(m map[string][]int32) []topicPartition {
	var out []topicPartition
	for t, ps := range m {
		for _, p := range ps {
			out = append(out, topicPartition{t, p})
		}
	}
	return out
}

// mark records that rec is done: its partition resumes after it.
func (r *runner) mark(rec *kgo.Record) {
	r.mu.Lock()
	r.marks[topicPartition{rec.Topic, rec.Partition}] = kgo.EpochOffset{Epoch: rec.LeaderEpoch, Offset: rec.Offset + 1}
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// commitLoop commits marked offsets as they come: one commit at a time, each covering
// everything marked since the one before, so that commits keep up with any rate of
// records at one request per round trip. A failed commit is tried again after
// RetryDelay.
func (r *runner) commitLoop(ctx context.Context) {
	var retry <-chan time.Time
	for {
		select {
		case <-r.kick:
		case <-retry:
		case <-ctx.Done():
			return
		}
		retry = nil
		cctx, cancel := context.WithTimeout(ctx, commitTimeout)
		err := r.commit(cctx, nil, false)
		cancel()
		if err != nil && ctx.Err() == nil {
			r.log.Warn("offset commit failed; retrying", "retry_in", r.cfg.RetryDelay, "err", err)
			retry = time.After(r.cfg.RetryDelay)
		}
	}
}

// commit commits the marks of partitions (nil: all) that the group has not accepted
// yet. With forget, it then drops those partitions' marks: they are being revoked.
func (r *runner) commit(ctx context.Context, partitions []topicPartition, forget bool) error {
	r.commitMu.Lock()
	defer r.commitMu.Unlock()
	if forget {
		defer r.forget(partitions)
	}
	r.mu.Lock()
	offsets := map[string]map[int32]kgo.EpochOffset{}
	add := func(k topicPartition) {
		eo, ok := r.marks[k]
		if !ok || r.committed[k] == eo {
			return
		}
		if offsets[k.topic] == nil {
			offsets[k.topic] = map[int32]kgo.EpochOffset{}
		}
		offsets[k.topic][k.partition] = eo
	}
	if partitions == nil {
		for k := range r.marks {
			add(k)
		}
	} else {
		for _, k := range partitions {
			add(k)
		}
	}
	r.mu.Unlock()
	if len(offsets) == 0 {
		return nil
	}

	var errs []error
	r.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			errs = append(errs, err)
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					errs = append(errs, fmt.Errorf("topic %q partition %d: %w", t.Topic, p.Partition, err))
					continue
				}
				k := topicPartition{t.Topic, p.Partition}
				if eo, ok := offsets[t.Topic][p.Partition]; ok {
					r.committed[k] = eo
				}
			}
		}
	})
	return errors.Join(errs...)
}

// forget drops the marks of partitions. Call it with commitMu held.
func (r *runner) forget(partitions []topicPartition) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range partitions {
		delete(r.marks, k)
		delete(r.committed, k)
	}
}

// process handles rec in its turn until it succeeds or is dead-lettered, and marks it.
// It leaves rec unmarked when the lane is stopped first.
func (r *runner) process(t *lanes.Turn, rec *kgo.Record) {
	for attempt := 1; ; attempt++ {
		d := NewDelivery(rec, attempt)
		out, ok := t.Handle(d)
		if !ok {
			return
		}
		if out.Err == nil {
			r.mark(rec)
			return
		}
		log := r.log.With("event_id", d.ID, "aggregate_id", d.Key, "event_type", d.EventType,
			"topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "attempt", attempt)
		if out.Dead {
			r.deadLetter(t, rec, d, out.Err, log)
			return
		}
		log.Warn("handler failed; retrying in place", "retry_in", out.Delay, "err", out.Err)
		if !t.Sleep(out.Delay) {
			return
		}
	}
}

// deadLetter produces a copy of rec to the dead-letter topic, or skips rec when there is
// none, and marks rec. A failed produce is tried again after RetryDelay, holding up the
// partition, until it succeeds or the lane is stopped (rec unmarked); a copy
// Kafka refuses on its merits (larger than the topic allows, ...) is logged and rec
// skipped, since no retry could help it.
func (r *runner) deadLetter(t *lanes.Turn, rec *kgo.Record, d *outbox.Delivery, cause error, log *slog.Logger) {
	topic := r.cfg.DeadLetterTopic
	if topic == "" {
		log.Error("record skipped: the handler failed and no dead-letter topic is set; it stays in its topic at its offset", "err", cause)
		r.mark(rec)
		return
	}
	for {
		ctx, cancel := context.WithTimeout(r.hctx, produceTimeout)
		err := r.cl.ProduceSync(ctx, r.deadRecord(rec, d, cause)).FirstErr()
		cancel()
		if err == nil {
			log.Error("record dead-lettered", "err", cause, "dead_letter_topic", topic)
			r.mark(rec)
			return
		}
		if err = classify(err, topic); !outbox.IsOutage(err) {
			log.Error("record skipped: the dead-letter topic refused its copy; it stays in its topic at its offset", "err", cause, "dead_letter_err", err)
			r.mark(rec)
			return
		}
		log.Error("dead-lettering failed; retrying", "err", cause, "dead_letter_err", err, "retry_in", r.cfg.RetryDelay)
		if !t.Sleep(r.cfg.RetryDelay) {
			return
		}
	}
}

// deadRecord is the copy of rec that goes to the dead-letter topic.
func (r *runner) deadRecord(rec *kgo.Record, d *outbox.Delivery, cause error) *kgo.Record {
	hs := make([]kgo.RecordHeader, 0, len(rec.Headers)+6)
	for _, h := range rec.Headers {
		if !isDeadHeader(h.Key) {
			hs = append(hs, h)
		}
	}
	for _, h := range [...][2]string{
		{HeaderDeadTopic, rec.Topic},
		{HeaderDeadPartition, strconv.FormatInt(int64(rec.Partition), 10)},
		{HeaderDeadOffset, strconv.FormatInt(rec.Offset, 10)},
		{HeaderDeadGroup, r.cfg.Group},
		{HeaderDeadReason, cause.Error()},
		{HeaderDeadAttempts, strconv.Itoa(d.Attempt)},
	} {
		hs = append(hs, kgo.RecordHeader{Key: h[0], Value: []byte(h[1])})
	}
	return &kgo.Record{Topic: r.cfg.DeadLetterTopic, Key: rec.Key, Value: rec.Value, Headers: hs}
}

func isDeadHeader(name string) bool {
	switch name {
	case HeaderDeadTopic, HeaderDeadPartition, HeaderDeadOffset, HeaderDeadGroup, HeaderDeadReason, HeaderDeadAttempts:
		return true
	}
	return false
}

// NewDelivery returns the outbox.Delivery that Consume hands its handler for r, on the
// given attempt, for consumers that run their own poll loop:
//
//   - ID: the Outbox-Id header, else Outbox-Dedup-Key, else "topic/partition/offset"
//     (for example "orders/3/1042"), which names the record for as long as the topic
//     exists (see outbox.DeliveryID);
//   - Key: the record key, or the Outbox-Key header for a record with a null key;
//   - Destination: the record's topic; Payload: its value (nil for a null value);
//   - Headers: the first value of each header name, as text.
//
// Any header, however malformed (repeated, binary, empty names), gives a Delivery.
func NewDelivery(r *kgo.Record, attempt int) *outbox.Delivery {
	h := make(map[string]string, len(r.Headers))
	for _, rh := range r.Headers {
		if _, dup := h[rh.Key]; !dup {
			h[rh.Key] = string(rh.Value)
		}
	}
	brokerID := r.Topic + "/" + strconv.FormatInt(int64(r.Partition), 10) + "/" + strconv.FormatInt(r.Offset, 10)
	d := outbox.NewDelivery(h, brokerID, r.Topic, r.Value, attempt)
	if r.Key != nil {
		d.Key = string(r.Key)
	}
	return d
}
