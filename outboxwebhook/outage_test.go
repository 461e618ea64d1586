package outboxwebhook_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxtest/conformance"
	"github.com/outboxkit/outbox/outboxwebhook"
)

// statusServer answers POST /<code> with that status and a body naming it (a 3xx with a
// Location, and a Retry-After when the request asks for one in X-Test-Retry-After), and
// anything else with 204. It counts the requests it gets by path.
type statusServer struct {
	srv  *httptest.Server
	mu   sync.Mutex
	hits map[string]int
}

func newStatusServer(t *testing.T) *statusServer {
	s := &statusServer{hits: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.hits[r.URL.Path]++
		s.mu.Unlock()
		code, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		if err != nil {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if ra := r.Header.Get("X-Test-Retry-After"); ra != "" {
			w.Header().Set("Retry-After", ra)
		}
		if code/100 == 3 {
			w.Header().Set("Location", "/moved?token=s3cret")
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, "answer\r\nto %s", r.URL.Path)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *statusServer) hitsOf(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits[path]
}

func (s *statusServer) publisher(t *testing.T, cfg outboxwebhook.Config) *outboxwebhook.Publisher {
	t.Helper()
	cfg.Unsigned = len(cfg.Secrets) == 0
	pub, err := outboxwebhook.Dial(testenv.Context(t), s.srv.URL, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	return pub
}

// TestStatuses sends one message per status to a real server, in one batch, and checks
// the classification of every family.
func TestStatuses(t *testing.T) {
	t.Parallel()
	s := newStatusServer(t)
	pub := s.publisher(t, outboxwebhook.Config{})
	confirmed := []int{200, 201, 202, 204, 299}
	rejected := []int{400, 404, 405, 410, 413, 415, 422, 451}
	outages := []int{301, 302, 303, 307, 308, 401, 403, 408, 409, 425, 429, 500, 501, 502, 503, 504, 599}
	var batch []*outbox.Message
	want := map[int]string{}
	for kind, codes := range map[string][]int{"confirmed": confirmed, "rejected": rejected, "outage": outages} {
		for _, code := range codes {
			want[len(batch)] = kind
			batch = append(batch, newMsg(strconv.Itoa(code), strconv.Itoa(code), "{}"))
		}
	}
	errs := pub.Publish(testenv.Context(t), batch)
	if len(errs) != len(batch) {
		t.Fatalf("errs = %v", errs)
	}
	for i, err := range errs {
		code := batch[i].Topic
		var se *outboxwebhook.StatusError
		switch want[i] {
		case "confirmed":
			if err != nil {
				t.Errorf("%s: %v, want confirmed", code, err)
			}
			continue
		case "rejected":
			if err == nil || outbox.IsUnavailable(err) {
				t.Errorf("%s: %v, want a rejection", code, err)
			}
		case "outage":
			if _, ok := outbox.AsDestinationOutage(err); !ok {
				t.Errorf("%s: %v, want an outage of the destination", code, err)
			}
		}
		if !errors.As(err, &se) || strconv.Itoa(se.StatusCode) != code {
			t.Errorf("%s: %v, want a StatusError with its status", code, err)
			continue
		}
		if se.Body != "answer to /"+code {
			t.Errorf("%s: body %q", code, se.Body)
		}
		if se.StatusCode/100 == 3 {
			if se.Location != s.srv.URL+"/…?REDACTED" || !strings.Contains(err.Error(), "not followed") {
				t.Errorf("%s: %v, want the redacted Location and a hint", code, err)
			}
		}
	}
	if n := s.hitsOf("/moved"); n != 0 {
		t.Errorf("a redirect was followed %d times", n)
	}
}

// TestErrorBody checks that an error holds the first KiB of the answer on one line, and
// that a long answer does not cost more than reading it.
func TestErrorBody(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnprocessableEntity)
		fmt.Fprint(w, "line one\nline two\x00 ")
		fmt.Fprint(w, strings.Repeat("x", 1<<20))
	}))
	t.Cleanup(srv.Close)
	pub, err := outboxwebhook.New(srv.Client(), outboxwebhook.Config{URL: srv.URL, Unsigned: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	err = publishOne(t, pub, newMsg("t", "k", "{}"))
	requireRejection(t, "422", err)
	var se *outboxwebhook.StatusError
	if !errors.As(err, &se) {
		t.Fatalf("%v, want a StatusError", err)
	}
	if want := "line one line two " + strings.Repeat("x", 1024-len("line one\nline two\x00 ")) + " [...]"; se.Body != want {
		t.Errorf("body = %q (%d bytes), want %q", se.Body, len(se.Body), want)
	}
}

// TestRetryAfter checks that a 429's Retry-After holds back every request to the host,
// and Ping, until it has passed, by a fake clock.
func TestRetryAfter(t *testing.T) {
	t.Parallel()
	s := newStatusServer(t)
	pub := s.publisher(t, outboxwebhook.Config{Route: "{topic}"})
	var mu sync.Mutex
	now := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	outboxwebhook.SetNow(pub, func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	})
	advance := func(d time.Duration) {
		mu.Lock()
		now = now.Add(d)
		mu.Unlock()
	}
	throttle := func(retryAfter string) *outboxwebhook.StatusError {
		m := newMsg("429", "k", "{}")
		m.Headers = map[string]string{"X-Test-Retry-After": retryAfter}
		err := publishOne(t, pub, m)
		requireOutage(t, "429", err)
		var se *outboxwebhook.StatusError
		if !errors.As(err, &se) {
			t.Fatalf("429: %v, want a StatusError", err)
		}
		return se
	}

	if se := throttle("120"); se.RetryAfter != 2*time.Minute {
		t.Errorf("RetryAfter = %v, want 2m", se.RetryAfter)
	}
	err := publishOne(t, pub, newMsg("200", "k", "{}"))
	requireOutage(t, "while held", err)
	if !strings.Contains(err.Error(), "Retry-After") {
		t.Errorf("while held: %v", err)
	}
	requireOutage(t, "Ping while held", pub.Ping(testenv.Context(t)))
	if n := s.hitsOf("/200"); n != 0 {
		t.Errorf("%d requests sent while held", n)
	}
	advance(2 * time.Minute)
	if err := pub.Ping(testenv.Context(t)); err != nil {
		t.Errorf("Ping after the Retry-After: %v", err)
	}
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), []*outbox.Message{newMsg("200", "k", "{}")}))

	// An HTTP date; a day is capped at 5 minutes.
	if se := throttle(now.Add(90 * time.Second).Format(http.TimeFormat)); se.RetryAfter != 90*time.Second {
		t.Errorf("RetryAfter = %v, want 90s", se.RetryAfter)
	}
	advance(90 * time.Second)
	throttle("86400")
	advance(5*time.Minute - time.Second)
	requireOutage(t, "before the cap", publishOne(t, pub, newMsg("200", "k", "{}")))
	advance(time.Second)
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), []*outbox.Message{newMsg("200", "k", "{}")}))
	// A rejection's Retry-After holds nothing back.
	m := newMsg("422", "k", "{}")
	m.Headers = map[string]string{"X-Test-Retry-After": "60"}
	requireRejection(t, "422", publishOne(t, pub, m))
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), []*outbox.Message{newMsg("200", "k", "{}")}))
}

