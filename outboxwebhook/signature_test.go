package outboxwebhook_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxwebhook"
)

var (
	oldSecret   = []byte("first-secret-0123456789abcdef")
	newSecret   = []byte("second-secret-0123456789abcdef")
	otherSecret = []byte("unrelated-secret-0123456789abcdef")
)

// TestSignKnownAnswer pins the wire format, so receivers written in other languages can
// rely on it. The HMACs were computed with Python's hmac module:
// hmac.new(secret, b"1700000000\nPOST\n/hooks/orders?tenant=7\n<id>\norder-42\n" + body,
// hashlib.sha256).hexdigest().
func TestSignKnownAnswer(t *testing.T) {
	t.Parallel()
	got := outboxwebhook.Sign([][]byte{oldSecret, newSecret}, outboxwebhook.Signed{
		Time: time.Unix(1_700_000_000, 0), Method: http.MethodPost, Target: "/hooks/orders?tenant=7",
		ID: "01890a5d-ac96-774b-bcce-b302099a8057", Key: " order-42\t", Body: []byte(`{"id":42}`)})
	want := "t=1700000000" +
		",v2=7522619a282f44a1393872100bfa78a1b430060baedae6380e780974865a8d84" +
		",v2=596b861b799d234133e91ed4a82ec9e90a2fddfefe92cc7edbb69ad0e64c97b5"
	if got != want {
		t.Errorf("Sign =\n%s\nwant\n%s", got, want)
	}
}

// testID is the Outbox-Id of the requests signedRequest makes.
const testID = "01890a5d-ac96-774b-bcce-b302099a8057"

// signedRequest is a request as a Publisher sends it to /hooks/orders, signed at t.
func signedRequest(secrets [][]byte, t time.Time, key string, body []byte) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/hooks/orders", bytes.NewReader(body))
	r.Header.Set(outboxwebhook.HeaderIdempotencyKey, key)
	r.Header.Set(outbox.HeaderID, testID)
	r.Header.Set(outboxwebhook.HeaderSignature, outboxwebhook.Sign(secrets, outboxwebhook.Signed{
		Time: t, Method: http.MethodPost, Target: "/hooks/orders", ID: testID, Key: key, Body: body}))
	return r
}

// replayedTo is r sent again by someone who captured it, to another target or method.
func replayedTo(r *http.Request, method, target string) *http.Request {
	r2 := httptest.NewRequest(method, target, r.Body)
	r2.Header = r.Header
	return r2
}

