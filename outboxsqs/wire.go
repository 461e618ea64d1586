package outboxsqs

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxkit/outbox"
)

// Message attributes of this package's wire layout (see the package documentation),
// next to the outbox headers that travel as attributes of their own.
const (
	// AttrHeaders holds, as a JSON object of strings, every header that is not an
	// attribute of its own: the message's own headers (traceparent, ...).
	AttrHeaders = "Outbox-Headers"
	// AttrBodyEncoding says how the body encodes the payload; absent means the body is
	// the payload itself.
	AttrBodyEncoding = "Outbox-Body-Encoding"
)

// Values of AttrBodyEncoding.
const (
	// EncodingBase64 means the body is the payload in standard base64 with padding
	// (RFC 4648), because the payload is not text SQS can carry.
	EncodingBase64 = "base64"
	// EncodingEmpty means the payload is empty. SQS refuses empty bodies, so the body
	// is a placeholder (emptyBody) to be ignored.
	EncodingEmpty = "empty"
)

const emptyBody = "-"

// ownAttributes are the headers that travel as message attributes of their own, so
// that consumers, SNS filter policies and Lambda event filters see them directly. With
// AttrHeaders and AttrBodyEncoding they make ten, the most SQS allows on one message;
// any header the outbox package adds later travels in AttrHeaders.
var ownAttributes = map[string]bool{
	outbox.HeaderID:            true,
	outbox.HeaderDedupKey:      true,
	outbox.HeaderKey:           true,
	outbox.HeaderAggregateType: true,
	outbox.HeaderEventType:     true,
	outbox.HeaderTopic:         true,
	outbox.HeaderCreatedAt:     true,
	outbox.HeaderContentType:   true,
}

// maxAttributes is the number of message attributes SQS allows on one message.
const maxAttributes = 10

const stringType = "String"

// ErrTooLarge is matched (errors.Is) by the rejection of a message larger than
// Config.MaxMessageBytes, which Publish does not send.
var ErrTooLarge = errors.New("outboxsqs: message too large")

// ErrInvalidQueue is matched (errors.Is) by the rejection of a message whose route gives
// no valid queue name or URL.
var ErrInvalidQueue = errors.New("outboxsqs: invalid queue")

// entry is one message encoded for SendMessageBatch, with its size as SQS counts it.
type entry struct {
	i    int // index in the Publish batch
	req  types.SendMessageBatchRequestEntry
	size int
}

// encode builds m's SendMessageBatch entry for a queue, FIFO or not.
func encode(m *outbox.Message, fifo bool) (types.SendMessageBatchRequestEntry, int, error) {
	body, layout, err := Layout(m)
	if err != nil {
		return types.SendMessageBatchRequestEntry{}, 0, err
	}
	attrs := make(map[string]types.MessageAttributeValue, len(layout))
	for k, v := range layout {
		attrs[k] = types.MessageAttributeValue{DataType: aws.String(stringType), StringValue: aws.String(v)}
	}
	e := types.SendMessageBatchRequestEntry{MessageBody: aws.String(body), MessageAttributes: attrs}
	if fifo {
		e.MessageDeduplicationId = aws.String(FIFOID(m.DedupID()))
		e.MessageGroupId = aws.String(FIFOGroup(m))
	}
	return e, LayoutSize(body, layout), nil
}

// Layout lays m out as this package sends it (see the package documentation): the body,
// and the String attributes by name. Amazon SNS (outboxsns) sends the same layout, so
// that a raw delivery from an SNS topic to an SQS queue decodes with Decode.
func Layout(m *outbox.Message) (body string, attrs map[string]string, err error) {
	body, encoding := Body(m.Payload)
	attrs = make(map[string]string, maxAttributes)
	var rest map[string]string
	m.WireHeaders(func(k, v string) {
		if ownAttributes[k] && v != "" && validText(v) {
			attrs[k] = v
			delete(rest, k)
			return
		}
		if rest == nil {
			rest = make(map[string]string, len(m.Headers))
		}
		rest[k] = v
		delete(attrs, k)
	})
	if len(rest) > 0 {
		js, err := headersJSON(rest)
		if err != nil {
			return "", nil, err
		}
		attrs[AttrHeaders] = js
	}
	if encoding != "" {
		attrs[AttrBodyEncoding] = encoding
	}
	return body, attrs, nil
}

// LayoutSize is the size of a laid-out message as SQS and SNS count it: the body and
// every attribute's name, data type ("String") and value.
func LayoutSize(body string, attrs map[string]string) int {
	size := len(body)
	for k, v := range attrs {
		size += len(k) + len(stringType) + len(v)
	}
	return size
}