// hangServer holds every request until the client gives up, and says when one arrived.
func hangServer(t *testing.T) (*httptest.Server, <-chan struct{}) {
	arrived := make(chan struct{}, 100)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead {
			return
		}
		// The server notices that the client gave up only once the body was read.
		_, _ = io.Copy(io.Discard, r.Body)
		arrived <- struct{}{}
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	return srv, arrived
}

func TestTimeout(t *testing.T) {
	t.Parallel()
	srv, _ := hangServer(t)
	pub, err := outboxwebhook.Dial(testenv.Context(t), srv.URL, outboxwebhook.Config{Unsigned: true, Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	err = publishOne(t, pub, newMsg("t", "k", "{}"))
	requireOutage(t, "timeout", err)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer within 50ms") {
		t.Errorf("timeout: %v", err)
	}
}

func TestCancelInFlight(t *testing.T) {
	t.Parallel()
	srv, arrived := hangServer(t)
	pub, err := outboxwebhook.Dial(testenv.Context(t), srv.URL, outboxwebhook.Config{Unsigned: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan []error)
	go func() { done <- pub.Publish(ctx, []*outbox.Message{newMsg("t", "a", "{}"), newMsg("t", "b", "{}")}) }()
	testenv.AwaitRecv(t, "the first request to arrive", arrived)
	testenv.AwaitRecv(t, "the second request to arrive", arrived)
	cancel()
	for i, err := range testenv.AwaitRecv(t, "Publish to return once its ctx was cancelled", done) {
		requireOutage(t, fmt.Sprint("message ", i), err)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("message %d: %v, want context.Canceled", i, err)
		}
	}
}

// TestClose: Close cancels requests in flight as outages and waits for Publish to
// return; later calls fail with ErrClosed; closing twice is safe.
func TestClose(t *testing.T) {
	t.Parallel()
	srv, arrived := hangServer(t)
	// Close must not return before the Publish it cancels. The Publish's own return is
	// seen only by the goroutine that called it, after Close may have returned; its
	// request's end is seen by the transport, while Publish still runs, so before Close
	// can return.
	transport := &endTransport{RoundTripper: srv.Client().Transport}
	pub, err := outboxwebhook.New(&http.Client{Transport: transport}, outboxwebhook.Config{URL: srv.URL, Unsigned: true})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan []error, 1)
	go func() { done <- pub.Publish(context.Background(), []*outbox.Message{newMsg("t", "k", "{}")}) }()
	testenv.AwaitRecv(t, "the request to arrive", arrived)
	pub.Close()
	if n := transport.ended.Load(); n != 1 {
		t.Fatalf("Close returned with %d of 1 requests ended: it did not wait for Publish", n)
	}
	errs := testenv.AwaitRecv(t, "Publish to return", done)
	requireOutage(t, "in flight at Close", errs[0])
	if !errors.Is(errs[0], outboxwebhook.ErrClosed) {
		t.Errorf("in flight at Close: %v, want ErrClosed", errs[0])
	}
	pub.Close()
	errs = pub.Publish(context.Background(), []*outbox.Message{newMsg("t", "a", "{}"), newMsg("t", "b", "{}")})
	if len(errs) != 2 {
		t.Fatalf("after Close: %v", errs)
	}
	for _, err := range append(errs, pub.Ping(context.Background())) {
		requireOutage(t, "after Close", err)
		if !errors.Is(err, outboxwebhook.ErrClosed) {
			t.Errorf("after Close: %v, want ErrClosed", err)
		}
	}
}

