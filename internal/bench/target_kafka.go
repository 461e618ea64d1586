package bench

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/brokers"
	"github.com/outboxkit/outbox/outboxkafka"
)

func init() { RegisterTarget(brokers.Kafka, openKafka) }

// kafkaFakeURL names an in-process Kafka cluster (franz-go's kfake: one broker, records
// in memory, no replication) that the run starts and stops itself, for machines without
// Kafka. It shares the CPU with the relay and PostgreSQL, so its rates compare the relay
// with the raw client (the ratio), not with a real cluster.
const kafkaFakeURL = "kafka://kfake"

// kafkaPartitions is the partition count of the topics a run creates.
const kafkaPartitions = 8

// kafkaTarget publishes to topics of its own, with the broker's default replication.
type kafkaTarget struct {
	seeds []string
	admin *kgo.Client
	fake  *kfake.Cluster // set for kafkaFakeURL
}

func openKafka(ctx context.Context, url string) (Target, error) {
	t := &kafkaTarget{}
	if strings.TrimSpace(url) == kafkaFakeURL {
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return nil, fmt.Errorf("start an in-process Kafka cluster: %w", err)
		}
		t.fake, t.seeds = c, c.ListenAddrs()
	} else {
		var err error
		if t.seeds, err = outboxkafka.Seeds(url); err != nil {
			return nil, err
		}
	}
	admin, err := kgo.NewClient(kgo.SeedBrokers(t.seeds...), kgo.ClientID("outbox-bench"))
	if err == nil {
		if err = admin.Ping(ctx); err != nil {
			admin.Close()
		}
	}
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("connect to Kafka at %s: %w", strings.Join(t.seeds, ","), err)
	}
	t.admin = admin
	return t, nil
}

func (t *kafkaTarget) Prepare(ctx context.Context, name string) (string, func(), error) {
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = name, kafkaPartitions, -1
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, t.admin)
	if err == nil {
		err = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
	}
	if err != nil {
		return "", nil, fmt.Errorf("create topic %s: %w", name, err)
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req := kmsg.NewPtrDeleteTopicsRequest()
		rt := kmsg.NewDeleteTopicsRequestTopic()
		rt.Topic = kmsg.StringPtr(name)
		req.Topics, req.TopicNames = append(req.Topics, rt), []string{name}
		_, _ = req.RequestWith(ctx, t.admin)
	}
	return name, drop, nil
}

func (t *kafkaTarget) Broker() (string, brokers.Settings) {
	return "kafka://" + strings.Join(t.seeds, ","), brokers.Settings{}
}

// Raw produces every message at once with promises, through a client Dial builds with
// the publisher's defaults (acks=all, idempotent, snappy, no linger, at most 10,000
// records buffered: Produce waits for room), then waits for the last acknowledgement.
// The records are built by the publisher's own code (outboxkafka.Publisher.Record).
func (t *kafkaTarget) Raw(ctx context.Context, route string, msgs []*outbox.Message) error {
	pub, err := outboxkafka.Dial(ctx, t.seeds, outboxkafka.Config{Route: route})
	if err != nil {
		return err
	}
	defer pub.Close()
	cl := pub.Client()
	var (
		mu    sync.Mutex
		first error
	)
	promise := func(_ *kgo.Record, err error) {
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
	}
	for _, m := range msgs {
		r, err := pub.Record(m)
		if err != nil {
			return err
		}
		cl.Produce(ctx, r, promise)
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	return first
}

func (t *kafkaTarget) Close() {
	if t.admin != nil {
		t.admin.Close()
	}
	if t.fake != nil {
		t.fake.Close()
	}
}