func TestVerify(t *testing.T) {
	t.Parallel()
	body := []byte(`{"id":42}`)
	now := time.Now()
	both := [][]byte{oldSecret, newSecret}
	for _, tc := range []struct {
		name      string
		req       func() *http.Request
		secrets   [][]byte
		tolerance time.Duration
		ok        bool
	}{
		{"valid", func() *http.Request { return signedRequest([][]byte{oldSecret}, now, "k", body) }, [][]byte{oldSecret}, 0, true},
		{"empty body", func() *http.Request { return signedRequest([][]byte{oldSecret}, now, "k", nil) }, [][]byte{oldSecret}, 0, true},
		{"wrong secret", func() *http.Request { return signedRequest([][]byte{otherSecret}, now, "k", body) }, [][]byte{oldSecret}, 0, false},
		{"no secrets", func() *http.Request { return signedRequest([][]byte{oldSecret}, now, "k", body) }, nil, 0, false},
		// Rotation: the publisher signs with both; receivers with either secret accept.
		{"rotation, receiver on old", func() *http.Request { return signedRequest(both, now, "k", body) }, [][]byte{oldSecret}, 0, true},
		{"rotation, receiver on new", func() *http.Request { return signedRequest(both, now, "k", body) }, [][]byte{newSecret}, 0, true},
		{"rotation, receiver on both", func() *http.Request { return signedRequest([][]byte{newSecret}, now, "k", body) }, [][]byte{otherSecret, oldSecret, newSecret}, 0, true},
		{"rotation done, old signature", func() *http.Request { return signedRequest([][]byte{oldSecret}, now, "k", body) }, [][]byte{newSecret}, 0, false},
		{"tampered body", func() *http.Request {
			r := signedRequest([][]byte{oldSecret}, now, "k", body)
			r.Body = io.NopCloser(strings.NewReader(`{"id":43}`))
			return r
		}, [][]byte{oldSecret}, 0, false},
		{"tampered idempotency key", func() *http.Request {
			r := signedRequest([][]byte{oldSecret}, now, "k", body)
			r.Header.Set(outboxwebhook.HeaderIdempotencyKey, "k2")
			return r
		}, [][]byte{oldSecret}, 0, false},
		{"idempotency key removed", func() *http.Request {
			r := signedRequest([][]byte{oldSecret}, now, "k", body)
			r.Header.Del(outboxwebhook.HeaderIdempotencyKey)
			return r
		}, [][]byte{oldSecret}, 0, false},
		{"key and body boundary moved", func() *http.Request {
			r := signedRequest([][]byte{oldSecret}, now, "a", []byte("b.c"))
			r.Header.Set(outboxwebhook.HeaderIdempotencyKey, "a.b")
			r.Body = io.NopCloser(strings.NewReader("c"))
			return r
		}, [][]byte{oldSecret}, 0, false},
		{"replayed to another endpoint", func() *http.Request {
			return replayedTo(signedRequest([][]byte{oldSecret}, now, "k", body), http.MethodPost, "/hooks/admin")
		}, [][]byte{oldSecret}, 0, false},
		{"replayed with a query added", func() *http.Request {
			return replayedTo(signedRequest([][]byte{oldSecret}, now, "k", body), http.MethodPost, "/hooks/orders?x=1")
		}, [][]byte{oldSecret}, 0, false},
		{"replayed with another method", func() *http.Request {
			return replayedTo(signedRequest([][]byte{oldSecret}, now, "k", body), http.MethodPut, "/hooks/orders")
		}, [][]byte{oldSecret}, 0, false},
		{"replayed under another id", func() *http.Request {
			r := signedRequest([][]byte{oldSecret}, now, "k", body)
			r.Header.Set(outbox.HeaderID, "01890a5d-ac96-774b-bcce-b302099a8058")
			return r
		}, [][]byte{oldSecret}, 0, false},
		{"tampered timestamp", func() *http.Request {
			r := signedRequest([][]byte{oldSecret}, now, "k", body)
			sig := r.Header.Get(outboxwebhook.HeaderSignature)
			r.Header.Set(outboxwebhook.HeaderSignature, strings.Replace(sig, "t="+strconv.FormatInt(now.Unix(), 10), "t="+strconv.FormatInt(now.Unix()-1, 10), 1))
			return r
		}, [][]byte{oldSecret}, 0, false},
		{"within default tolerance", func() *http.Request { return signedRequest([][]byte{oldSecret}, now.Add(-4*time.Minute), "k", body) }, [][]byte{oldSecret}, 0, true},
		{"expired", func() *http.Request { return signedRequest([][]byte{oldSecret}, now.Add(-6*time.Minute), "k", body) }, [][]byte{oldSecret}, 0, false},
		{"from the future", func() *http.Request { return signedRequest([][]byte{oldSecret}, now.Add(6*time.Minute), "k", body) }, [][]byte{oldSecret}, 0, false},
		{"expired, short tolerance", func() *http.Request { return signedRequest([][]byte{oldSecret}, now.Add(-time.Minute), "k", body) }, [][]byte{oldSecret}, 30 * time.Second, false},
		{"within long tolerance", func() *http.Request { return signedRequest([][]byte{oldSecret}, now.Add(-time.Hour), "k", body) }, [][]byte{oldSecret}, 2 * time.Hour, true},
		// An empty secret would let anyone sign: it never verifies.
		{"empty secret", func() *http.Request { return signedRequest([][]byte{{}}, now, "k", body) }, [][]byte{{}}, 0, false},
		{"unknown scheme next to v2", func() *http.Request {
			r := signedRequest([][]byte{oldSecret}, now, "k", body)
			r.Header.Set(outboxwebhook.HeaderSignature, r.Header.Get(outboxwebhook.HeaderSignature)+",v3=future")
			return r
		}, [][]byte{oldSecret}, 0, true},
		// The first version's scheme signed neither the target nor the id: not accepted.
		{"v1 only", func() *http.Request {
			r := signedRequest([][]byte{oldSecret}, now, "k", body)
			r.Header.Set(outboxwebhook.HeaderSignature, strings.ReplaceAll(r.Header.Get(outboxwebhook.HeaderSignature), "v2=", "v1="))
			return r
		}, [][]byte{oldSecret}, 0, false},
	} {
		body, err := outboxwebhook.Verify(tc.req(), tc.secrets, tc.tolerance)
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.ok && tc.name != "empty body" && string(body) != `{"id":42}`:
			t.Errorf("%s: body %q", tc.name, body)
		case !tc.ok && err == nil:
			t.Errorf("%s: verified", tc.name)
		case !tc.ok && !errors.Is(err, outboxwebhook.ErrInvalidSignature):
			t.Errorf("%s: %v, want ErrInvalidSignature", tc.name, err)
		case !tc.ok && body != nil:
			t.Errorf("%s: failed but returned the body", tc.name)
		}
	}
}

