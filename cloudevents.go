package outbox

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"mime"
	"strings"
	"time"
)

// CloudEventsMode is how CloudEvents (https://cloudevents.io, version 1.0) carries a
// message: its attributes as headers beside the payload (binary content mode), or the
// whole event as one JSON document (structured content mode).
type CloudEventsMode int

// CloudEvents content modes.
const (
	// CloudEventsBinary sends the payload as it is, with the event's attributes as
	// headers named with the binding's prefix (ce-id, ce-source, ...).
	CloudEventsBinary CloudEventsMode = iota + 1
	// CloudEventsStructured sends a JSON event ({"specversion": "1.0", "id": ...,
	// "data": ...}) as the payload, of content type application/cloudevents+json.
	CloudEventsStructured
)

// ContentTypeCloudEvents is the content type of a CloudEvent in structured content mode.
const ContentTypeCloudEvents = "application/cloudevents+json"

// CloudEventsPrefixDefault is the prefix of the attribute headers in binary content
// mode of the HTTP, NATS and Google Cloud Pub/Sub bindings, and of the brokers that
// have no binding of their own. Kafka's binding uses "ce_" (outboxkafka.CloudEventsPrefix)
// and AMQP's "cloudEvents:" (outboxamqp.CloudEventsPrefix).
const CloudEventsPrefixDefault = "ce-"

// CloudEventsConfig configures WithCloudEvents.
type CloudEventsConfig struct {
	// Mode is the content mode. Required.
	Mode CloudEventsMode
	// Source is the events' source attribute: a URI reference naming the service that
	// writes them ("/billing", "urn:example:billing"). Required.
	Source string
	// Prefix is the prefix of the attribute headers in binary mode. Defaults to
	// CloudEventsPrefixDefault ("ce-").
	Prefix string
}

// Validate checks c as WithCloudEvents does.
func (c CloudEventsConfig) Validate() error {
	switch {
	case c.Mode != CloudEventsBinary && c.Mode != CloudEventsStructured:
		return &ConfigError{Field: "CloudEvents.Mode", Reason: "must be binary or structured"}
	case strings.TrimSpace(c.Source) == "":
		return &ConfigError{Field: "CloudEvents.Source", Reason: "required: a URI reference naming the service that writes the events (/billing)"}
	case strings.ContainsAny(c.Source, " \t\r\n"):
		return &ConfigError{Field: "CloudEvents.Source", Reason: fmt.Sprintf("%q is no URI reference: it holds white space", c.Source)}
	}
	return nil
}

// WithCloudEvents returns a Publisher that publishes through pub every message as a
// CloudEvent, mapped from the outbox's fields:
//
//	id               the message's ID (Outbox-Id)
//	source           CloudEventsConfig.Source
//	type             the event type, or the topic when it has none
//	subject          the key, when it has one
//	time             when the message was written (CreatedAt)
//	datacontenttype  the content type
//
// The Outbox-* headers travel too, so consumers deduplicate and order as without it. In
// structured mode a JSON payload is the event's "data" as it is, any other payload its
// "data_base64". The consumer runners (outboxnats.Consume, ...) read both modes:
// outbox.NewDelivery unwraps a structured event into its data.
//
// The publisher returned implements Pinger and Reconnector, answering as pub does (a
// Ping succeeds and no reconnection is signalled when pub cannot say).
func WithCloudEvents(pub Publisher, cfg CloudEventsConfig) (Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Prefix == "" {
		cfg.Prefix = CloudEventsPrefixDefault
	}
	return &cloudEvents{pub: pub, cfg: cfg}, nil
}

type cloudEvents struct {
	pub Publisher
	cfg CloudEventsConfig
}

func (c *cloudEvents) Publish(ctx context.Context, batch []*Message) []error {
	out := make([]*Message, len(batch))
	for i, m := range batch {
		ce := *m
		if err := c.wrap(&ce); err != nil {
			errs := make([]error, len(batch))
			errs[i] = Permanent(err)
			// The others are not sent: say so as an outage, without an attempt.
			for j := range errs {
				if j != i {
					errs[j] = Outage(fmt.Errorf("outbox: not sent: message %d of the batch could not be made a CloudEvent", i))
				}
			}
			return errs
		}
		out[i] = &ce
	}
	return c.pub.Publish(ctx, out)
}

