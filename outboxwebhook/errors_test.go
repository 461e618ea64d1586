package outboxwebhook

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
)

// TestStatusOutage pins the status table of the package documentation, every family.
func TestStatusOutage(t *testing.T) {
	t.Parallel()
	outages := []int{100, 101, 103, 300, 301, 302, 303, 304, 307, 308,
		401, 403, 408, 409, 425, 429, 500, 501, 502, 503, 504, 505, 507, 599}
	rejections := []int{400, 402, 404, 405, 406, 407, 410, 411, 412, 413, 414, 415, 416, 417, 418,
		421, 422, 423, 424, 426, 428, 431, 451, 499}
	for _, code := range outages {
		if !statusOutage(code) {
			t.Errorf("status %d is a rejection, want an outage", code)
		}
	}
	for _, code := range rejections {
		if statusOutage(code) {
			t.Errorf("status %d is an outage, want a rejection", code)
		}
	}
	// Ping: only "not ready" answers are outages.
	for code, outage := range map[int]bool{200: false, 204: false, 301: false, 401: false, 403: false,
		404: false, 405: false, 409: false, 408: true, 429: true, 500: true, 503: true} {
		if pingOutage(code) != outage {
			t.Errorf("pingOutage(%d) = %v, want %v", code, !outage, outage)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	for in, want := range map[string]time.Duration{
		"":                              0,
		"0":                             0,
		"120":                           120 * time.Second,
		" 7 ":                           7 * time.Second,
		"-5":                            0,
		"1.5":                           0,
		"soon":                          0,
		"99999999999":                   0, // over 32 bits: unreadable, not a century
		"Wed, 06 May 2026 07:09:09 GMT": time.Minute,
		"Wed, 06 May 2026 07:08:00 GMT": 0, // past
	} {
		if got := parseRetryAfter(in, now); got != want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestOneLine(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                         "",
		"plain":                    "plain",
		"  two\r\n lines\t\x00x  ": "two lines x",
		"bad \xff utf8":            "bad \uFFFD utf8",
		"sep\u2028arator\u0085":    "sep arator",
	} {
		if got := oneLine([]byte(in)); got != want {
			t.Errorf("oneLine(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"https://h":                     "https://h",
		"https://h/":                    "https://h",
		"https://h/p":                   "https://h/…",
		"https://u:p4ss@h:8443/p?x=1#f": "https://REDACTED@h:8443/…?REDACTED",
		"http://t0ken@h/p?token=secret": "http://REDACTED@h/…?REDACTED",
		"https://hooks.example/services/T000/B000/PathS3cretTok": "https://hooks.example/…",
	} {
		u, err := url.Parse(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := redactURL(u); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestTarget: a message's fields never choose the host, add path segments or a query.
func TestTarget(t *testing.T) {
	t.Parallel()
	base, _ := url.Parse("https://u:p@h.example/hooks/?token=t")
	const hooks = "https://u:p@h.example/hooks/"
	for _, tc := range []struct{ route, topic, want, err string }{
		{"{topic}", "orders", hooks + "orders?token=t", ""},
		{"/{topic}", "orders", hooks + "orders?token=t", ""},
		{"{topic}/v1", "order.placed", hooks + "order.placed/v1?token=t", ""},
		{"in box/{topic}", "orders", hooks + "in%20box/orders?token=t", ""},
		{"{topic}", "a b?c#d%e/f", hooks + "a%20b%3Fc%23d%25e%2Ff?token=t", ""},
		{"{topic}", "ünï", hooks + "%C3%BCn%C3%AF?token=t", ""},
		{"{topic}", "http://127.0.0.1:18082/stolen", hooks + "http%3A%2F%2F127.0.0.1%3A18082%2Fstolen?token=t", ""},
		{"a/{topic}", "../../admin", hooks + "a/..%2F..%2Fadmin?token=t", ""},
		{"{topic}", "..", "", `".." segment`},
		{"a/{topic}/b", ".", "", `"." segment`},
		{"HTTPS://other.example/x/{topic}", "orders", "https://other.example/x/orders", ""},
		{"https://other.example/x/{topic}", "evil.example#", "https://other.example/x/evil.example%23", ""},
		{"https://other.example/in?t={topic}", "a&b=c", "https://other.example/in?t=a%26b%3Dc", ""},
		{"https://other.example/{topic}", "..", "", `".." segment`},
	} {
		route := outbox.MustParseRoute(tc.route)
		if err := checkRoute(base, route); err != nil {
			t.Errorf("route %q: %v", tc.route, err)
			continue
		}
		p := &Publisher{base: base, route: route}
		u, err := p.target(&outbox.Message{ID: outbox.NewID(), Topic: tc.topic})
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("route %q, topic %q: %v, %v; want an error with %q", tc.route, tc.topic, u, err, tc.err)
			}
		case err != nil:
			t.Errorf("route %q, topic %q: %v", tc.route, tc.topic, err)
		case u.String() != tc.want:
			t.Errorf("route %q, topic %q: %q, want %q", tc.route, tc.topic, u, tc.want)
		}
	}
}

func TestCheckHeader(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, value string
		ok          bool
	}{
		{"X-Trace", "abc", true},
		{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", true},
		{"X-Tenant", "tenant 7 / ü", true},
		{"Empty", "", true},
		{"Tabbed", "a\tb", true},
		{"!#$%&'*+-.^_`|~", "x", true},
		{"", "x", false},
		{"Bad Name", "x", false},
		{"Bad:Name", "x", false},
		{"Bad\x00", "x", false},
		{"X-Ctl", "a\x01b", false},
		{"X-Del", "a\x7fb", false},
		{"X-Nl", "a\nb", false},
		{"Host", "evil.example", false},
		{"transfer-encoding", "chunked", false},
		{"Connection", "close", false},
		{"content-length", "5", false},
		{"Authorization", "Basic eDp5", false},
	} {
		if got := checkHeader(tc.name, tc.value) == ""; got != tc.ok {
			t.Errorf("checkHeader(%q, %q) ok = %v, want %v (%s)", tc.name, tc.value, got, tc.ok, checkHeader(tc.name, tc.value))
		}
	}
	// A name with a non-ASCII character names that character, not its first byte.
	if got := checkHeader("X-é", "x"); !strings.Contains(got, "'é' at byte 2") {
		t.Errorf("checkHeader(X-é) = %q, want the character named", got)
	}
}

func TestStatusErrorText(t *testing.T) {
	t.Parallel()
	e := &StatusError{Method: http.MethodPost, URL: "https://h/x", StatusCode: 308, Location: "https://new/x", Body: "moved"}
	if got, want := e.Error(), "outboxwebhook: POST https://h/x: 308 Permanent Redirect (redirect to https://new/x, not followed: point the URL or the route at the final address): moved"; got != want {
		t.Errorf("Error() =\n%s\nwant\n%s", got, want)
	}
	e = &StatusError{Method: http.MethodPost, URL: "https://h/x", StatusCode: 429, RetryAfter: 30 * time.Second}
	if got, want := e.Error(), "outboxwebhook: POST https://h/x: 429 Too Many Requests (Retry-After 30s)"; got != want {
		t.Errorf("Error() = %s, want %s", got, want)
	}
}
