package outbox

import (
	"cmp"
	"encoding/json"
	"fmt"
	"mime"
	"net/textproto"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits bound what Write accepts. Brokers reject oversized messages (NATS allows 1 MiB by
// default, Kafka 1 MiB and 12 bytes), and a message the broker can never accept would
// only be retried until it is dead-lettered, so Write refuses it up front instead.
type Limits struct {
	// MaxPayloadBytes caps Payload. Defaults to 1 MiB less 32 KiB, so that payload and
	// headers fit the 1 MiB message limit NATS and Kafka (and outboxkafka's
	// MaxMessageBytes) have by default.
	MaxPayloadBytes int
	// MaxHeaders caps the number of headers of one message. Defaults to 64.
	MaxHeaders int
	// MaxHeaderBytes caps the summed length of one message's header names and values.
	// Defaults to 16 KiB.
	MaxHeaderBytes int
}

// Defaults for Limits.
const (
	MaxPayloadBytesDefault = 1<<20 - 32<<10
	MaxHeadersDefault      = 64
	MaxHeaderBytesDefault  = 16 << 10
	// maxNameBytes bounds topics, keys, types, dedup keys and header names: AMQP short
	// strings and most broker names stop at 255 bytes.
	maxNameBytes = 255
)

func (l Limits) withDefaults() Limits {
	l.MaxPayloadBytes = cmp.Or(l.MaxPayloadBytes, MaxPayloadBytesDefault)
	l.MaxHeaders = cmp.Or(l.MaxHeaders, MaxHeadersDefault)
	l.MaxHeaderBytes = cmp.Or(l.MaxHeaderBytes, MaxHeaderBytesDefault)
	return l
}

func (l Limits) validate() error {
	switch {
	case l.MaxPayloadBytes < 0:
		return &ConfigError{Field: "Limits.MaxPayloadBytes", Reason: "must not be negative"}
	case l.MaxHeaders < 0:
		return &ConfigError{Field: "Limits.MaxHeaders", Reason: "must not be negative"}
	case l.MaxHeaderBytes < 0:
		return &ConfigError{Field: "Limits.MaxHeaderBytes", Reason: "must not be negative"}
	}
	return nil
}

// Prepare validates msgs and fills their defaults (ID, ContentType) in place. It is what
// Write does before any SQL runs; drivers and tests call it directly. On error nothing
// must be written.
//
// A message given neither an ID nor a DedupKey keeps an empty DedupKey: its dedup key is
// the new ID's string form (Message.DedupID), which no other message can hold, so drivers
// store it without claiming it. A message given an ID but no DedupKey gets the ID's
// string form as its DedupKey, claimed like any other.
func (l Limits) Prepare(msgs []Message) error {
	l = l.withDefaults()
	for i := range msgs {
		if err := l.prepare(i, &msgs[i]); err != nil {
			return err
		}
	}
	return nil
}

func (l Limits) prepare(i int, m *Message) error {
	bad := func(field, format string, args ...any) error {
		return &ValidationError{Index: i, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	if m.Topic == "" {
		return bad("Topic", "required")
	}
	if err := checkName(m.Topic, false); err != "" {
		return bad("Topic", "%s", err)
	}
	if err := checkName(m.Key, true); err != "" {
		return bad("Key", "%s", err)
	}
	if err := checkName(m.AggregateType, false); err != "" {
		return bad("AggregateType", "%s", err)
	}
	if err := checkName(m.EventType, false); err != "" {
		return bad("EventType", "%s", err)
	}
	if len(m.Payload) > l.MaxPayloadBytes {
		return bad("Payload", "%d bytes is over the limit of %d (Limits.MaxPayloadBytes)", len(m.Payload), l.MaxPayloadBytes)
	}
	if m.ContentType == "" {
		if json.Valid(m.Payload) && utf8.Valid(m.Payload) {
			m.ContentType = ContentTypeJSON
		} else {
			m.ContentType = ContentTypeBinary
		}
	} else {
		if err := checkMediaType(m.ContentType); err != "" {
			return bad("ContentType", "%s", err)
		}
		if IsJSONContentType(m.ContentType) && !(json.Valid(m.Payload) && utf8.Valid(m.Payload)) {
			return bad("Payload", "content type %q says JSON but the payload is not valid JSON in UTF-8", m.ContentType)
		}
	}
	if len(m.Headers) > l.MaxHeaders {
		return bad("Headers", "%d headers is over the limit of %d (Limits.MaxHeaders)", len(m.Headers), l.MaxHeaders)
	}
	size := 0
	for k, v := range m.Headers {
		if err := checkHeaderName(k); err != "" {
			return bad(fmt.Sprintf("Headers[%q]", k), "%s", err)
		}
		if err := checkReservedHeader(k); err != "" {
			return bad(fmt.Sprintf("Headers[%q]", k), "%s", err)
		}
		if err := checkHeaderValue(v); err != "" {
			return bad(fmt.Sprintf("Headers[%q]", k), "%s", err)
		}
		size += len(k) + len(v)
	}
	if size > l.MaxHeaderBytes {
		return bad("Headers", "%d bytes is over the limit of %d (Limits.MaxHeaderBytes)", size, l.MaxHeaderBytes)
	}
	if !m.DeliverAt.IsZero() {
		if y := m.DeliverAt.UTC().Year(); y < 1000 || y > 9999 {
			return bad("DeliverAt", "year %d is outside 1000-9999, the range every store can hold", y)
		}
	}
	if m.Priority < 0 || m.Priority > MaxPriority {
		return bad("Priority", "%d is outside 0-%d", m.Priority, MaxPriority)
	}
	switch {
	case m.DedupKey != "":
		if err := checkName(m.DedupKey, true); err != "" {
			return bad("DedupKey", "%s", err)
		}
		if m.ID.IsZero() {
			m.ID = NewID()
		}
	case m.ID.IsZero():
		m.ID = NewID() // a new id: nothing to deduplicate against, DedupKey stays empty
	default:
		m.DedupKey = m.ID.String()
	}
	return nil
}

// checkName accepts up to 255 bytes of UTF-8 text without control or invisible format
// characters (Unicode Cc and Cf: C0, DEL, C1, bidi overrides, zero-width spaces, BOM),
// which would make two names that look the same differ, or reorder text on a screen. Keys
// may contain spaces; topics and types may not, because they end up in broker names.
func checkName(s string, spaces bool) string {
	if len(s) > maxNameBytes {
		return fmt.Sprintf("%d bytes is over the limit of %d", len(s), maxNameBytes)
	}
	if !utf8.ValidString(s) {
		return "not valid UTF-8"
	}
	for _, r := range s {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || (!spaces && r == ' ') {
			return fmt.Sprintf("contains the character %q, which is not allowed", r)
		}
	}
	if strings.HasPrefix(s, " ") || strings.HasSuffix(s, " ") {
		// Keys and dedup keys travel in headers too (Outbox-Key, Outbox-Dedup-Key,
		// Nats-Msg-Id): trimmed there, "a" and "a " would be one dedup key to JetStream.
		return "starts or ends with a space, which NATS and HTTP headers drop in transit; trim it"
	}
	return ""
}

// checkHeaderName accepts an HTTP token (RFC 9110 tchar), which every broker can carry as
// a header or property name.
func checkHeaderName(s string) string {
	if s == "" {
		return "header name is empty"
	}
	if len(s) > maxNameBytes {
		return fmt.Sprintf("header name of %d bytes is over the limit of %d", len(s), maxNameBytes)
	}
	for i := 0; i < len(s); i++ {
		if !isTokenChar(s[i]) {
			return fmt.Sprintf("header name contains %q; use letters, digits and !#$%%&'*+-.^_`|~", s[i])
		}
	}
	return ""
}

// reservedHeaders are the headers publishers set themselves, by canonical name, and
// what a message sets instead. A message's own header of one of these names would be
// overwritten on the wire (or, for Content-Type, contradict its ContentType).
var reservedHeaders = map[string]string{
	HeaderID:            "Message.ID",
	HeaderDedupKey:      "Message.DedupKey",
	HeaderKey:           "Message.Key",
	HeaderAggregateType: "Message.AggregateType",
	HeaderEventType:     "Message.EventType",
	HeaderTopic:         "Message.Topic",
	HeaderCreatedAt:     "nothing: the store stamps it",
	HeaderContentType:   "Message.ContentType",
	"Idempotency-Key":   "Message.DedupKey (webhooks send it as Idempotency-Key)",
	"Outbox-Signature":  "nothing: the webhook publisher signs",
	"Outbox-Headers":    "nothing: the SQS publisher carries the headers in it",
	HeaderReplay:        "nothing: a replay (outbox replay) marks the messages it publishes again",
}

// checkReservedHeader refuses a header a publisher sets itself, and the headers NATS
// JetStream acts on (Nats-Msg-Id, Nats-Expected-*, Nats-Rollup, Nats-TTL, ...): a
// message must not steer the broker's deduplication, its stream checks or a purge.
func checkReservedHeader(name string) string {
	canon := textproto.CanonicalMIMEHeaderKey(name)
	if use, ok := reservedHeaders[canon]; ok {
		return fmt.Sprintf("the publisher sets %s itself; set %s", canon, use)
	}
	if strings.HasPrefix(canon, "Nats-") {
		return "Nats-* headers are instructions to the NATS server (deduplication, stream checks, rollups), never message data"
	}
	return ""
}

// checkMediaType accepts a media type as RFC 9110 writes it, type/subtype with optional
// parameters ("application/json", "text/plain; charset=utf-8"), of at most 255 bytes.
func checkMediaType(s string) string {
	if len(s) > maxNameBytes || !utf8.ValidString(s) || strings.ContainsFunc(s, unicode.IsControl) {
		return fmt.Sprintf("must be a media type of at most %d bytes, without control characters", maxNameBytes)
	}
	mt, _, err := mime.ParseMediaType(s)
	if err != nil {
		return fmt.Sprintf("%q is not a media type (type/subtype, then ; parameters): %v", s, err)
	}
	if typ, sub, ok := strings.Cut(mt, "/"); !ok || typ == "" || sub == "" || strings.Contains(sub, "/") {
		return fmt.Sprintf("%q is not a media type: want type/subtype, such as application/json", s)
	}
	return ""
}

func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// checkHeaderValue accepts UTF-8 text with no control character but tab, and no space
// or tab at either end: NATS and HTTP trim those in transit, so a consumer there would
// read another value than a consumer on Kafka. Inner spaces and tabs travel everywhere.
func checkHeaderValue(s string) string {
	if !utf8.ValidString(s) {
		return "header value is not valid UTF-8"
	}
	if i := strings.IndexAny(s, "\r\n\x00"); i >= 0 {
		return fmt.Sprintf("header value contains %q, which would let it forge other headers", s[i])
	}
	if i := strings.IndexFunc(s, func(r rune) bool { return r != '\t' && unicode.IsControl(r) }); i >= 0 {
		r, _ := utf8.DecodeRuneInString(s[i:])
		return fmt.Sprintf("header value contains the control character %q, which brokers refuse", r)
	}
	if s != strings.Trim(s, " \t") {
		return "header value starts or ends with a space or tab, which NATS and HTTP headers drop in transit; trim it"
	}
	return ""
}
