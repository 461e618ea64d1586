package outboxkafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outbox"
)

// DeadLetter is a record that Consume dead-lettered, as read back from its
// ConsumerConfig.DeadLetterTopic.
type DeadLetter struct {
	Partition int32     // partition of the dead-letter topic
	Offset    int64     // offset in that partition
	Time      time.Time // when it was dead-lettered (the record's timestamp)

	ID              string // the Outbox-Id header, if any
	Topic           string // the topic it was consumed from (HeaderDeadTopic)
	SourcePartition int32  // its partition there (HeaderDeadPartition)
	SourceOffset    int64  // its offset there (HeaderDeadOffset)
	Group           string // the consumer group that dead-lettered it
	Reason          string // the handler's last error
	Attempts        int    // handler calls before it was dead-lettered

	Key     []byte
	Headers []kgo.RecordHeader // as stored, the Outbox-Dead-* ones included
	Payload []byte
}

// ListDead reads the dead-letter topic from the start of each partition up to where the
// partition ended when ListDead began, and returns the dead letters by partition, then
// offset: at most limit of them (0 means all), the oldest of each partition first.
// Kafka cannot delete single records, so a dead letter stays listed after ReplayDead,
// until the topic's retention removes it. Without a deadline on ctx, ListDead gives up
// after a minute.
//
// It builds a client of its own from seeds and opts (kgo.DialTLSConfig, kgo.SASL, ...).
func ListDead(ctx context.Context, seeds []string, topic string, limit int, opts ...kgo.Opt) ([]DeadLetter, error) {
	if len(seeds) == 0 {
		return nil, &outbox.ConfigError{Field: "seeds", Reason: "no seed broker given"}
	}
	if reason := checkTopic(topic); reason != "" {
		return nil, fmt.Errorf("outboxkafka: dead-letter topic %q: %s", topic, reason)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Minute)
		defer cancel()
	}
	meta, err := kgo.NewClient(append(slices.Clone(opts), kgo.SeedBrokers(seeds...))...)
	if err != nil {
		return nil, fmt.Errorf("outboxkafka: client for %s: %w", strings.Join(seeds, ","), err)
	}
	starts, ends, err := partitionBounds(ctx, meta, topic)
	meta.Close()
	if err != nil {
		return nil, fmt.Errorf("outboxkafka: read dead-letter topic %s: %w", topic, err)
	}
	from := map[int32]kgo.Offset{}
	for p, end := range ends {
		if starts[p] < end {
			from[p] = kgo.NewOffset().At(starts[p])
		}
	}
	if len(from) == 0 {
		return nil, nil
	}
	cl, err := kgo.NewClient(append(slices.Clone(opts), kgo.SeedBrokers(seeds...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(fetchMaxWait))...)
	if err != nil {
		return nil, fmt.Errorf("outboxkafka: client for %s: %w", strings.Join(seeds, ","), err)
	}
	defer cl.Close()

	var out []DeadLetter
	for len(from) > 0 && (limit <= 0 || len(out) < limit) {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("outboxkafka: read dead-letter topic %s: %w", topic, err)
		}
		var ferr error
		fs.EachError(func(_ string, p int32, err error) { ferr = fmt.Errorf("partition %d: %w", p, err) })
		if ferr != nil {
			return nil, fmt.Errorf("outboxkafka: read dead-letter topic %s: %w", topic, ferr)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if _, reading := from[r.Partition]; !reading || r.Offset >= ends[r.Partition] {
				return
			}
			if r.Offset+1 >= ends[r.Partition] {
				delete(from, r.Partition)
			}
			if limit <= 0 || len(out) < limit {
				out = append(out, deadLetter(r))
			}
		})
	}
	slices.SortFunc(out, func(a, b DeadLetter) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	return out, nil
}