// endTransport counts the requests that have ended.
type endTransport struct {
	http.RoundTripper
	ended atomic.Int32
}

func (e *endTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	defer e.ended.Add(1)
	return e.RoundTripper.RoundTrip(r)
}

func TestConnectionRefused(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://user:pa55word@" + ln.Addr().String() + "/hooks?token=t0ken"
	ln.Close()
	_, errDial := outboxwebhook.Dial(testenv.Context(t), url, outboxwebhook.Config{Secrets: testSecrets})
	requireOutage(t, "Dial", errDial)
	pub, err := outboxwebhook.New(&http.Client{}, outboxwebhook.Config{URL: url, Secrets: testSecrets})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	errPub := publishOne(t, pub, newMsg("t", "k", "{}"))
	requireOutage(t, "Publish", errPub)
	errPing := pub.Ping(testenv.Context(t))
	requireOutage(t, "Ping", errPing)
	for _, err := range []error{errDial, errPub, errPing} {
		if text := err.Error(); !strings.Contains(text, "connection refused") || strings.Contains(text, "pa55word") ||
			strings.Contains(text, "t0ken") || strings.Contains(text, string(testSecrets[0])) {
			t.Errorf("%v: want connection refused, no credentials", err)
		}
	}
}

// TestConcurrentBatch: the receiver answers only once every message of the batch is in
// flight at once; a publisher that sent them one at a time would time out.
func TestConcurrentBatch(t *testing.T) {
	t.Parallel()
	const n = 8
	var inFlight atomic.Int32
	all := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead {
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		if inFlight.Add(1) == n {
			close(all)
		}
		select {
		case <-all:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	pub, err := outboxwebhook.Dial(testenv.Context(t), srv.URL, outboxwebhook.Config{Unsigned: true, MaxConcurrency: n})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	batch := make([]*outbox.Message, n)
	for i := range batch {
		batch[i] = newMsg("t", strconv.Itoa(i), "{}")
	}
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batch))
}

