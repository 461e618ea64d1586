package outboxsqs

import (
	"bytes"
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxkit/outbox"
)

// received turns an entry into the message a consumer receives.
func received(e types.SendMessageBatchRequestEntry) types.Message {
	return types.Message{Body: e.MessageBody, MessageAttributes: e.MessageAttributes}
}

func wireHeaders(m *outbox.Message) map[string]string {
	h := map[string]string{}
	m.WireHeaders(func(k, v string) { h[k] = v })
	return h
}

func TestEncodeLayout(t *testing.T) {
	t.Parallel()
	id := outbox.NewID()
	m := &outbox.Message{
		ID: id, Topic: "orders", Key: "order-42", AggregateType: "order", EventType: "order.placed",
		Payload: []byte(`{"id":42}`), ContentType: outbox.ContentTypeJSON, DedupKey: "d-1",
		CreatedAt: time.Date(2026, 3, 4, 5, 6, 7, 8, time.UTC),
		Headers: map[string]string{
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"X-Tenant":    "tenant 7 / ü",
			"Empty":       "",
			"Outbox-Key":  "overridden by the metadata",
		},
	}
	e, size, err := encode(m, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := aws.ToString(e.MessageBody); got != `{"id":42}` {
		t.Errorf("body = %q, want the JSON payload as it is", got)
	}
	if e.MessageDeduplicationId != nil || e.MessageGroupId != nil {
		t.Errorf("standard queue entry has FIFO fields: dedup %v, group %v", e.MessageDeduplicationId, e.MessageGroupId)
	}
	want := map[string]string{
		outbox.HeaderID:            id.String(),
		outbox.HeaderDedupKey:      "d-1",
		outbox.HeaderKey:           "order-42",
		outbox.HeaderAggregateType: "order",
		outbox.HeaderEventType:     "order.placed",
		outbox.HeaderTopic:         "orders",
		outbox.HeaderCreatedAt:     "2026-03-04T05:06:07.000000008Z",
		outbox.HeaderContentType:   outbox.ContentTypeJSON,
	}
	if len(e.MessageAttributes) > maxAttributes {
		t.Errorf("%d attributes, SQS allows %d", len(e.MessageAttributes), maxAttributes)
	}
	for k, v := range want {
		a, ok := e.MessageAttributes[k]
		if !ok || aws.ToString(a.DataType) != "String" || aws.ToString(a.StringValue) != v {
			t.Errorf("attribute %s = %v, want String %q", k, a, v)
		}
	}
	var own map[string]string
	if err := json.Unmarshal([]byte(aws.ToString(e.MessageAttributes[AttrHeaders].StringValue)), &own); err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"traceparent": m.Headers["traceparent"], "X-Tenant": "tenant 7 / ü", "Empty": ""}; !maps.Equal(own, want) {
		t.Errorf("%s = %v, want %v", AttrHeaders, own, want)
	}
	if _, ok := e.MessageAttributes[AttrBodyEncoding]; ok {
		t.Errorf("a text body has %s", AttrBodyEncoding)
	}
	wantSize := len(`{"id":42}`)
	for k, v := range e.MessageAttributes {
		wantSize += len(k) + len("String") + len(*v.StringValue)
	}
	if size != wantSize {
		t.Errorf("size = %d, want %d", size, wantSize)
	}

	payload, headers, err := Decode(received(e))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(payload, m.Payload) || !maps.Equal(headers, wireHeaders(m)) {
		t.Errorf("Decode = %q, %v; want %q, %v", payload, headers, m.Payload, wireHeaders(m))
	}
}

func TestEncodeFIFO(t *testing.T) {
	t.Parallel()
	id := outbox.NewID()
	long := strings.Repeat("k", 129)
	for _, tc := range []struct {
		name, key, dedup       string
		wantGroup, wantDedupID string
	}{
		{"plain", "order-42", "d-1", "order-42", "d-1"},
		{"punctuation", `a!"#$%&'()*+,-./:;<=>?@[\]^_{|}~z`, "d", `a!"#$%&'()*+,-./:;<=>?@[\]^_{|}~z`, "d"},
		{"no key: the id is the group", "", "d", id.String(), "d"},
		{"no dedup key: the id", "k", "", "k", id.String()},
		{"space", "order 42", "dedup 1", FIFOID("order 42"), FIFOID("dedup 1")},
		{"non-ASCII", "zamówienie", "ключ", FIFOID("zamówienie"), FIFOID("ключ")},
		{"too long", long, long, FIFOID(long), FIFOID(long)},
		{"128 fits", long[:128], long[:128], long[:128], long[:128]},
	} {
		m := &outbox.Message{ID: id, Topic: "t", Key: tc.key, DedupKey: tc.dedup, Payload: []byte("x")}
		e, _, err := encode(m, true)
		if err != nil {
			t.Fatal(err)
		}
		if g := aws.ToString(e.MessageGroupId); g != tc.wantGroup {
			t.Errorf("%s: group %q, want %q", tc.name, g, tc.wantGroup)
		}
		if d := aws.ToString(e.MessageDeduplicationId); d != tc.wantDedupID {
			t.Errorf("%s: dedup id %q, want %q", tc.name, d, tc.wantDedupID)
		}
		// The originals travel in the attributes.
		_, h, err := Decode(received(e))
		if err != nil {
			t.Fatal(err)
		}
		if h[outbox.HeaderKey] != tc.key || h[outbox.HeaderDedupKey] != m.DedupID() {
			t.Errorf("%s: attributes carry key %q and dedup key %q, want %q and %q", tc.name, h[outbox.HeaderKey], h[outbox.HeaderDedupKey], tc.key, m.DedupID())
		}
	}
	if h := FIFOID("order 42"); len(h) != 64 || strings.Trim(h, "0123456789abcdef") != "" {
		t.Errorf("FIFOID hash %q is not 64 hex digits", h)
	}
}

