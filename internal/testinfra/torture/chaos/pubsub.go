package chaos

import (
	"context"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testproxy"
	"github.com/outboxkit/outbox/internal/testinfra/torture"
	"github.com/outboxkit/outbox/internal/testinfra/torture/nemesis"
	"github.com/outboxkit/outbox/outboxpubsub"
)

const (
	pubsubProject = "torture"
	pubsubTopic   = "torture"
)

func init() {
	register("pubsub", brokerKind{
		new: func() Broker { return &pubsubBroker{} },
		dial: func(ctx context.Context, url, route string) (Publisher, error) {
			return outboxpubsub.Dial(ctx, url, outboxpubsub.Config{Route: route})
		},
	})
}

// pubsubBroker is the Pub/Sub client library's fake server (pstest), in the test
// process, with the run's topic; relay processes reach it through a proxy. It keeps
// everything in memory, so it has no restart fault: its faults are the proxy's (cut,
// latency, blackhole), an outage as the relays see one.
type pubsubBroker struct {
	srv   *pstest.Server
	proxy *testproxy.Proxy
}

func (b *pubsubBroker) Start(tb testenv.TB) {
	b.srv = pstest.NewServer()
	tb.Cleanup(func() { _ = b.srv.Close() })
	ctx := testenv.Context(tb)
	admin, err := outboxpubsub.Dial(ctx, "pubsub://"+pubsubProject+"?endpoint="+b.srv.Addr, outboxpubsub.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Client().TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: b.topicName()}); err != nil {
		tb.Fatalf("create topic: %v", err)
	}
	b.proxy = testproxy.New(tb, b.srv.Addr)
}

func (b *pubsubBroker) topicName() string {
	return "projects/" + pubsubProject + "/topics/" + pubsubTopic
}

func (b *pubsubBroker) RelayURL() string {
	return "pubsub://" + pubsubProject + "?endpoint=" + b.proxy.Addr()
}
func (b *pubsubBroker) Route() string { return pubsubTopic }

func (b *pubsubBroker) Faults(tb testenv.TB) []nemesis.Fault {
	return brokerProxyFaults(tb, b.proxy)
}

// ReadBack reads every message the server stored on the topic, in the order it stored
// them, checking that each carries its key as the ordering key. Arrived is the time the
// server took it.
func (b *pubsubBroker) ReadBack(tb testenv.TB, log *torture.DeliveryLog) {
	tb.Helper()
	for i, m := range b.srv.Messages() {
		if m.Topic != b.topicName() {
			tb.Fatalf("message %d went to topic %q, not the run's", i, m.Topic)
		}
		payload, headers := outboxpubsub.Decode(&pubsub.Message{Data: m.Data, Attributes: m.Attributes, OrderingKey: m.OrderingKey})
		if k := headers[outbox.HeaderKey]; outboxpubsub.OrderingKey(k) != m.OrderingKey {
			tb.Fatalf("message %d (%s): ordering key %q, want the key %q's", i, m.ID, m.OrderingKey, k)
		}
		d, err := torture.ParseDelivery(headers, payload)
		if err != nil {
			tb.Fatalf("message %d (%s): %v", i, m.ID, err)
		}
		d.Arrived = m.PublishTime
		d.Dest = m.Topic
		log.Add(d)
	}
}
