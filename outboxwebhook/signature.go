package outboxwebhook

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Header names of the webhook protocol, next to the Outbox-* headers of package outbox.
// A message's own headers of these names are overwritten.
const (
	// HeaderSignature carries the request's signatures (see Sign).
	HeaderSignature = "Outbox-Signature"
	// HeaderIdempotencyKey carries the message's dedup key (outbox.Message.DedupID), as in
	// the IETF draft "The Idempotency-Key HTTP Header Field": receivers deduplicate on it.
	HeaderIdempotencyKey = "Idempotency-Key"
)

// DefaultTolerance is how far a signature's timestamp may be from the receiver's clock
// when Verify is given no tolerance: five minutes, as Stripe and Standard Webhooks use.
const DefaultTolerance = 5 * time.Minute

// ErrInvalidSignature is matched (errors.Is) by every error of Verify that concerns the
// signature: missing, malformed, expired, or made with none of the receiver's secrets.
var ErrInvalidSignature = errors.New("outboxwebhook: invalid signature")

// Sign returns the value of the Outbox-Signature header for a request carrying body and
// the idempotency key key, sent at t, signed with every secret:
//
//	t=<unix seconds>,v1=<hex HMAC-SHA256 with secrets[0]>,v1=<... with secrets[1]>,...
//
// Each HMAC-SHA256 is computed over
//
//	<unix seconds> "\n" <idempotency key> "\n" <body>
//
// where the key is trimmed of surrounding spaces and tabs, as HTTP trims it in transit.
// Neither the timestamp nor a header value can hold a line feed, so the signed string
// cannot be read two ways (with a dot between key and body, key "a.b" with body "c" and
// key "a" with body "b.c" would sign alike). Signing with several secrets lets a secret
// be rotated without a moment where the publisher and the receiver disagree: the
// publisher signs with the old and the new secret, receivers move to the new one, then
// the publisher drops the old one.
//
// The signature covers the timestamp (so a captured request can be replayed only within
// the receiver's tolerance), the idempotency key (so a replay within it is a duplicate
// the receiver drops) and the body. It does not cover the other headers (Outbox-Event-Type
// and the like): a receiver that must trust them puts them in the body too.
func Sign(secrets [][]byte, t time.Time, key string, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	key = trimOWS(key)
	b := make([]byte, 0, len("t=")+len(ts)+len(secrets)*(len(",v1=")+2*sha256.Size))
	b = append(b, "t="...)
	b = append(b, ts...)
	for _, s := range secrets {
		b = append(b, ",v1="...)
		b = hex.AppendEncode(b, signature(s, ts, key, body))
	}
	return string(b)
}

// signature is the v1 HMAC of one secret.
func signature(secret []byte, ts, key string, body []byte) []byte {
	mac := hmac.New(sha256.New, secret)
	writeSigned(mac, ts, key, body)
	return mac.Sum(nil)
}

func writeSigned(h hash.Hash, ts, key string, body []byte) {
	io.WriteString(h, ts)
	h.Write([]byte{'\n'})
	io.WriteString(h, key)
	h.Write([]byte{'\n'})
	h.Write(body)
}

func trimOWS(s string) string { return strings.Trim(s, " \t") }

// Verify checks the Outbox-Signature of a request that a Publisher sent and returns its
// body, read in full. It fails with an error matching ErrInvalidSignature when the header
// is missing or malformed, when its timestamp is further than tolerance from the
// receiver's clock (DefaultTolerance when tolerance is zero or negative), or when no
// signature in it was made with one of secrets over this body and Idempotency-Key.
// Empty secrets are ignored: they would let anyone sign. Comparisons take constant time.
//
// A request within the tolerance can be replayed by whoever captured it; it carries the
// same Idempotency-Key, so a receiver that deduplicates on it (as it must anyway:
// delivery is at least once) drops the replay. Verify reads the body without a limit:
// bound it with http.MaxBytesReader (or wrap the handler in http.MaxBytesHandler) first.
// An error reading the body is returned as it is.
func Verify(r *http.Request, secrets [][]byte, tolerance time.Duration) (body []byte, err error) {
	return verify(r, secrets, tolerance, time.Now())
}

