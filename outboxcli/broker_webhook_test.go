package outboxcli

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxwebhook"
)

// TestRelayWebhook runs the relay against a receiver that verifies signatures: messages
// are posted under --broker's path, signed with the secrets of --webhook-secret-file,
// and neither the secrets nor the token in --broker's query reach the output.
func TestRelayWebhook(t *testing.T) {
	t.Parallel()
	b := migrated(t)
	const newSecret, oldSecret, token = "webhook-new-s3cret", "webhook-old-s3cret", "t0ken-in-query"
	type delivery struct {
		header http.Header
		body   string
	}
	var (
		mu  sync.Mutex
		got = map[string][]delivery{} // by path
	)
	receiver := httptest.NewServer(outboxwebhook.VerifyHandler([][]byte{[]byte(newSecret)}, 0,
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			if r.URL.Query().Get("token") != token {
				http.Error(w, "no token", http.StatusForbidden)
				return
			}
			mu.Lock()
			got[r.URL.Path] = append(got[r.URL.Path], delivery{r.Header, string(body)})
			mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
		})))
	t.Cleanup(receiver.Close)
	msgs := []outbox.Message{
		{ID: outbox.NewID(), Topic: "orders", Key: "o-1", Payload: []byte(`{"n":1}`), DedupKey: "order-1-placed"},
		{ID: outbox.NewID(), Topic: "orders", Key: "o-1", Payload: []byte(`{"n":2}`)},
	}
	b.Write(t, msgs...)
	secretFile := writeFile(t, "secrets", newSecret+"\n  "+oldSecret+"\r\n\n")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	env := with(b.env, "OUTBOX_POLL_INTERVAL", "50ms", "OUTBOX_WEBHOOK_SECRET_FILE", secretFile)
	go func() {
		done <- run(ctx, []string{"relay", "--broker", receiver.URL + "/hooks?token=" + token, "--route", "events/{topic}",
			"--log-format", "json"}, func(k string) string { return env[k] }, &stdout, &stderr)
	}()
	var reqs []delivery
	testenv.Await(t, "2 webhooks at /hooks/events/orders", func() (any, bool) {
		mu.Lock()
		defer mu.Unlock()
		reqs = got["/hooks/events/orders"]
		return len(reqs), len(reqs) >= 2
	})
	mu.Lock()
	for i, m := range msgs {
		d := reqs[i]
		if d.body != string(m.Payload) || d.header.Get(outbox.HeaderID) != m.ID.String() ||
			d.header.Get(outboxwebhook.HeaderIdempotencyKey) != m.DedupID() {
			t.Errorf("webhook %d: %v %s, want payload %s, id %s", i, d.header, d.body, m.Payload, m.ID)
		}
		if n := strings.Count(d.header.Get(outboxwebhook.HeaderSignature), "v2="); n != 2 {
			t.Errorf("webhook %d: %d signatures, want one per secret", i, n)
		}
	}
	mu.Unlock()

	cancel()
	if code := testenv.AwaitRecv(t, "the relay to stop after its context ended", done); code != 0 {
		t.Fatalf("relay exited %d after a graceful stop\nstderr:\n%s", code, stderr.String())
	}
	for _, secret := range []string{newSecret, oldSecret, token} {
		if strings.Contains(stdout.String()+stderr.String(), secret) {
			t.Errorf("%q appears in the output:\n%s%s", secret, stdout.String(), stderr.String())
		}
	}
}

// TestRelayWebhookUnreachable: a receiver that does not answer fails the start, with
// its URL's credentials out of the output.
func TestRelayWebhookUnreachable(t *testing.T) {
	t.Parallel()
	b := migrated(t)
	const password, secret = "pa55word-in-url", "webhook-s3cret"
	r := cli(t, b.env, "relay", "--broker", "http://user:"+password+"@127.0.0.1:1/hooks", "--webhook-secret", secret)
	if r.code != 1 || !strings.Contains(errorLine(r.stderr), "connection refused") {
		t.Errorf("want a refused connection (exit 1), got %s", r)
	}
	for _, s := range []string{password, secret} {
		if strings.Contains(r.stdout+r.stderr, s) {
			t.Errorf("%q appears in the output:\n%s", s, r)
		}
	}
}

func TestRelayWebhookRejectsBadSettingsBeforeConnecting(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OUTBOX_DATABASE_URL": unreachableDB, "OUTBOX_BROKER": "http://127.0.0.1:1/hooks"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--webhook-secret: required"},
		{[]string{"--webhook-secret", "s", "--webhook-secret-file", "/dev/null"}, "give one"},
		{[]string{"--webhook-secret-file", "/nonexistent/secrets"}, "--webhook-secret-file"},
		{[]string{"--webhook-secret", "s", "--webhook-unsigned"}, "--webhook-unsigned"},
		{[]string{"--webhook-secret", "s", "--webhook-max-concurrency", "-1"}, "--webhook-max-concurrency"},
		{[]string{"--webhook-secret", "s", "--route", "{topic}/../admin"}, "--route"},
		{[]string{"--webhook-secret", "s", "--broker-tls-server-name", "hooks"}, "TLS needs an https:// --broker URL"},
	} {
		r := cli(t, env, append([]string{"relay"}, tc.args...)...)
		if r.code != 2 || !strings.Contains(errorLine(r.stderr), tc.want) {
			t.Errorf("relay %v: want exit 2 and %q, got %s", tc.args, tc.want, r)
		}
	}
}
