package outboxtype

import "time"

// Header names every publisher sets on the wire, next to the message's own headers, so
// consumers see the same metadata whatever the broker. The dedup key additionally goes
// where the broker deduplicates (Nats-Msg-Id, AMQP message_id, ...).
const (
	HeaderID            = "Outbox-Id"
	HeaderDedupKey      = "Outbox-Dedup-Key"
	HeaderKey           = "Outbox-Key"
	HeaderAggregateType = "Outbox-Aggregate-Type"
	HeaderEventType     = "Outbox-Event-Type"
	HeaderTopic         = "Outbox-Topic"
	HeaderCreatedAt     = "Outbox-Created-At" // RFC 3339 with nanoseconds, UTC
	HeaderContentType   = "Content-Type"
	// HeaderReplay marks a message published again by a replay (outbox replay): its
	// value is the replay's name. Only a replay sets it.
	HeaderReplay = "Outbox-Replay"
)

// DedupID returns the value publishers send as the broker's deduplication id: DedupKey,
// or the ID's string form when DedupKey is empty.
func (m *Message) DedupID() string {
	if m.DedupKey != "" {
		return m.DedupKey
	}
	return m.ID.String()
}

// WireHeaders calls set for every header a publisher puts on the wire: the message's own
// headers first, then the Outbox-* metadata headers and Content-Type, which therefore win
// over own headers of the same name. Empty metadata is left out.
func (m *Message) WireHeaders(set func(name, value string)) {
	for k, v := range m.Headers {
		set(k, v)
	}
	set(HeaderID, m.ID.String())
	set(HeaderDedupKey, m.DedupID())
	if m.Key != "" {
		set(HeaderKey, m.Key)
	}
	if m.AggregateType != "" {
		set(HeaderAggregateType, m.AggregateType)
	}
	if m.EventType != "" {
		set(HeaderEventType, m.EventType)
	}
	set(HeaderTopic, m.Topic)
	if !m.CreatedAt.IsZero() {
		set(HeaderCreatedAt, m.CreatedAt.UTC().Format(time.RFC3339Nano))
	}
	if m.ContentType != "" {
		set(HeaderContentType, m.ContentType)
	}
}
