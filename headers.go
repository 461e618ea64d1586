package outbox

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
)