func verify(r *http.Request, secrets [][]byte, tolerance time.Duration, now time.Time) ([]byte, error) {
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	header := r.Header.Get(HeaderSignature)
	if header == "" {
		return nil, fmt.Errorf("%w: no %s header", ErrInvalidSignature, HeaderSignature)
	}
	ts, sigs, err := parseSignature(header)
	if err != nil {
		return nil, err
	}
	sec, _ := strconv.ParseInt(ts, 10, 64) // parseSignature checked the digits
	if skew := now.Sub(time.Unix(sec, 0)); skew > tolerance || skew < -tolerance {
		return nil, fmt.Errorf("%w: timestamp %s is %v away from the receiver's clock, over the tolerance of %v (a replay, or clocks out of step)",
			ErrInvalidSignature, ts, skew.Abs().Round(time.Second), tolerance)
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	key := trimOWS(r.Header.Get(HeaderIdempotencyKey))
	for _, s := range secrets {
		if len(s) == 0 {
			continue
		}
		want := signature(s, ts, key, body)
		for _, sig := range sigs {
			if hmac.Equal(sig, want) {
				return body, nil
			}
		}
	}
	return nil, fmt.Errorf("%w: no signature matches a secret of the receiver (%d signature(s), %d secret(s))",
		ErrInvalidSignature, len(sigs), len(secrets))
}

// parseSignature splits an Outbox-Signature header into its timestamp and its v1
// signatures. Unknown schemes (v2=...) are skipped, so that a future scheme can be sent
// next to v1.
func parseSignature(header string) (ts string, sigs [][]byte, err error) {
	malformed := func(reason string) error {
		return fmt.Errorf("%w: malformed %s header: %s", ErrInvalidSignature, HeaderSignature, reason)
	}
	for part := range strings.SplitSeq(header, ",") {
		name, value, ok := strings.Cut(trimOWS(part), "=")
		if !ok {
			return "", nil, malformed("a part without '='")
		}
		switch name {
		case "t":
			if ts != "" {
				return "", nil, malformed("two timestamps")
			}
			if value == "" || len(value) > 18 || strings.Trim(value, "0123456789") != "" {
				return "", nil, malformed("the timestamp is not a number of seconds")
			}
			ts = value
		case "v1":
			sig, err := hex.DecodeString(value)
			if err != nil || len(sig) != sha256.Size {
				return "", nil, malformed("a v1 signature is not 64 hex digits")
			}
			sigs = append(sigs, sig)
		}
	}
	switch {
	case ts == "":
		return "", nil, malformed("no timestamp (t=)")
	case len(sigs) == 0:
		return "", nil, malformed("no v1 signature")
	}
	return ts, sigs, nil
}

// VerifyHandler returns a handler that checks each request with Verify and passes it on
// to next with its body restored. It answers a request that fails with 401 Unauthorized
// (which a Publisher takes as an outage: its secrets are wrong, and pausing loses
// nothing), one whose body is over an http.MaxBytesHandler limit with 413 Content Too
// Large (a rejection of that message), and one whose body cannot be read with 400. The
// answer's text says what was wrong; it holds no secret.
func VerifyHandler(secrets [][]byte, tolerance time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := Verify(r, secrets, tolerance)
		if err != nil {
			var tooLarge *http.MaxBytesError
			switch {
			case errors.Is(err, ErrInvalidSignature):
				http.Error(w, err.Error(), http.StatusUnauthorized)
			case errors.As(err, &tooLarge):
				http.Error(w, fmt.Sprintf("outboxwebhook: body over %d bytes", tooLarge.Limit), http.StatusRequestEntityTooLarge)
			default:
				http.Error(w, "outboxwebhook: read body: "+err.Error(), http.StatusBadRequest)
			}
			return
		}
		r2 := new(http.Request)
		*r2 = *r
		r2.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r2)
	})
}
