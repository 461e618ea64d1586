package outbox

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestPrepareDefaults(t *testing.T) {
	t.Parallel()
	msgs := []Message{
		{Topic: "t", Payload: []byte(`{"a":1}`)},
		{Topic: "t", Payload: []byte{0xff, 0x00}},
		{Topic: "t", Payload: []byte(`{}`), ID: NewID(), DedupKey: "custom"},
		{Topic: "t", Payload: []byte(`{}`), ID: NewID()},
		{Topic: "t", Payload: []byte(`{}`), DedupKey: "custom"},
	}
	if err := (Limits{}).Prepare(msgs); err != nil {
		t.Fatal(err)
	}
	// A generated id needs no claim: the dedup key stays empty and DedupID stands in.
	if msgs[0].ID.IsZero() || msgs[0].DedupKey != "" || msgs[0].DedupID() != msgs[0].ID.String() || msgs[0].ContentType != ContentTypeJSON {
		t.Fatalf("defaults not filled: %+v", msgs[0])
	}
	if msgs[3].DedupKey != msgs[3].ID.String() {
		t.Fatalf("a given id is not the dedup key: %+v", msgs[3])
	}
	if msgs[4].ID.IsZero() || msgs[4].DedupKey != "custom" {
		t.Fatalf("a given dedup key without an id: %+v", msgs[4])
	}
	invalidUTF8JSON := []Message{{Topic: "t", Payload: []byte("\"\xff\""), Headers: map[string]string{"tab": "a\tb"}, Key: "a key", EventType: "ünïcode"}}
	if err := (Limits{}).Prepare(invalidUTF8JSON); err != nil || invalidUTF8JSON[0].ContentType != ContentTypeBinary {
		t.Fatalf("JSON-looking bytes that are not UTF-8: %v, content type %q; want them taken as binary", err, invalidUTF8JSON[0].ContentType)
	}
	if msgs[1].ContentType != ContentTypeBinary {
		t.Fatalf("binary payload got content type %q", msgs[1].ContentType)
	}
	far := []Message{{Topic: "t", DeliverAt: time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)}, {Topic: "t", DeliverAt: time.Date(1000, 1, 1, 0, 0, 0, 0, time.FixedZone("", -3600))}}
	if err := (Limits{}).Prepare(far); err != nil {
		t.Fatalf("DeliverAt in the years 1000-9999: %v", err)
	}
	if msgs[2].DedupKey != "custom" {
		t.Fatalf("explicit dedup key replaced: %q", msgs[2].DedupKey)
	}
}

// TestPrepareAccepts: media types with parameters and the headers a producer sets for
// consumers (traceparent, Outbox-Priority, Outbox-Aggregate-Version) pass.
func TestPrepareAccepts(t *testing.T) {
	t.Parallel()
	for _, m := range []Message{
		{Topic: "t", ContentType: "text/plain; charset=utf-8"},
		{Topic: "t", ContentType: "application/cloudevents+json; charset=utf-8", Payload: []byte("{}")},
		{Topic: "t", ContentType: "application/vnd.acme.order.v2+protobuf"},
		{Topic: "t", Headers: map[string]string{"traceparent": "00-x", "Outbox-Priority": "5", HeaderAggregateVersion: "3", "Natsy": "1"}},
	} {
		if err := (Limits{}).Prepare([]Message{m}); err != nil {
			t.Errorf("%+v refused: %v", m, err)
		}
	}
}

