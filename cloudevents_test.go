package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest"
)

// wire returns the headers a broker carries for m (outbox.Message.WireHeaders).
func wire(m *outbox.Message) map[string]string {
	h := map[string]string{}
	m.WireHeaders(func(k, v string) { h[k] = v })
	return h
}

// TestCloudEvents: both content modes map the outbox's fields, keep the Outbox-*
// headers, and read back through NewDelivery as the payload that was written.
func TestCloudEvents(t *testing.T) {
	created := time.Date(2026, 11, 29, 12, 0, 0, 123, time.UTC)
	msg := func(payload []byte, contentType string) *outbox.Message {
		return &outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "o-1", EventType: "order.placed", Payload: payload,
			ContentType: contentType, CreatedAt: created, Headers: map[string]string{"traceparent": "00-x"}}
	}
	publish := func(t *testing.T, mode outbox.CloudEventsMode, prefix string, m *outbox.Message) outbox.Message {
		t.Helper()
		rec := &outboxtest.Publisher{}
		pub, err := outbox.WithCloudEvents(rec, outbox.CloudEventsConfig{Mode: mode, Source: "/billing", Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		if errs := pub.Publish(context.Background(), []*outbox.Message{m}); errs != nil {
			t.Fatal(errs)
		}
		got := rec.Messages()
		if len(got) != 1 {
			t.Fatalf("%d messages published", len(got))
		}
		return got[0]
	}

	t.Run("binary", func(t *testing.T) {
		m := msg([]byte(`{"total": 3}`), outbox.ContentTypeJSON)
		got := publish(t, outbox.CloudEventsBinary, "ce_", m)
		want := map[string]string{"ce_specversion": "1.0", "ce_id": m.ID.String(), "ce_source": "/billing", "ce_type": "order.placed",
			"ce_subject": "o-1", "ce_time": "2026-11-29T12:00:00.000000123Z", "ce_datacontenttype": "application/json", "traceparent": "00-x"}
		for k, v := range want {
			if got.Headers[k] != v {
				t.Errorf("header %s = %q, want %q", k, got.Headers[k], v)
			}
		}
		if string(got.Payload) != `{"total": 3}` || m.Headers["ce_id"] != "" {
			t.Errorf("payload %q, the relay's message's headers %v: want the payload unchanged and the relay's message untouched", got.Payload, m.Headers)
		}
		d := outbox.NewDelivery(wire(&got), "", "orders", got.Payload, 1)
		if d.ID != m.ID.String() || string(d.Payload) != `{"total": 3}` || d.EventType != "order.placed" {
			t.Errorf("delivery %+v", d)
		}
	})
	t.Run("structured JSON", func(t *testing.T) {
		m := msg([]byte(`{"total":3,"note":"<a&b>"}`), outbox.ContentTypeJSON)
		got := publish(t, outbox.CloudEventsStructured, "", m)
		if got.ContentType != "application/cloudevents+json; charset=utf-8" {
			t.Errorf("content type %q", got.ContentType)
		}
		var event map[string]json.RawMessage
		if err := json.Unmarshal(got.Payload, &event); err != nil {
			t.Fatalf("payload %s: %v", got.Payload, err)
		}
		if string(event["id"]) != `"`+m.ID.String()+`"` || string(event["source"]) != `"/billing"` || string(event["data"]) != `{"total":3,"note":"<a&b>"}` {
			t.Errorf("event %s", got.Payload)
		}
		d := outbox.NewDelivery(wire(&got), "", "orders", got.Payload, 1)
		if string(d.Payload) != string(m.Payload) || d.ContentType != outbox.ContentTypeJSON || d.ID != m.ID.String() {
			t.Errorf("delivery payload %q content type %q id %s", d.Payload, d.ContentType, d.ID)
		}
	})
	t.Run("structured binary", func(t *testing.T) {
		m := msg([]byte{0, 0xff, 'x'}, outbox.ContentTypeBinary)
		got := publish(t, outbox.CloudEventsStructured, "", m)
		d := outbox.NewDelivery(wire(&got), "", "orders", got.Payload, 1)
		if string(d.Payload) != string(m.Payload) || d.ContentType != outbox.ContentTypeBinary {
			t.Errorf("delivery payload %q content type %q, want %q", d.Payload, d.ContentType, m.Payload)
		}
	})
	t.Run("not from an outbox", func(t *testing.T) {
		headers := map[string]string{"ce-id": "evt-7", "ce-specversion": "1.0", "ce-type": "payment.captured", "ce-subject": "p-9"}
		d := outbox.NewDelivery(headers, "broker-id", "payments", []byte(`{}`), 1)
		if d.ID != "evt-7" || d.EventType != "payment.captured" || d.Key != "p-9" {
			t.Errorf("binary event without Outbox-* headers: %+v", d)
		}
		structured := []byte(`{"specversion":"1.0","id":"evt-8","source":"/x","type":"t","datacontenttype":"text/plain","data":"hello"}`)
		d = outbox.NewDelivery(map[string]string{"Content-Type": "application/cloudevents+json"}, "broker-id", "payments", structured, 1)
		if d.ID != "evt-8" || string(d.Payload) != "hello" || d.ContentType != "text/plain" || d.EventType != "t" {
			t.Errorf("structured event without Outbox-* headers: %+v %q", d, d.Payload)
		}
	})
	t.Run("config", func(t *testing.T) {
		for _, c := range []outbox.CloudEventsConfig{{Source: "/x"}, {Mode: outbox.CloudEventsBinary}, {Mode: outbox.CloudEventsStructured, Source: "a b"}} {
			if _, err := outbox.WithCloudEvents(&outboxtest.Publisher{}, c); !errors.Is(err, outbox.ErrInvalidConfig) {
				t.Errorf("%+v: %v, want an invalid config", c, err)
			}
		}
	})
}