// Ping implements Pinger.
func (c *cloudEvents) Ping(ctx context.Context) error {
	if p, ok := c.pub.(Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

// Reconnected implements Reconnector.
func (c *cloudEvents) Reconnected() <-chan struct{} {
	if r, ok := c.pub.(Reconnector); ok {
		return r.Reconnected()
	}
	return nil
}

// cloudEventAttributes returns the CloudEvents attributes of m, without data.
func cloudEventAttributes(m *Message, source string) map[string]string {
	attrs := map[string]string{
		"specversion": "1.0",
		"id":          m.ID.String(),
		"source":      source,
		"type":        m.EventType,
	}
	if attrs["type"] == "" {
		attrs["type"] = m.Topic
	}
	if m.Key != "" {
		attrs["subject"] = m.Key
	}
	if !m.CreatedAt.IsZero() {
		attrs["time"] = m.CreatedAt.UTC().Format(time.RFC3339Nano)
	}
	if m.ContentType != "" {
		attrs["datacontenttype"] = m.ContentType
	}
	return attrs
}

// wrap makes m, a copy of the relay's, the CloudEvent that carries it.
func (c *cloudEvents) wrap(m *Message) error {
	attrs := cloudEventAttributes(m, c.cfg.Source)
	headers := make(map[string]string, len(m.Headers)+len(attrs))
	for k, v := range m.Headers {
		headers[k] = v
	}
	if c.cfg.Mode == CloudEventsBinary {
		for k, v := range attrs {
			headers[c.cfg.Prefix+k] = v
		}
		m.Headers = headers
		return nil
	}
	event := make(map[string]any, len(attrs)+1)
	for k, v := range attrs {
		event[k] = v
	}
	if IsJSONContentType(m.ContentType) && json.Valid(m.Payload) {
		event["data"] = json.RawMessage(m.Payload)
	} else if len(m.Payload) > 0 {
		event["data_base64"] = base64.StdEncoding.EncodeToString(m.Payload)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(event); err != nil {
		return fmt.Errorf("outbox: message %s as a CloudEvent: %w", m.ID, err)
	}
	m.Payload = bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	m.ContentType = ContentTypeCloudEvents + "; charset=utf-8"
	m.Headers = headers
	return nil
}

// structuredCloudEvent reads a delivery in structured content mode: the event's data
// (as the payload was published) and attributes, or ok false when d is none (its content
// type is not application/cloudevents+json, or it does not parse).
func structuredCloudEvent(contentType string, payload []byte) (data []byte, attrs map[string]string, ok bool) {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil || mt != ContentTypeCloudEvents {
		return nil, nil, false
	}
	var event map[string]json.RawMessage
	if err := json.Unmarshal(payload, &event); err != nil {
		return nil, nil, false
	}
	attrs = map[string]string{}
	for k, v := range event {
		var s string
		if k != "data" && k != "data_base64" && json.Unmarshal(v, &s) == nil {
			attrs[k] = s
		}
	}
	switch {
	case event["data_base64"] != nil:
		if data, err = base64.StdEncoding.DecodeString(jsonString(event["data_base64"])); err != nil {
			return nil, nil, false
		}
	case event["data"] != nil:
		data = []byte(event["data"])
		if !IsJSONContentType(attrs["datacontenttype"]) && attrs["datacontenttype"] != "" {
			var s string // a text datum of another content type is a JSON string
			if json.Unmarshal(data, &s) == nil {
				data = []byte(s)
			}
		}
	default:
		data = []byte{}
	}
	return data, attrs, true
}

// jsonString decodes a JSON string, "" when it is none.
func jsonString(raw json.RawMessage) string {
	var s string
	_ = json.Unmarshal(raw, &s)
	return s
}

// cloudEventsPrefixes are the attribute header prefixes of binary content mode that a
// delivery is read with: HTTP, NATS and Pub/Sub's, Kafka's, and AMQP's two.
var cloudEventsPrefixes = []string{"ce-", "ce_", "cloudEvents:", "cloudEvents_"}

// binaryCloudEvent returns the CloudEvents attributes of a delivery's headers in binary
// content mode (the prefix taken off), or nil when it has no ce id header.
func binaryCloudEvent(headers map[string]string) map[string]string {
	for _, prefix := range cloudEventsPrefixes {
		if headers[prefix+"id"] == "" && headers[prefix+"specversion"] == "" {
			continue
		}
		attrs := map[string]string{}
		for k, v := range headers {
			if name, ok := strings.CutPrefix(k, prefix); ok {
				attrs[name] = v
			}
		}
		return attrs
	}
	return nil
}