func TestPrepareRejects(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 256)
	cases := []struct {
		msg   Message
		field string
	}{
		{Message{}, "Topic"},
		{Message{Topic: long}, "Topic"},
		{Message{Topic: "a\tb"}, "Topic"},
		{Message{Topic: "t", Key: long}, "Key"},
		{Message{Topic: "t", EventType: "a b"}, "EventType"},
		{Message{Topic: "t", AggregateType: "\x01"}, "AggregateType"},
		{Message{Topic: "t", ContentType: "application/json", Payload: []byte("{")}, "Payload"},
		{Message{Topic: "t", ContentType: "text/plain\r\nX: y"}, "ContentType"},
		{Message{Topic: "t", Payload: make([]byte, 11)}, "Payload"},
		{Message{Topic: "t", Headers: map[string]string{"": "v"}}, `Headers[""]`},
		{Message{Topic: "t", Headers: map[string]string{"a:b": "v"}}, `Headers["a:b"]`},
		{Message{Topic: "t", Headers: map[string]string{"a": "x\ny"}}, `Headers["a"]`},
		{Message{Topic: "t", Headers: map[string]string{"a": "\xff"}}, `Headers["a"]`},
		{Message{Topic: "t", Headers: map[string]string{"a": "1", "b": "2", "c": "3"}}, "Headers"},
		{Message{Topic: "t", Headers: map[string]string{"a": strings.Repeat("v", 100)}}, "Headers"},
		{Message{Topic: "t", DedupKey: "a\x00"}, "DedupKey"},
		{Message{Topic: "orders\u202e"}, "Topic"},                // right-to-left override
		{Message{Topic: "or\u200bders"}, "Topic"},                // zero-width space
		{Message{Topic: "t", Key: "k\u0085"}, "Key"},             // C1 control
		{Message{Topic: "t", EventType: "\ufeffx"}, "EventType"}, // BOM
		{Message{Topic: "t", Headers: map[string]string{"a": "x\x1b[2J"}}, `Headers["a"]`},
		{Message{Topic: "t", Headers: map[string]string{"a": "x\x01"}}, `Headers["a"]`},
		{Message{Topic: "t", ContentType: "text/plain\x1b"}, "ContentType"},
		{Message{Topic: "t", ContentType: "application/json", Payload: []byte("\"\xff\"")}, "Payload"},
		{Message{Topic: "t", DeliverAt: time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC)}, "DeliverAt"},
		{Message{Topic: "t", DeliverAt: time.Date(-5000, 1, 1, 0, 0, 0, 0, time.UTC)}, "DeliverAt"},
		{Message{Topic: "t", DeliverAt: time.Date(999, 12, 31, 23, 0, 0, 0, time.UTC)}, "DeliverAt"},
		{Message{Topic: "t", ContentType: "json"}, "ContentType"},
		{Message{Topic: "t", ContentType: "application/"}, "ContentType"},
		{Message{Topic: "t", ContentType: "text/plain; charset"}, "ContentType"},
		{Message{Topic: "t", ContentType: "a b/c"}, "ContentType"},
		{Message{Topic: "t", Headers: map[string]string{"Outbox-Id": "x"}}, `Headers["Outbox-Id"]`},
		{Message{Topic: "t", Headers: map[string]string{"outbox-dedup-key": "x"}}, `Headers["outbox-dedup-key"]`},
		{Message{Topic: "t", Headers: map[string]string{"Content-Type": "text/plain"}}, `Headers["Content-Type"]`},
		{Message{Topic: "t", Headers: map[string]string{"Idempotency-Key": "x"}}, `Headers["Idempotency-Key"]`},
		{Message{Topic: "t", Headers: map[string]string{"Nats-Msg-Id": "x"}}, `Headers["Nats-Msg-Id"]`},
		{Message{Topic: "t", Headers: map[string]string{"Nats-Rollup": "all"}}, `Headers["Nats-Rollup"]`},
		{Message{Topic: "t", Headers: map[string]string{"nats-expected-last-sequence": "1"}}, `Headers["nats-expected-last-sequence"]`},
	}
	lim := Limits{MaxPayloadBytes: 10, MaxHeaders: 2, MaxHeaderBytes: 50}
	for _, tc := range cases {
		err := lim.Prepare([]Message{{Topic: "ok"}, tc.msg})
		var ve *ValidationError
		if !errors.As(err, &ve) || !errors.Is(err, ErrInvalidMessage) || ve.Index != 1 || ve.Field != tc.field {
			t.Errorf("%+v: got %v, want a ValidationError on message 1 field %s", tc.msg, err, tc.field)
		}
	}
	if err := (Limits{MaxPayloadBytes: -1}).validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("negative limit accepted: %v", err)
	}
}

// TestPrepareHeaderValueEdges: NATS and HTTP trim the spaces and tabs at either end of a
// header value in transit, so Write refuses such a value, naming the header, instead of
// letting consumers on those brokers read another value. Inner ones travel everywhere.
func TestPrepareHeaderValueEdges(t *testing.T) {
	t.Parallel()
	for _, v := range []string{" v", "v ", "\tv", "v\t", " ", "\t", " a b "} {
		err := (Limits{}).Prepare([]Message{{Topic: "t", Headers: map[string]string{"X-Tenant": v}}})
		var ve *ValidationError
		if !errors.As(err, &ve) || !errors.Is(err, ErrInvalidMessage) || ve.Field != `Headers["X-Tenant"]` || !strings.Contains(err.Error(), `Headers["X-Tenant"]`) {
			t.Errorf("value %q: got %v, want a ValidationError naming Headers[\"X-Tenant\"]", v, err)
		}
	}
	for _, v := range []string{"a b", "a\tb", "tenant 7 / ü", "v", ""} {
		if err := (Limits{}).Prepare([]Message{{Topic: "t", Headers: map[string]string{"X-Tenant": v}}}); err != nil {
			t.Errorf("value %q refused: %v", v, err)
		}
	}
}

