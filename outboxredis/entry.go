package outboxredis

import (
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox"
)

// The field names of a stream entry (see the package documentation): the payload is in
// FieldPayload, each header in a field named HeaderFieldPrefix and the header's name
// ("h:Outbox-Id"). Redis keeps the fields in the order they were sent: the payload
// first, then the headers.
const (
	FieldPayload      = "payload"
	HeaderFieldPrefix = "h:"
)

// Fields returns the field-value pairs of the entry Publish adds for m: the payload as
// []byte, the header values as strings. Benchmarks and tests use
// it to send exactly what the relay would.
func Fields(m *outbox.Message) []any {
	return appendFields(make([]any, 0, 2*(len(m.Headers)+10)), m)
}

// metadataHeaders are the names m.WireHeaders may set after the message's own headers.
var metadataHeaders = []string{
	outbox.HeaderID, outbox.HeaderDedupKey, outbox.HeaderKey, outbox.HeaderAggregateType,
	outbox.HeaderEventType, outbox.HeaderTopic, outbox.HeaderCreatedAt, outbox.HeaderContentType,
}

func appendFields(args []any, m *outbox.Message) []any {
	args = append(args, FieldPayload, m.Payload)
	// An own header named like a metadata header comes twice from WireHeaders, and a
	// stream entry would keep both fields: the metadata value must replace the first.
	shadowed := false
	for _, name := range metadataHeaders {
		if _, ok := m.Headers[name]; ok {
			shadowed = true
			break
		}
	}
	first := len(args)
	m.WireHeaders(func(name, value string) {
		field := HeaderFieldPrefix + name
		if shadowed {
			for k := first; k < len(args); k += 2 {
				if args[k] == field {
					args[k+1] = value
					return
				}
			}
		}
		args = append(args, field, value)
	})
	return args
}

// Entry is a stream entry written by a Publisher, as a consumer reads it.
type Entry struct {
	ID      string            // the stream entry ID, "<milliseconds>-<sequence>"
	Payload []byte            // byte for byte as written
	Headers map[string]string // by header name, without the "h:" prefix
}

// DedupKey returns the message's dedup key (the Outbox-Dedup-Key header): what an inbox
// records to drop the duplicates that at-least-once delivery brings.
func (e Entry) DedupKey() string { return e.Headers[outbox.HeaderDedupKey] }

// ParseEntry decodes an entry read with go-redis (XRANGE, XREAD, XREADGROUP). Fields
// outside the layout are ignored.
func ParseEntry(x redis.XMessage) Entry {
	e := Entry{ID: x.ID, Headers: make(map[string]string, len(x.Values))}
	for field, v := range x.Values {
		s, _ := v.(string)
		if field == FieldPayload {
			e.Payload = []byte(s)
		} else if name, ok := strings.CutPrefix(field, HeaderFieldPrefix); ok {
			e.Headers[name] = s
		}
	}
	return e
}
