package outboxsqs

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/awsdial"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg   Config
		field string // "" when valid
	}{
		{Config{}, ""},
		{Config{Route: "orders"}, ""},
		{Config{Route: "orders.fifo"}, ""},
		{Config{Route: "{topic}.fifo"}, ""},
		{Config{Route: "events-{aggregate_type}_{event_type}"}, ""},
		{Config{Route: "https://sqs.eu-west-1.amazonaws.com/123456789012/{topic}"}, ""},
		{Config{Route: "http://127.0.0.1:4566/000000000000/q"}, ""},
		{Config{MaxMessageBytes: 1 << 20, MaxInflight: 1}, ""},
		{Config{Route: "events.{topic}"}, "Route"},
		{Config{Route: "{topic}/x"}, "Route"},
		{Config{Route: "a b"}, "Route"},
		{Config{Route: "{nope}"}, "Route"},
		{Config{Route: "{topic"}, "Route"},
		{Config{Route: ".fifo"}, "Route"},
		{Config{Route: strings.Repeat("q", 81)}, "Route"},
		{Config{Route: "https://sqs.eu-west-1.amazonaws.com/123456789012/{topic}?x=1"}, "Route"},
		{Config{Route: "https:///123/q"}, "Route"},
		{Config{Route: "https://sqs.eu-west-1.amazonaws.com/{topic}/orders"}, "Route"},
		{Config{Route: "https://{topic}.amazonaws.com/123456789012/orders"}, "Route"},
		{Config{MaxMessageBytes: -1}, "MaxMessageBytes"},
		{Config{MaxMessageBytes: 1000}, "MaxMessageBytes"},
		{Config{MaxInflight: -1}, "MaxInflight"},
	} {
		_, err := tc.cfg.validate()
		var ce *outbox.ConfigError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%+v: %v", tc.cfg, err)
		case tc.field != "" && (!errors.As(err, &ce) || ce.Field != tc.field):
			t.Errorf("%+v: error %v, want a ConfigError for %s", tc.cfg, err, tc.field)
		}
	}
}

func TestCheckQueueName(t *testing.T) {
	t.Parallel()
	for dest, want := range map[string]string{
		"orders":      "orders",
		"Or-d_3rs":    "Or-d_3rs",
		"orders.fifo": "orders.fifo",
		"https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo": "orders.fifo",
		strings.Repeat("q", 80):           strings.Repeat("q", 80),
		strings.Repeat("q", 75) + ".fifo": strings.Repeat("q", 75) + ".fifo",
		"":                                "",
		"or.ders":                         "",
		"orders.FIFO":                     "",
		"ordérs":                          "",
		strings.Repeat("q", 81):           "",
		strings.Repeat("q", 76) + ".fifo": "",
		"https://sqs.eu-west-1.amazonaws.com/123456789012/": "",
		"https://sqs.eu-west-1.amazonaws.com/123/o#f":       "",
	} {
		name, reason := checkQueue(dest)
		if name != want || (want == "") != (reason != "") {
			t.Errorf("checkQueue(%q) = %q, %q; want %q", dest, name, reason, want)
		}
	}
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]awsdial.Params{
		"sqs://":                   {},
		"sqs:":                     {},
		"sqs://?region=eu-west-1":  {Region: "eu-west-1"},
		"sqs:///?region=eu-west-1": {Region: "eu-west-1"},
		"sqs://?region=us-east-1&profile=p&endpoint=http://127.0.0.1:4566": {Region: "us-east-1", Profile: "p", Endpoint: "http://127.0.0.1:4566"},
	} {
		got, err := parseURL(raw)
		if err != nil || got != want {
			t.Errorf("parseURL(%q) = %+v, %v; want %+v", raw, got, err, want)
		}
	}
	for _, raw := range []string{
		"nats://x", "sqs://localhost:4566", "sqs://?regoin=eu-west-1", "sqs://?endpoint=localhost:4566",
		"sqs://key:secret@?region=x", "sqs://?endpoint=ftp://x", "%zz",
	} {
		_, err := parseURL(raw)
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) {
			t.Errorf("parseURL(%q) = %v, want a ConfigError", raw, err)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("parseURL(%q) error shows the secret: %v", raw, err)
		}
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for raw, leak := range map[string]string{
		"sqs://key:secret@?region=x":                    "secret",
		"sqs://?endpoint=http://user:secret@host:4566/": "secret",
	} {
		if got := redactURL(raw); strings.Contains(got, leak) {
			t.Errorf("redactURL(%q) = %q", raw, got)
		}
	}
}

// closingBody is a request body that fails once closed, as the SDK's does.
type closingBody struct {
	r      io.Reader
	closed bool
}

func (b *closingBody) Read(p []byte) (int, error) {
	if b.closed {
		return 0, errors.New("read on a closed body")
	}
	return b.r.Read(p)
}

func (b *closingBody) Close() error { b.closed = true; return nil }

type recordingClient struct{ body io.Reader }

func (c *recordingClient) Do(req *http.Request) (*http.Response, error) {
	c.body = req.Body
	return &http.Response{StatusCode: 200, Body: http.NoBody}, nil
}

// TestBufferRequests pins the workaround of aws/aws-sdk-go-v2#2737: what net/http reads
// from the request body stays readable after the SDK closes its body.
func TestBufferRequests(t *testing.T) {
	t.Parallel()
	inner := &recordingClient{}
	sdkBody := &closingBody{r: strings.NewReader("payload")}
	req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1/", sdkBody)
	if _, err := BufferRequests(inner).Do(req); err != nil {
		t.Fatal(err)
	}
	_ = sdkBody.Close() // what the SDK does when the response headers arrive
	got, err := io.ReadAll(inner.body)
	if err != nil || !bytes.Equal(got, []byte("payload")) {
		t.Errorf("net/http reads %q, %v after the SDK closed its body; want the whole body", got, err)
	}
	if BufferRequests(nil) == nil {
		t.Error("BufferRequests(nil) is nil")
	}
}
