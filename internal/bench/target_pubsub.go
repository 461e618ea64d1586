package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/brokers"
	"github.com/outboxkit/outbox/outboxpubsub"
)

func init() { RegisterTarget(brokers.PubSub, openPubSub) }

// pubsubFakeURL names an in-process Pub/Sub server (the client library's pstest: topics
// and messages in memory) that the run starts and stops itself, for machines without an
// emulator or a project. Its rates compare the relay with the raw client (the ratio),
// not with Google's service.
const pubsubFakeURL = "pubsub://pstest"

// pubsubTarget publishes to topics of its own in the URL's project.
type pubsubTarget struct {
	url  string
	fake *pstest.Server // set for pubsubFakeURL
	pub  *outboxpubsub.Publisher
}

func openPubSub(ctx context.Context, url string) (Target, error) {
	t := &pubsubTarget{url: strings.TrimSpace(url)}
	if t.url == pubsubFakeURL {
		t.fake = pstest.NewServer()
		t.url = "pubsub://bench?endpoint=" + t.fake.Addr
	}
	pub, err := outboxpubsub.Dial(ctx, t.url, outboxpubsub.Config{})
	if err != nil {
		t.Close()
		return nil, err
	}
	t.pub = pub
	return t, nil
}

func (t *pubsubTarget) Prepare(ctx context.Context, name string) (string, func(), error) {
	admin := t.pub.Client().TopicAdminClient
	full := "projects/" + t.pub.Client().Project() + "/topics/" + name
	if _, err := admin.CreateTopic(ctx, &pubsubpb.Topic{Name: full}); err != nil {
		return "", nil, fmt.Errorf("create topic %s: %w", full, err)
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = admin.DeleteTopic(ctx, &pubsubpb.DeleteTopicRequest{Topic: full})
	}
	return name, drop, nil
}

func (t *pubsubTarget) Broker() (string, brokers.Settings) { return t.url, brokers.Settings{} }

// Raw publishes every message at once through the client's publisher for the topic,
// with the outbox publisher's settings (ordering keys, 1 ms delay threshold), then
// waits for every message id. The messages are built by the publisher's own code
// (outboxpubsub.Publisher.Message).
func (t *pubsubTarget) Raw(ctx context.Context, route string, msgs []*outbox.Message) error {
	p := t.pub.Client().Publisher(route)
	p.EnableMessageOrdering = true
	p.PublishSettings.DelayThreshold = outboxpubsub.DelayThresholdDefault
	p.PublishSettings.Timeout = outboxpubsub.TimeoutDefault
	defer p.Stop()
	results := make([]*pubsub.PublishResult, 0, len(msgs))
	for _, m := range msgs {
		pm, err := t.pub.Message(m)
		if err != nil {
			return err
		}
		results = append(results, p.Publish(ctx, pm))
	}
	for _, r := range results {
		if _, err := r.Get(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Empty implements emptier for the in-process server, which keeps every message in
// memory: it forgets them all.
func (t *pubsubTarget) Empty(context.Context, string) error {
	if t.fake != nil {
		t.fake.ClearMessages()
	}
	return nil
}

func (t *pubsubTarget) Close() {
	if t.pub != nil {
		t.pub.Close()
	}
	if t.fake != nil {
		_ = t.fake.Close()
	}
}