func TestBody(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		payload  []byte
		encoding string
	}{
		{"json", []byte(`{"a":"ü € 𝄞"}`), ""},
		{"tab newline cr", []byte("a\tb\nc\rd"), ""},
		{"empty", []byte{}, EncodingEmpty},
		{"nil", nil, EncodingEmpty},
		{"nul", []byte("a\x00b"), EncodingBase64},
		{"control", []byte("a\x1fb"), EncodingBase64},
		{"invalid utf-8", []byte{0xff, 0xfe}, EncodingBase64},
		{"surrogate encoded", []byte{0xed, 0xa0, 0x80}, EncodingBase64},
		{"U+FFFE", []byte("a\uFFFEb"), EncodingBase64},
		{"U+FFFF", []byte("a\uFFFFb"), EncodingBase64},
		{"U+FFFD", []byte("a\uFFFDb"), ""},
	} {
		body, enc := Body(tc.payload)
		if enc != tc.encoding {
			t.Errorf("%s: encoding %q, want %q", tc.name, enc, tc.encoding)
		}
		if body == "" || !validText(body) {
			t.Errorf("%s: body %q is not a valid SQS body", tc.name, body)
		}
		msg := types.Message{Body: aws.String(body), MessageAttributes: map[string]types.MessageAttributeValue{}}
		if enc != "" {
			msg.MessageAttributes[AttrBodyEncoding] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(enc)}
		}
		got, _, err := Decode(msg)
		if err != nil || !bytes.Equal(got, tc.payload) || got == nil {
			t.Errorf("%s: Decode = %q, %v; want %q", tc.name, got, err, tc.payload)
		}
	}
}

func TestHeadersJSONEscapesWhatSQSRefuses(t *testing.T) {
	t.Parallel()
	h := map[string]string{"a": "x\uFFFEy\uFFFFz\x01<&>", "b\uFFFF": ""}
	js, err := headersJSON(h)
	if err != nil {
		t.Fatal(err)
	}
	if !validText(js) {
		t.Fatalf("headersJSON = %q holds characters SQS refuses", js)
	}
	var back map[string]string
	if err := json.Unmarshal([]byte(js), &back); err != nil || !maps.Equal(back, h) {
		t.Errorf("headersJSON = %q decodes to %v, %v; want %v", js, back, err, h)
	}
}

func TestDecodeErrors(t *testing.T) {
	t.Parallel()
	attr := func(k, v string) map[string]types.MessageAttributeValue {
		return map[string]types.MessageAttributeValue{k: {DataType: aws.String("String"), StringValue: aws.String(v)}}
	}
	for name, msg := range map[string]types.Message{
		"bad base64":       {Body: aws.String("!!"), MessageAttributes: attr(AttrBodyEncoding, EncodingBase64)},
		"unknown encoding": {Body: aws.String("x"), MessageAttributes: attr(AttrBodyEncoding, "gzip")},
		"bad headers":      {Body: aws.String("x"), MessageAttributes: attr(AttrHeaders, "{")},
	} {
		if _, _, err := Decode(msg); err == nil {
			t.Errorf("%s: Decode succeeded", name)
		}
	}
	// Without attributes (received without MessageAttributeNames) the body is the payload.
	p, h, err := Decode(types.Message{Body: aws.String("hi")})
	if err != nil || string(p) != "hi" || len(h) != 0 {
		t.Errorf("Decode without attributes = %q, %v, %v", p, h, err)
	}
}

func FuzzEncodeDecode(f *testing.F) {
	f.Add([]byte(`{"a":1}`), "k", "traceparent", "00-01")
	f.Add([]byte{0, 1, 2, 0xff}, "", "X", "\uFFFF")
	f.Add([]byte{}, "k k", "Outbox-Key", "")
	f.Fuzz(func(t *testing.T, payload []byte, key, hname, hvalue string) {
		m := &outbox.Message{ID: outbox.NewID(), Topic: "t", Key: key, Payload: payload, ContentType: "x/y",
			Headers: map[string]string{hname: hvalue}}
		for _, fifo := range []bool{false, true} {
			e, _, err := encode(m, fifo)
			if err != nil {
				t.Fatal(err)
			}
			if !validText(*e.MessageBody) || *e.MessageBody == "" {
				t.Fatalf("body %q is not valid for SQS", *e.MessageBody)
			}
			if len(e.MessageAttributes) > maxAttributes {
				t.Fatalf("%d attributes", len(e.MessageAttributes))
			}
			for k, v := range e.MessageAttributes {
				if !validText(*v.StringValue) || *v.StringValue == "" {
					t.Fatalf("attribute %s = %q is not valid for SQS", k, *v.StringValue)
				}
			}
			if fifo {
				for _, id := range []string{*e.MessageGroupId, *e.MessageDeduplicationId} {
					if FIFOID(id) != id {
						t.Fatalf("FIFO id %q is not valid", id)
					}
				}
			}
			got, h, err := Decode(received(e))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, payload) {
				t.Fatalf("payload %q came back as %q", payload, got)
			}
			if want := wireHeaders(m); validUTF8Map(want) && !maps.Equal(h, want) {
				t.Fatalf("headers %v came back as %v", want, h)
			}
		}
	})
}

// validUTF8Map reports whether every key and value is valid UTF-8: JSON cannot carry
// anything else, and outbox.Message validation refuses it.
func validUTF8Map(h map[string]string) bool {
	for k, v := range h {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return false
		}
	}
	return true
}