// TestMaxConcurrency runs batches larger than MaxConcurrency from several goroutines: the
// receiver never sees more requests at once than that.
func TestMaxConcurrency(t *testing.T) {
	t.Parallel()
	const limit, workers, rounds, per = 4, 3, 10, 10
	var inFlight, peak atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(time.Millisecond) // let requests overlap
	}))
	t.Cleanup(srv.Close)
	pub, err := outboxwebhook.Dial(testenv.Context(t), srv.URL, outboxwebhook.Config{Unsigned: true, MaxConcurrency: limit})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				batch := make([]*outbox.Message, per)
				for i := range batch {
					batch[i] = newMsg("t", fmt.Sprint(w, r, i), "{}")
				}
				for i, err := range pub.Publish(testenv.Context(t), batch) {
					if err != nil {
						t.Errorf("worker %d round %d message %d: %v", w, r, i, err)
					}
				}
			}
		})
	}
	wg.Wait()
	if p := peak.Load(); p > limit {
		t.Errorf("%d requests in flight at once, MaxConcurrency is %d", p, limit)
	}
}

// TestConnectionReuse sends batches whose requests the receiver holds until all are in
// flight, so each batch needs MaxConcurrency connections at once: Dial's client keeps
// them all open for the next batch.
func TestConnectionReuse(t *testing.T) {
	t.Parallel()
	const limit, rounds = 6, 10
	var (
		mu      sync.Mutex
		waiting int
		release = make(chan struct{})
		conns   atomic.Int32
	)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead {
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		all := release
		if waiting++; waiting == limit {
			close(release)
			release, waiting = make(chan struct{}), 0
		}
		mu.Unlock()
		select {
		case <-all:
		case <-r.Context().Done():
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	pub, err := outboxwebhook.Dial(testenv.Context(t), srv.URL, outboxwebhook.Config{Unsigned: true, MaxConcurrency: limit})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	for r := range rounds {
		batch := make([]*outbox.Message, limit)
		for i := range batch {
			batch[i] = newMsg("t", fmt.Sprint(r, i), "{}")
		}
		testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batch))
	}
	// A client keeping net/http's default of 2 idle connections per host would open
	// limit + (rounds-1)*(limit-2) = 42; allow one extra for a dial racing a freed one.
	if n := conns.Load(); n > limit+1 {
		t.Errorf("%d connections opened for %d batches of %d requests in flight at once", n, rounds, limit)
	}
}

func TestTLS(t *testing.T) {
	t.Parallel()
	rc := &receiver{got: map[string][]conformance.Received{}}
	srv := httptest.NewUnstartedServer(outboxwebhook.VerifyHandler(testSecrets, 0, http.HandlerFunc(rc.store)))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the failed handshake below
	srv.StartTLS()
	t.Cleanup(srv.Close)

	// Without the CA, the handshake fails: an outage naming the certificate.
	_, err := outboxwebhook.Dial(testenv.Context(t), srv.URL, outboxwebhook.Config{Secrets: testSecrets})
	requireOutage(t, "unknown CA", err)
	if !strings.Contains(err.Error(), "certificate") {
		t.Errorf("unknown CA: %v", err)
	}

	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	pub, err := outboxwebhook.Dial(testenv.Context(t), srv.URL+"/tls", outboxwebhook.Config{
		Secrets: testSecrets,
		TLS:     &tls.Config{RootCAs: roots},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), []*outbox.Message{newMsg("orders", "k", `{"tls":true}`)}))
	if got := rc.read("/tls/orders", 1); len(got) != 1 || string(got[0].Payload) != `{"tls":true}` {
		t.Errorf("deliveries: %v", got)
	}
}
