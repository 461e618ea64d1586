package outboxpubsub_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testproxy"
	"github.com/outboxkit/outbox/outboxpubsub"
	"github.com/outboxkit/outbox/outboxtest/conformance"
)

const project = "outbox-test"

// fake starts the in-process fake Pub/Sub server, and a client of it for the test's own
// admin calls, both closed when the test ends.
func fake(t *testing.T) (*pstest.Server, *pubsub.Client) {
	t.Helper()
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	pub, err := outboxpubsub.Dial(testenv.Context(t), "pubsub://"+project+"?endpoint="+srv.Addr, outboxpubsub.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	return srv, pub.Client()
}

var topics atomic.Int64

// newTopic creates a fresh topic and returns its ID.
func newTopic(t *testing.T, c *pubsub.Client) string {
	t.Helper()
	id := fmt.Sprintf("conformance-%d", topics.Add(1))
	ctx, cancel := testenv.CallContext()
	defer cancel()
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/" + project + "/topics/" + id}); err != nil {
		t.Fatalf("create topic %s: %v", id, err)
	}
	return id
}

// TestConformance runs the publisher suite on the fake server, reached through a proxy
// that the outage test cuts.
func TestConformance(t *testing.T) {
	srv, admin := fake(t)
	proxy := testproxy.New(t, srv.Addr)
	conformance.Run(t, conformance.Broker{
		Destination: func(t *testing.T) string { return newTopic(t, admin) },
		Publisher: func(t *testing.T, route string) outbox.Publisher {
			pub, err := outboxpubsub.Dial(testenv.Context(t), "pubsub://"+project+"?endpoint="+proxy.Addr(), outboxpubsub.Config{Route: route})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pub.Close)
			return pub
		},
		Read: func(t *testing.T, dest string, n int) []conformance.Received {
			return read(t, srv, dest, n)
		},
		Reject: func(t *testing.T, dest string) *outbox.Message {
			// An attribute over Pub/Sub's 1,024 bytes: refused before it is sent.
			return &outbox.Message{ID: outbox.NewID(), Topic: "big", Key: "big", Payload: []byte(`{}`),
				Headers: map[string]string{"Big": strings.Repeat("x", outboxpubsub.MaxAttributeValueBytes+1)}}
		},
		Cut:     func(t *testing.T) { proxy.Cut() },
		Restore: func(t *testing.T) { proxy.Restore(t) },
	})
}

// read returns the messages the server stored on topic, in the order it stored them,
// once there are at least n, or once their number stops growing for testenv.Stall().
func read(t *testing.T, srv *pstest.Server, topic string, n int) []conformance.Received {
	t.Helper()
	full := "projects/" + project + "/topics/" + topic
	var got []conformance.Received
	err := testenv.Progress(context.Background(), fmt.Sprintf("%d messages on %s", n, topic), testenv.Stall(), func() (any, bool) {
		got = got[:0]
		for _, m := range srv.Messages() {
			if m.Topic != full {
				continue
			}
			payload, headers := outboxpubsub.Decode(&pubsub.Message{Data: m.Data, Attributes: m.Attributes, OrderingKey: m.OrderingKey})
			if k := headers[outbox.HeaderKey]; outboxpubsub.OrderingKey(k) != m.OrderingKey {
				t.Errorf("message %s: ordering key %q, want the key %q's", m.ID, m.OrderingKey, k)
			}
			got = append(got, conformance.Received{DedupID: headers[outbox.HeaderDedupKey], Key: headers[outbox.HeaderKey],
				ContentType: headers[outbox.HeaderContentType], Headers: headers, Payload: payload})
		}
		return fmt.Sprintf("%d of %d messages", len(got), n), len(got) >= n
	})
	if err != nil {
		t.Logf("read %s: %v", topic, err)
	}
	return got
}