// TestPrepareKeyEdges: keys and dedup keys travel as headers too (Outbox-Key,
// Outbox-Dedup-Key, and Nats-Msg-Id, JetStream's dedup ID), which NATS and HTTP trim, so a
// space at either end is refused: "a" and "a " would otherwise be one dedup key to
// JetStream, and the second message dropped as its duplicate.
func TestPrepareKeyEdges(t *testing.T) {
	t.Parallel()
	for _, field := range []string{"Key", "DedupKey"} {
		msg := func(v string) Message {
			if field == "Key" {
				return Message{Topic: "t", Key: v}
			}
			return Message{Topic: "t", DedupKey: v}
		}
		for _, v := range []string{" a", "a ", " ", " a b "} {
			err := (Limits{}).Prepare([]Message{msg(v)})
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Field != field {
				t.Errorf("%s %q: got %v, want a ValidationError naming %s", field, v, err, field)
			}
		}
		for _, v := range []string{"a b", "order 7", "a"} {
			if err := (Limits{}).Prepare([]Message{msg(v)}); err != nil {
				t.Errorf("%s %q refused: %v", field, v, err)
			}
		}
	}
}

func TestIsJSONContentType(t *testing.T) {
	t.Parallel()
	for ct, want := range map[string]bool{
		"application/json": true, "Application/JSON; charset=utf-8": true, "application/cloudevents+json": true,
		"text/plain": false, "application/jsonx": false, "": false,
	} {
		if IsJSONContentType(ct) != want {
			t.Errorf("IsJSONContentType(%q) != %v", ct, want)
		}
	}
}

func FuzzPrepareHeaders(f *testing.F) {
	f.Add("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	f.Add("x", "a\r\nb")
	f.Add("x", " a\tb ")
	f.Fuzz(func(t *testing.T, name, value string) {
		msgs := []Message{{Topic: "t", Headers: map[string]string{name: value}}}
		if err := (Limits{}).Prepare(msgs); err != nil {
			return
		}
		// Whatever passes must be safe on every wire: no CR, LF or NUL, valid UTF-8, a
		// token for a name, and no space or tab at either end of the value (which NATS and
		// HTTP would trim).
		if strings.ContainsAny(value, "\r\n\x00") || strings.ContainsAny(name, " :\r\n\x00") || name == "" || value != strings.Trim(value, " \t") {
			t.Fatalf("accepted header %q: %q", name, value)
		}
	})
}

func TestBackoffBounds(t *testing.T) {
	t.Parallel()
	min, max := 100*time.Millisecond, 2*time.Second
	for n := 1; n < 70; n++ {
		ceiling := max
		if n < 10 {
			ceiling = min << (n - 1)
			if ceiling > max {
				ceiling = max
			}
		}
		for i := 0; i < 200; i++ {
			d := backoff(n, min, max)
			if d < min || d >= min+ceiling {
				t.Fatalf("backoff(%d) = %s, want in [%s, %s)", n, d, min, min+ceiling)
			}
		}
	}
}

func TestRelayConfigValidation(t *testing.T) {
	t.Parallel()
	for _, c := range []RelayConfig{
		{BatchSize: -1}, {LeaseTTL: 500 * time.Millisecond}, {PublishBatchSize: 10, MaxInFlight: 5},
		{RetryMinDelay: time.Minute, RetryMaxDelay: time.Second}, {Retention: -2},
	} {
		err := c.withDefaults().validate()
		var ce *ConfigError
		if !errors.As(err, &ce) {
			t.Errorf("%+v accepted: %v", c, err)
		}
	}
	if err := (RelayConfig{}).withDefaults().validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	if err := (RelayConfig{Retention: -1}).withDefaults().validate(); err != nil {
		t.Fatalf("Retention -1 rejected: %v", err)
	}
}
