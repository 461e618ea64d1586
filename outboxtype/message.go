package outboxtype

import (
	"strings"
	"time"
)

// Message is one event to publish. The caller fills the fields above the line; the store
// fills the ones below it when the relay reads the message back.
//
// A Message is a plain value: it is not safe to mutate one while another goroutine reads
// it, and Write does not retain the caller's Message after it returns.
type Message struct {
	// ID identifies the event for its whole life: it travels to the broker and consumers
	// deduplicate on it. Defaults to a new UUIDv7 (see NewID).
	ID ID

	// Topic is the destination. The publisher maps it to a broker destination (a NATS
	// subject, a Kafka topic, an exchange). Required.
	Topic string

	// Key orders messages: messages with the same key are published in the order they
	// were written, and a failing message holds back only its own key. Use the aggregate
	// id. Empty means the message is not ordered with respect to any other.
	Key string

	// AggregateType names the kind of entity the key belongs to ("order"). Optional.
	AggregateType string

	// EventType names what happened ("order.placed"). Optional.
	EventType string

	// Payload is the event body, passed to the broker byte for byte.
	Payload []byte

	// ContentType is the payload's media type. When it is JSON (application/json or any
	// type ending in +json), Write checks that Payload is valid JSON. Defaults to
	// application/json when Payload is valid JSON and to application/octet-stream
	// otherwise.
	ContentType string

	// Headers travel with the message to the broker. Names are HTTP-style tokens; values
	// may not contain CR, LF or NUL. Optional.
	Headers map[string]string

	// DedupKey is unique across the outbox table: a second message with the same dedup
	// key is skipped and reported (see DuplicateError). Defaults to the ID's string form.
	DedupKey string

	// DeliverAt delays publication until this time; its year (in UTC) must lie within
	// 1000-9999, the range every store can hold. The zero value means as soon as the
	// transaction commits. A delayed message holds back later messages of its key.
	DeliverAt time.Time

	// Priority orders the relay's backlog: with messages waiting, those of a higher
	// priority are published first, from 0 (the default) to MaxPriority. A key's order
	// still holds: a message waits for the earlier messages of its key whatever their
	// priority, so give critical messages keys of their own (docs/design.md,
	// "Priorities"). Stores from outbox schema version 10 on PostgreSQL (version 4 on
	// MySQL and SQLite) keep it; it is not carried to the broker.
	Priority int

	// ---- filled by the store when the relay reads the message ----

	// Seq is the store's position of the message: increasing in insert order.
	Seq int64
	// Shard is the lease shard the message's key hashes to.
	Shard int
	// CreatedAt is when the message was written, in database time.
	CreatedAt time.Time
	// Attempts counts earlier publish attempts that the broker rejected.
	Attempts int
	// LastError is the error of the last rejected attempt, if any.
	LastError string
}

// MaxPriority is the highest Message.Priority.
const MaxPriority = 9

// ContentTypeJSON is the content type given to payloads that are valid JSON when the
// caller sets none.
const ContentTypeJSON = "application/json"

// ContentTypeBinary is the content type given to other payloads when the caller sets none.
const ContentTypeBinary = "application/octet-stream"

// IsJSONContentType reports whether ct names a JSON media type: application/json, or any
// type with the +json suffix, ignoring parameters such as charset.
func IsJSONContentType(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}
