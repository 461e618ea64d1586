package outbox

import "github.com/outboxkit/outbox/outboxtype"

// The vocabulary that applications, stores and publishers share is defined in package
// outboxtype, which store and broker authors import without the relay; the names below
// are the same types and values, so that an application needs only this package.
type (
	// Message is one event to publish: see outboxtype.Message.
	Message = outboxtype.Message
	// ID identifies a message: see outboxtype.ID.
	ID = outboxtype.ID
	// ConfigError names the configuration field that is wrong; errors.Is(err,
	// ErrInvalidConfig) matches it.
	ConfigError = outboxtype.ConfigError
)

// Header names every publisher sets on the wire, next to the message's own headers, so
// consumers see the same metadata whatever the broker. The dedup key additionally goes
// where the broker deduplicates (Nats-Msg-Id, AMQP message_id, ...).
const (
	HeaderID            = outboxtype.HeaderID
	HeaderDedupKey      = outboxtype.HeaderDedupKey
	HeaderKey           = outboxtype.HeaderKey
	HeaderAggregateType = outboxtype.HeaderAggregateType
	HeaderEventType     = outboxtype.HeaderEventType
	HeaderTopic         = outboxtype.HeaderTopic
	HeaderCreatedAt     = outboxtype.HeaderCreatedAt // RFC 3339 with nanoseconds, UTC
	HeaderContentType   = outboxtype.HeaderContentType
	HeaderReplay        = outboxtype.HeaderReplay // on messages a replay publishes: the replay's name
)

// ContentTypeJSON is given to payloads that are valid JSON when the caller sets no
// content type; ContentTypeBinary to other payloads.
const (
	ContentTypeJSON   = outboxtype.ContentTypeJSON
	ContentTypeBinary = outboxtype.ContentTypeBinary
	// MaxPriority is the highest Message.Priority.
	MaxPriority = outboxtype.MaxPriority
)

var (
	// ErrInvalidID is returned by ParseID for text that is not a UUID.
	ErrInvalidID = outboxtype.ErrInvalidID
	// ErrInvalidConfig is matched (errors.Is) by every *ConfigError.
	ErrInvalidConfig = outboxtype.ErrInvalidConfig
)

// NewID returns a new UUIDv7, strictly increasing within one process; see
// outboxtype.NewID.
func NewID() ID { return outboxtype.NewID() }

// ParseID parses the canonical 36-character UUID form (hyphens required, any case).
func ParseID(s string) (ID, error) { return outboxtype.ParseID(s) }

// IsJSONContentType reports whether ct names a JSON media type: application/json, or any
// type with the +json suffix, ignoring parameters such as charset.
func IsJSONContentType(ct string) bool { return outboxtype.IsJSONContentType(ct) }