// partitionBounds returns the first and the next offset of each partition of topic.
func partitionBounds(ctx context.Context, cl *kgo.Client, topic string) (starts, ends map[int32]int64, err error) {
	mreq := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	mreq.Topics = append(mreq.Topics, mt)
	mresp, err := mreq.RequestWith(ctx, cl)
	if err != nil {
		return nil, nil, err
	}
	if len(mresp.Topics) != 1 {
		return nil, nil, fmt.Errorf("the broker answered for %d topics", len(mresp.Topics))
	}
	if err := kerr.ErrorForCode(mresp.Topics[0].ErrorCode); err != nil {
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			return nil, nil, fmt.Errorf("topic %q does not exist: %w", topic, ErrNoTopic)
		}
		return nil, nil, err
	}
	offsets := func(timestamp int64) (map[int32]int64, error) {
		req := kmsg.NewPtrListOffsetsRequest()
		req.IsolationLevel = 1 // read committed
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = topic
		for _, p := range mresp.Topics[0].Partitions {
			rp := kmsg.NewListOffsetsRequestTopicPartition()
			rp.Partition, rp.Timestamp = p.Partition, timestamp
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return nil, err
		}
		out := map[int32]int64{}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					return nil, fmt.Errorf("partition %d: %w", p.Partition, err)
				}
				out[p.Partition] = p.Offset
			}
		}
		return out, nil
	}
	if starts, err = offsets(-2); err != nil { // earliest
		return nil, nil, err
	}
	if ends, err = offsets(-1); err != nil { // latest (the last stable offset)
		return nil, nil, err
	}
	return starts, ends, nil
}

func deadLetter(r *kgo.Record) DeadLetter {
	d := DeadLetter{Partition: r.Partition, Offset: r.Offset, Time: r.Timestamp, Key: r.Key, Headers: r.Headers, Payload: r.Value}
	for _, h := range r.Headers {
		v := string(h.Value)
		switch h.Key {
		case outbox.HeaderID:
			if d.ID == "" {
				d.ID = v
			}
		case HeaderDeadTopic:
			d.Topic = v
		case HeaderDeadPartition:
			p, _ := strconv.ParseInt(v, 10, 32)
			d.SourcePartition = int32(p)
		case HeaderDeadOffset:
			d.SourceOffset, _ = strconv.ParseInt(v, 10, 64)
		case HeaderDeadGroup:
			d.Group = v
		case HeaderDeadReason:
			d.Reason = v
		case HeaderDeadAttempts:
			d.Attempts, _ = strconv.Atoi(v)
		}
	}
	return d
}

// ReplayDead produces dead letters (from ListDead) back to the topics they were consumed
// from, one at a time and in order, with their key, value and headers less the
// Outbox-Dead-* ones, each acknowledged with acks=all before the next is produced. It
// returns how many it replayed; on an error, those replayed before it stay replayed.
// List the dead letters first to see what would be replayed (a dry run), and replay
// them in batches of a size you choose.
//
// A replayed record is a new record at the end of its partition (the same partition for
// the same key, with the default partitioner), behind records of its key that came
// after it. Every consumer group of the topic receives it, not only the one that
// dead-lettered it: consumers with an inbox skip it if they handled it before, by its
// Outbox-Id, which the replay keeps. Replaying a dead letter twice produces two
// copies.
//
// It builds a client of its own from seeds and opts.
func ReplayDead(ctx context.Context, seeds []string, dead []DeadLetter, opts ...kgo.Opt) (int, error) {
	if len(seeds) == 0 {
		return 0, &outbox.ConfigError{Field: "seeds", Reason: "no seed broker given"}
	}
	if len(dead) == 0 {
		return 0, nil
	}
	cl, err := kgo.NewClient(append(slices.Clone(opts), kgo.SeedBrokers(seeds...), kgo.RequiredAcks(kgo.AllISRAcks()))...)
	if err != nil {
		return 0, fmt.Errorf("outboxkafka: client for %s: %w", strings.Join(seeds, ","), err)
	}
	defer cl.Close()
	for i, d := range dead {
		if reason := checkTopic(d.Topic); reason != "" {
			return i, fmt.Errorf("outboxkafka: dead letter at partition %d offset %d has no valid %s header (%s): not written by Consume", d.Partition, d.Offset, HeaderDeadTopic, reason)
		}
		r := &kgo.Record{Topic: d.Topic, Key: d.Key, Value: d.Payload}
		for _, h := range d.Headers {
			if !isDeadHeader(h.Key) {
				r.Headers = append(r.Headers, h)
			}
		}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			return i, fmt.Errorf("outboxkafka: replay dead letter at partition %d offset %d to %s: %w", d.Partition, d.Offset, d.Topic, classify(err, d.Topic))
		}
	}
	return len(dead), nil
}
