package outboxwebhook

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outbox"
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

// Signed is what a request's signature covers.
type Signed struct {
	Time   time.Time // when it was signed: the t= of the header, in whole seconds
	Method string    // the request's method: POST
	Target string    // the request target as sent: escaped path and query ("/hooks/orders?x=1")
	ID     string    // the message's ID, the Outbox-Id header
	Key    string    // the Idempotency-Key header (the message's dedup key)
	Body   []byte
}

// Sign returns the value of the Outbox-Signature header for a request, signed with every
// secret:
//
//	t=<unix seconds>,v2=<hex HMAC-SHA256 with secrets[0]>,v2=<... with secrets[1]>,...
//
// Each HMAC-SHA256 is computed over
//
//	<unix seconds> "\n" <method> "\n" <target> "\n" <id> "\n" <idempotency key> "\n" <body>
//
// where the id and the key are trimmed of surrounding spaces and tabs, as HTTP trims
// them in transit. None of the parts before the body can hold a line feed, so the
// signed string cannot be read two ways. Signing with several secrets lets a secret be
// rotated without a moment where the publisher and the receiver disagree: the publisher
// signs with the old and the new secret, receivers move to the new one, then the
// publisher drops the old one.
//
// The signature covers the timestamp (a captured request can be replayed only within the
// receiver's tolerance), the method and target (it cannot be replayed to another
// endpoint of the receiver), the message's ID and idempotency key (a replay within the
// tolerance is a duplicate the receiver drops: see Verify) and the body. It does not
// cover the other headers (Outbox-Event-Type and the like): a receiver that must trust
// them puts them in the body too.
func Sign(secrets [][]byte, s Signed) string {
	ts := strconv.FormatInt(s.Time.Unix(), 10)
	b := make([]byte, 0, len("t=")+len(ts)+len(secrets)*(len(",v2=")+2*sha256.Size))
	b = append(b, "t="...)
	b = append(b, ts...)
	for _, secret := range secrets {
		b = append(b, ",v2="...)
		b = hex.AppendEncode(b, signature(secret, ts, s))
	}
	return string(b)
}

// signature is the v2 HMAC of one secret, ts standing for s.Time.
func signature(secret []byte, ts string, s Signed) []byte {
	mac := hmac.New(sha256.New, secret)
	for _, part := range []string{ts, s.Method, s.Target, trimOWS(s.ID), trimOWS(s.Key)} {
		io.WriteString(mac, part)
		mac.Write([]byte{'\n'})
	}
	mac.Write(s.Body)
	return mac.Sum(nil)
}

func trimOWS(s string) string { return strings.Trim(s, " \t") }

// Verify checks the Outbox-Signature of a request that a Publisher sent and returns its
// body, read in full. It fails with an error matching ErrInvalidSignature when the header
// is missing or malformed, when its timestamp is further than tolerance from the
// receiver's clock (DefaultTolerance when tolerance is zero or negative), or when no
// signature in it was made with one of secrets over this method, request target,
// Outbox-Id, Idempotency-Key and body. The request target is the one the request line
// carried (r.RequestURI): behind a proxy that rewrites paths, give the receiver the
// path the publisher was configured with. Empty secrets are ignored: they would let anyone
// sign. Comparisons take constant time.
//
// A request within the tolerance can be replayed, to the same endpoint only, by whoever
// captured it; it carries the same Outbox-Id, so a receiver that records the ids it
// processed (as it must anyway: delivery is at least once; outbox.Inbox does it in the
// handler's own transaction) drops the replay. Verify reads the body without a limit:
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
	target := r.RequestURI
	if target == "" { // a client-side request, not one a server read
		target = r.URL.RequestURI()
	}
	signed := Signed{Method: r.Method, Target: target, ID: r.Header.Get(outbox.HeaderID), Key: r.Header.Get(HeaderIdempotencyKey), Body: body}
	for _, s := range secrets {
		if len(s) == 0 {
			continue
		}
		want := signature(s, ts, signed)
		for _, sig := range sigs {
			if hmac.Equal(sig, want) {
				return body, nil
			}
		}
	}
	return nil, fmt.Errorf("%w: no signature matches a secret of the receiver (%d signature(s), %d secret(s))",
		ErrInvalidSignature, len(sigs), len(secrets))
}

// parseSignature splits an Outbox-Signature header into its timestamp and its v2
// signatures. Other schemes (v1=, of earlier versions, which covered neither the target
// nor the id, or a future v3=) are skipped, so that a new scheme can be sent next to v2.
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
		case "v2":
			sig, err := hex.DecodeString(value)
			if err != nil || len(sig) != sha256.Size {
				return "", nil, malformed("a v2 signature is not 64 hex digits")
			}
			sigs = append(sigs, sig)
		}
	}
	switch {
	case ts == "":
		return "", nil, malformed("no timestamp (t=)")
	case len(sigs) == 0:
		return "", nil, malformed("no v2 signature")
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
