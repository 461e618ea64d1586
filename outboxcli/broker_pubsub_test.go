package outboxcli

import (
	"fmt"
	"strings"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxpubsub"
)

// TestRelayPubSub runs the relay against the client library's fake Pub/Sub server:
// messages land on the topic the route names, with the key as ordering key, and a topic
// that does not exist is named in a warning at start-up.
func TestRelayPubSub(t *testing.T) {
	t.Parallel()
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	const project = "outbox-cli"
	url := "pubsub://" + project
	admin, err := outboxpubsub.Dial(testenv.Context(t), url+"?endpoint="+srv.Addr, outboxpubsub.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	topic := "projects/" + project + "/topics/events-q"
	if _, err := admin.Client().TopicAdminClient.CreateTopic(testenv.Context(t), &pubsubpb.Topic{Name: topic}); err != nil {
		t.Fatal(err)
	}

	b := migrated(t)
	msgs := brokerMessages()
	b.Write(t, msgs...)

	log, stop := backgroundRelay(t, with(b.env, "OUTBOX_POLL_INTERVAL", "50ms"),
		"relay", "--broker", url, "--pubsub-endpoint", srv.Addr, "--route", "events-{topic}", "--log-format", "json")

	var got []*pstest.Message
	testenv.Await(t, "2 messages on "+topic, func() (any, bool) {
		got = got[:0]
		for _, m := range srv.Messages() {
			if m.Topic == topic {
				got = append(got, m)
			}
		}
		return fmt.Sprintf("%d messages", len(got)), len(got) >= 2
	})
	for i, m := range msgs[:2] {
		if string(got[i].Data) != string(m.Payload) || got[i].Attributes[outbox.HeaderID] != m.ID.String() || got[i].OrderingKey != "o-1" {
			t.Errorf("message %d: %q %v key %q, want payload %q, id %s, ordering key o-1", i, got[i].Data, got[i].Attributes, got[i].OrderingKey, m.Payload, m.ID)
		}
	}
	if d := got[0].Attributes[outbox.HeaderDedupKey]; d != "order-1-placed" {
		t.Errorf("dedup key attribute %q", d)
	}
	awaitMissingWarning(t, log, "topic", "events-missing")

	stopClean(t, log, stop)
}

func TestRelayPubSubRejectsBadSettingsBeforeConnecting(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OUTBOX_DATABASE_URL": unreachableDB, "OUTBOX_BROKER": "pubsub://p"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--route", "goog-{topic}"}, "--route: \"goog-{topic}\" does not form valid topic names"},
		{[]string{"--pubsub-timeout", "-1s"}, "--pubsub-timeout: must not be negative"},
		{[]string{"--broker", "pubsub://"}, "names no project"},
		{[]string{"--broker", "pubsub://p?endpoint=a:1", "--pubsub-endpoint", "b:2"}, "give one"},
	} {
		r := cli(t, env, append([]string{"relay"}, tc.args...)...)
		if r.code != 2 || !strings.Contains(errorLine(r.stderr), tc.want) {
			t.Errorf("relay %v: want exit 2 and %q, got %s", tc.args, tc.want, r)
		}
	}
}

// TestRelayCloudEvents: --cloudevents publishes every message as a CloudEvent, in binary
// mode (attributes ce-*) and in structured mode (one JSON event, which outbox.NewDelivery
// reads back into the payload written).
func TestRelayCloudEvents(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"binary", "structured"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			srv := pstest.NewServer()
			t.Cleanup(func() { _ = srv.Close() })
			const project = "outbox-ce"
			admin, err := outboxpubsub.Dial(testenv.Context(t), "pubsub://"+project+"?endpoint="+srv.Addr, outboxpubsub.Config{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(admin.Close)
			topic := "projects/" + project + "/topics/orders"
			if _, err := admin.Client().TopicAdminClient.CreateTopic(testenv.Context(t), &pubsubpb.Topic{Name: topic}); err != nil {
				t.Fatal(err)
			}
			b := migrated(t)
			m := outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "o-1", EventType: "order.placed", Payload: []byte(`{"n":1}`)}
			b.Write(t, m)
			log, stop := backgroundRelay(t, with(b.env, "OUTBOX_POLL_INTERVAL", "50ms"),
				"relay", "--broker", "pubsub://"+project+"?endpoint="+srv.Addr, "--cloudevents", mode, "--cloudevents-source", "/shop")
			var got *pstest.Message
			testenv.Await(t, "the message on "+topic, func() (any, bool) {
				for _, pm := range srv.Messages() {
					if pm.Topic == topic {
						got = pm
					}
				}
				return got != nil, got != nil
			})
			d := outbox.NewDelivery(got.Attributes, "", "orders", got.Data, 1)
			if d.ID != m.ID.String() || string(d.Payload) != `{"n":1}` || d.ContentType != outbox.ContentTypeJSON || d.EventType != "order.placed" {
				t.Errorf("delivery %+v payload %q", d, d.Payload)
			}
			switch mode {
			case "binary":
				if got.Attributes["ce-id"] != m.ID.String() || got.Attributes["ce-source"] != "/shop" || got.Attributes["ce-type"] != "order.placed" {
					t.Errorf("attributes %v", got.Attributes)
				}
			case "structured":
				if ct := got.Attributes["Content-Type"]; !strings.HasPrefix(ct, outbox.ContentTypeCloudEvents) || !strings.Contains(string(got.Data), `"source":"/shop"`) {
					t.Errorf("content type %q, data %s", ct, got.Data)
				}
			}
			stopClean(t, log, stop)
		})
	}
	env := map[string]string{"OUTBOX_DATABASE_URL": unreachableDB, "OUTBOX_BROKER": "pubsub://p"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cloudevents", "both", "--cloudevents-source", "/x"}, "--cloudevents: must be binary or structured"},
		{[]string{"--cloudevents", "binary"}, "--cloudevents-source: required"},
	} {
		r := cli(t, env, append([]string{"relay"}, tc.args...)...)
		if r.code != 2 || !strings.Contains(errorLine(r.stderr), tc.want) {
			t.Errorf("relay %v: want exit 2 and %q, got %s", tc.args, tc.want, r)
		}
	}
}
