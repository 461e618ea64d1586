package outboxwebhook

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outbox"
)

// ErrClosed is matched (errors.Is) by the outages of a Publisher after Close.
var ErrClosed = errors.New("outboxwebhook: publisher closed")

// StatusError is an answer of the receiver other than 2xx. Publish returns it for the
// message it answers, wrapped with outbox.Outage when the status is an outage (see the
// package documentation); errors.As finds it either way.
type StatusError struct {
	Method     string
	URL        string        // redacted: no user information, the query replaced
	StatusCode int           // the HTTP status
	Location   string        // a redirect's target, redacted
	RetryAfter time.Duration // the answer's Retry-After, when it had one
	Body       string        // the start of the answer's body (1 KiB at most), on one line
}

func (e *StatusError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "outboxwebhook: %s %s: %d %s", e.Method, e.URL, e.StatusCode, http.StatusText(e.StatusCode))
	switch c := e.StatusCode; {
	case c >= 300 && c < 400:
		fmt.Fprintf(&b, " (redirect to %s, not followed: point the URL or the route at the final address)", cmp.Or(e.Location, "an unknown place"))
	case c == http.StatusUnauthorized || c == http.StatusForbidden:
		b.WriteString(" (the receiver refuses the publisher: check the signing secrets, the clocks and the receiver's configuration)")
	}
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, " (Retry-After %v)", e.RetryAfter)
	}
	if e.Body != "" {
		b.WriteString(": ")
		b.WriteString(e.Body)
	}
	return b.String()
}

// statusOutage reports whether a status answering a message's POST is an outage rather
// than a rejection of the message (see the package documentation).
func statusOutage(code int) bool {
	switch code {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusRequestTimeout,
		http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return code < 200 || (code >= 300 && code < 400) || code >= 500
}

// pingOutage reports whether a status answering Ping's HEAD request says the receiver is
// not ready. Any other answer, 401 and 405 included, proves that it is up.
func pingOutage(code int) bool {
	return code >= 500 || code == http.StatusRequestTimeout || code == http.StatusTooManyRequests
}

// errorBodyLimit is how much of a failed answer's body goes into a StatusError;
// drainLimit is how much of an answer is read, after that, so that its connection can be
// used again. A longer answer costs its connection.
const (
	errorBodyLimit = 1 << 10
	drainLimit     = 64 << 10
)

// statusError reads the start of resp's body into a StatusError and closes it.
func statusError(resp *http.Response, now time.Time) *StatusError {
	head, _ := io.ReadAll(io.LimitReader(resp.Body, errorBodyLimit+1))
	drain(resp)
	body := oneLine(head[:min(len(head), errorBodyLimit)])
	if len(head) > errorBodyLimit {
		body += " [...]"
	}
	e := &StatusError{
		Method:     resp.Request.Method,
		URL:        redactURL(resp.Request.URL),
		StatusCode: resp.StatusCode,
		RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), now),
		Body:       body,
	}
	if loc := resp.Header.Get("Location"); loc != "" {
		if u, err := resp.Request.URL.Parse(loc); err == nil {
			e.Location = redactURL(u)
		} else {
			e.Location = "an unparsable Location"
		}
	}
	return e
}

// drain reads what is left of resp's body, up to drainLimit, and closes it.
func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit))
	resp.Body.Close()
}

// oneLine makes text fit a log line: invalid UTF-8 replaced, runs of white space and
// control characters folded to one space.
func oneLine(text []byte) string {
	fields := strings.FieldsFunc(strings.ToValidUTF8(string(text), "\uFFFD"), func(r rune) bool {
		return r <= ' ' || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == '\u2028' || r == '\u2029'
	})
	return strings.Join(fields, " ")
}

// parseRetryAfter reads a Retry-After header: a number of seconds or an HTTP date. It
// returns 0 when there is none or it is unreadable or past.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now).Round(time.Second)
	}
	return 0
}

// transportError turns an error of client.Do into an outage: the request may or may not
// have reached the receiver. publishCtx is the caller's context (merged with Close);
// requestCtx is the request's, with the Timeout.
func transportError(publishCtx, requestCtx context.Context, method string, u *url.URL, timeout time.Duration, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // its text holds the URL unredacted
	}
	target := redactURL(u)
	switch {
	case context.Cause(publishCtx) == ErrClosed:
		err = ErrClosed
	case publishCtx.Err() != nil:
		err = publishCtx.Err()
	case errors.Is(requestCtx.Err(), context.DeadlineExceeded):
		return outbox.Outage(fmt.Errorf("outboxwebhook: %s %s: no answer within %v (Config.Timeout); the outcome is unknown: %w", method, target, timeout, err))
	}
	return outbox.Outage(fmt.Errorf("outboxwebhook: %s %s: %w", method, target, err))
}

// redactURL renders u for errors, logs and last_error: scheme and host only, with
// "REDACTED" for user information and the query and "…" for the path, any of which can
// carry a token (https://hooks.example/services/T000/B000/<token>).
func redactURL(u *url.URL) string {
	r := url.URL{Scheme: u.Scheme, Host: u.Host}
	if u.User != nil {
		r.User = url.User("REDACTED")
	}
	s := r.String()
	if p := u.EscapedPath(); p != "" && p != "/" {
		s += "/…"
	}
	if u.RawQuery != "" || u.ForceQuery {
		s += "?REDACTED"
	}
	return s
}