func TestVerifyMalformed(t *testing.T) {
	t.Parallel()
	now := strconv.FormatInt(time.Now().Unix(), 10)
	sig := "v2=" + strings.Repeat("ab", 32)
	for _, header := range []string{
		"",
		"garbage",
		"t=" + now,
		sig,
		"t=" + now + ",v2=zz" + strings.Repeat("ab", 31),
		"t=" + now + ",v2=" + strings.Repeat("ab", 31),
		"t=" + now + ",t=" + now + "," + sig,
		"t=-5," + sig,
		"t=+5," + sig,
		"t=1e9," + sig,
		"t=," + sig,
		"t=99999999999999999999," + sig,
		"t=" + now + "," + sig + ",novalue",
	} {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("x"))
		if header != "" {
			r.Header.Set(outboxwebhook.HeaderSignature, header)
		}
		_, err := outboxwebhook.Verify(r, [][]byte{oldSecret}, 0)
		if !errors.Is(err, outboxwebhook.ErrInvalidSignature) {
			t.Errorf("header %q: %v, want ErrInvalidSignature", header, err)
		}
	}
}

func TestVerifyHandler(t *testing.T) {
	t.Parallel()
	var got []byte
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		w.WriteHeader(http.StatusNoContent)
	})
	h := http.MaxBytesHandler(outboxwebhook.VerifyHandler([][]byte{oldSecret}, 0, next), 16)
	serve := func(r *http.Request) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}

	if w := serve(signedRequest([][]byte{oldSecret}, time.Now(), "k", []byte("hello"))); w.Code != http.StatusNoContent || string(got) != "hello" {
		t.Errorf("valid request: %d %q, next got body %q", w.Code, w.Body, got)
	}
	got = nil
	w := serve(signedRequest([][]byte{otherSecret}, time.Now(), "k", []byte("hello")))
	if w.Code != http.StatusUnauthorized || got != nil {
		t.Errorf("wrong secret: %d, next called: %v", w.Code, got != nil)
	}
	if body := w.Body.String(); !strings.Contains(body, "no signature matches") || strings.Contains(body, string(oldSecret)) {
		t.Errorf("wrong secret: answer %q", body)
	}
	if w := serve(signedRequest([][]byte{oldSecret}, time.Now(), "k", bytes.Repeat([]byte("x"), 17))); w.Code != http.StatusRequestEntityTooLarge || got != nil {
		t.Errorf("body over the limit: %d %q", w.Code, w.Body)
	}
	if w := serve(httptest.NewRequest(http.MethodHead, "/", nil)); w.Code != http.StatusUnauthorized || got != nil {
		t.Errorf("unsigned HEAD: %d", w.Code)
	}
}

// FuzzVerify checks that Verify never panics on any signature header, and that a request
// signed by Sign verifies whatever its idempotency key and body.
func FuzzVerify(f *testing.F) {
	f.Add("order-42", []byte(`{"id":42}`), "t=1700000000,v2="+strings.Repeat("ab", 32))
	f.Add(" spaced\t", []byte{}, "t=1,t=2")
	f.Add("a.b", []byte("\n\x00"), ",,v2=,=")
	f.Fuzz(func(t *testing.T, key string, body []byte, header string) {
		r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		r.Header.Set(outboxwebhook.HeaderSignature, header)
		r.Header.Set(outboxwebhook.HeaderIdempotencyKey, key)
		if _, err := outboxwebhook.Verify(r, [][]byte{oldSecret}, 0); err == nil && !strings.Contains(header, "v2=") {
			t.Fatalf("header %q verified without a signature", header)
		}
		got, err := outboxwebhook.Verify(signedRequest([][]byte{newSecret, oldSecret}, time.Now(), key, body), [][]byte{oldSecret}, 0)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("key %q, body %q: %v", key, body, err)
		}
	})
}