// Body returns the SQS message body that carries payload and the value of the
// Outbox-Body-Encoding attribute that goes with it ("" for none): the payload itself when
// it is non-empty text that SQS accepts (UTF-8 with only the characters SQS allows),
// base64 otherwise, and a placeholder for an empty payload.
func Body(payload []byte) (body, encoding string) {
	switch {
	case len(payload) == 0:
		return emptyBody, EncodingEmpty
	case validText(string(payload)):
		return string(payload), ""
	default:
		return base64.StdEncoding.EncodeToString(payload), EncodingBase64
	}
}

// validText reports whether s is UTF-8 holding only characters SQS accepts in a message
// body or attribute value: #x9, #xA, #xD, #x20 to #xD7FF, #xE000 to #xFFFD, #x10000 to
// #x10FFFF.
func validText(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !validRune(r) {
			return false
		}
	}
	return true
}

func validRune(r rune) bool {
	return r == 0x9 || r == 0xA || r == 0xD ||
		(0x20 <= r && r <= 0xD7FF) || (0xE000 <= r && r <= 0xFFFD) || (0x10000 <= r && r <= 0x10FFFF)
}

// headersJSON encodes h as a JSON object whose text SQS accepts: every character SQS
// refuses is escaped (\uXXXX), which JSON allows inside strings.
func headersJSON(h map[string]string) (string, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(h); err != nil {
		return "", fmt.Errorf("outboxsqs: encode headers: %w", err)
	}
	raw := strings.TrimSuffix(buf.String(), "\n")
	if validText(raw) {
		return raw, nil
	}
	var b strings.Builder
	for _, r := range raw {
		if validRune(r) {
			b.WriteRune(r)
		} else {
			fmt.Fprintf(&b, `\u%04x`, r) // only U+FFFE and U+FFFF reach here: json escapes control characters
		}
	}
	return b.String(), nil
}

// FIFOGroup returns the MessageGroupId of m on a FIFO queue or topic: its key, or its id
// when it has none (it is ordered with respect to no other message), as FIFOID.
func FIFOGroup(m *outbox.Message) string {
	if m.Key == "" {
		return FIFOID(m.ID.String())
	}
	return FIFOID(m.Key)
}

// FIFOID returns s when it is a valid MessageDeduplicationId and MessageGroupId (1 to
// 128 characters, each an ASCII letter, digit or punctuation mark), and otherwise the
// lowercase hex SHA-256 of s, which always is one.
func FIFOID(s string) string {
	ok := len(s) > 0 && len(s) <= 128
	for i := 0; ok && i < len(s); i++ {
		ok = s[i] > ' ' && s[i] < 0x7f
	}
	if ok {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// Decode returns the payload and headers of a message that a Publisher sent, as a
// consumer received it. Receive with MessageAttributeNames ["All"] (or at least
// "Outbox-*" and "Content-Type"): without the attributes, Decode cannot tell a base64
// body from a text one and returns the body as it is.
//
// The headers are those of outbox.Message.WireHeaders: the message's own headers, the
// Outbox-* metadata and Content-Type. Other String attributes that someone else set on
// the message are returned as headers too.
func Decode(msg types.Message) (payload []byte, headers map[string]string, err error) {
	headers = make(map[string]string, len(msg.MessageAttributes)+8)
	for k, v := range msg.MessageAttributes {
		if k == AttrHeaders || k == AttrBodyEncoding || v.StringValue == nil {
			continue
		}
		if dt := aws.ToString(v.DataType); dt != stringType && !strings.HasPrefix(dt, stringType+".") {
			continue
		}
		headers[k] = *v.StringValue
	}
	if v, ok := msg.MessageAttributes[AttrHeaders]; ok && v.StringValue != nil {
		var own map[string]string
		if err := json.Unmarshal([]byte(*v.StringValue), &own); err != nil {
			return nil, nil, fmt.Errorf("outboxsqs: decode attribute %s: %w", AttrHeaders, err)
		}
		for k, v := range own {
			if _, set := headers[k]; !set {
				headers[k] = v
			}
		}
	}
	body := aws.ToString(msg.Body)
	switch enc := attrString(msg.MessageAttributes, AttrBodyEncoding); enc {
	case "":
		payload = []byte(body)
	case EncodingBase64:
		payload, err = base64.StdEncoding.DecodeString(body)
		if err != nil {
			return nil, nil, fmt.Errorf("outboxsqs: decode base64 body: %w", err)
		}
	case EncodingEmpty:
		payload = []byte{}
	default:
		return nil, nil, fmt.Errorf("outboxsqs: unknown %s %s", AttrBodyEncoding, strconv.Quote(enc))
	}
	return payload, headers, nil
}

func attrString(attrs map[string]types.MessageAttributeValue, name string) string {
	return aws.ToString(attrs[name].StringValue)
}
