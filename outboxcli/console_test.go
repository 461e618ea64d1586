package outboxcli

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/console"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

// startConsole runs `outbox console` with args in the background and returns the URL it
// serves and its stderr. The command is stopped, and must exit 0, when the test ends.
func startConsole(t *testing.T, env map[string]string, args ...string) (string, *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	args = append([]string{"console", "--log-format", "json"}, args...)
	go func() { done <- run(ctx, args, func(k string) string { return env[k] }, &stdout, &stderr) }()
	exited := false
	t.Cleanup(func() {
		cancel()
		if exited {
			return
		}
		if code := testenv.AwaitRecv(t, "outbox console to stop", done); code != 0 {
			t.Errorf("outbox console exited %d:\n%s", code, stderr.String())
		}
	})
	var u string
	testenv.AwaitCond(t, "the console to listen", func() bool {
		select {
		case code := <-done:
			exited = true
			t.Fatalf("outbox console exited %d:\n%s", code, stderr.String())
		default:
		}
		u = listeningURL(stderr.String())
		return u != ""
	})
	return strings.TrimSuffix(u, "/"), &stderr
}

// listeningURL finds the URL of the "web console listening" line of a JSON log.
func listeningURL(log string) string {
	for _, line := range strings.Split(log, "\n") {
		var rec struct{ Msg, URL string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "web console listening" {
			return rec.URL
		}
	}
	return ""
}

// httpGet gets u without following redirects.
func httpGet(t *testing.T, u string, header ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	c := &http.Client{
		Transport:     &http.Transport{DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       testenv.Stall(), // bounds a hang
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(body)
}

// withPassword returns the test database URL with a password set: the local server
// trusts loopback and never asks for it, so it only has to stay out of every output.
func withPassword(t *testing.T, password string) string {
	t.Helper()
	u, err := url.Parse(testdb.URL())
	if err != nil {
		t.Fatal(err)
	}
	if _, set := u.User.Password(); set {
		t.Skip("OUTBOX_TEST_DATABASE_URL has a password of its own")
	}
	u.User = url.UserPassword(u.User.Username(), password)
	return u.String()
}

func TestConsoleCommandServesTheOutbox(t *testing.T) {
	t.Parallel()
	b := newDeadBundle(t)
	const password = "console-db-s3cret"
	// A dead letter whose last error quotes the password: the page shows it scrubbed.
	leaky := outbox.Message{ID: outbox.NewID(), Topic: "leaky", Payload: []byte(`{}`)}
	b.Write(t, leaky)
	b.Kill(t, leaky.ID, 10, "auth failed for password "+password, time.Minute)

	env := with(b.env, "OUTBOX_DATABASE_URL", withPassword(t, password))
	base, stderr := startConsole(t, env, "--http-addr", "127.0.0.1:0")

	status, _, body := httpGet(t, base+"/")
	if status != http.StatusOK || !strings.Contains(body, `data-stat="dead">4<`) || !strings.Contains(body, `<tr data-topic="orders">`) {
		t.Fatalf("overview: status %d:\n%s", status, body)
	}
	if strings.Contains(body, "This relay") {
		t.Errorf("a console without a relay shows relay counters")
	}
	status, _, body = httpGet(t, base+"/dead?topic=orders")
	if status != http.StatusOK || !strings.Contains(body, b.old.ID.String()) || !strings.Contains(body, b.mid.ID.String()) || strings.Contains(body, b.recent.ID.String()) {
		t.Errorf("dead letters of topic orders: status %d:\n%s", status, body)
	}
	status, _, body = httpGet(t, base+"/dead/"+leaky.ID.String())
	if status != http.StatusOK || !strings.Contains(body, "auth failed for password REDACTED") {
		t.Errorf("detail of the leaky dead letter: status %d:\n%s", status, body)
	}
	for _, path := range []string{"/", "/dead", "/dead/" + leaky.ID.String(), "/dead/confirm?do=purge-all"} {
		if _, _, body := httpGet(t, base+path); strings.Contains(body, password) {
			t.Errorf("GET %s shows the database password", path)
		}
	}
	if strings.Contains(stderr.String(), password) {
		t.Errorf("the log shows the password:\n%s", stderr.String())
	}
}

func TestConsoleRefusesBeyondLoopbackWithoutToken(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OUTBOX_DATABASE_URL": unreachableDB}
	short := writeFile(t, "short", "abc\n")
	empty := writeFile(t, "empty", "\n")
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"--http-addr", "0.0.0.0:8080"}, []string{"--http-addr 0.0.0.0:8080 is beyond loopback", "--http-token", "--http-token-file"}},
		{[]string{"--http-addr", ":8080"}, []string{"--http-addr :8080 is beyond loopback", "every interface", "--http-token"}},
		{[]string{"--http-addr", "192.0.2.1:8080"}, []string{"192.0.2.1 is not a loopback address", "--http-token"}},
		{[]string{"--http-addr", "8080"}, []string{"--http-addr", "host:port"}},
		{[]string{"--http-addr", "localhost:notaport"}, []string{"--http-addr", "unknown port"}},
		{[]string{"--http-addr", ""}, []string{"--http-addr: give the address"}},
		{[]string{"--http-token", "too-short"}, []string{"--http-token: must be at least 16 characters"}},
		{[]string{"--http-token-file", short}, []string{"--http-token: must be at least 16 characters"}},
		{[]string{"--http-token-file", empty}, []string{"--http-token-file", "is empty"}},
		{[]string{"--http-token-file", "/nonexistent/token"}, []string{"--http-token-file"}},
		{[]string{"--http-token", testConsoleToken, "--http-token-file", short}, []string{"give one"}},
	}
	for _, tc := range cases {
		r := must(t, 2, env, append([]string{"console"}, tc.args...)...)
		line := errorLine(r.stderr)
		for _, w := range tc.want {
			if !strings.Contains(line, w) {
				t.Errorf("console %v: error %q does not say %q", tc.args, line, w)
			}
		}
		if strings.Contains(r.stderr, "connect to PostgreSQL") {
			t.Errorf("console %v: connected before checking its flags:\n%s", tc.args, r.stderr)
		}
	}
	// The same rule holds when the address comes from the environment.
	r := must(t, 2, with(env, "OUTBOX_HTTP_ADDR", "0.0.0.0:9"), "console")
	if !strings.Contains(errorLine(r.stderr), "--http-token") {
		t.Errorf("OUTBOX_HTTP_ADDR beyond loopback: %s", r)
	}
}

const testConsoleToken = "cli-console-token-0123456789abcdef"

func TestConsoleTokenFromFile(t *testing.T) {
	t.Parallel()
	b := newDeadBundle(t)
	tokenFile := writeFile(t, "token", testConsoleToken+"\n")
	base, stderr := startConsole(t, b.env, "--http-addr", "127.0.0.1:0", "--http-token-file", tokenFile)

	status, hdr, _ := httpGet(t, base+"/dead")
	if status != http.StatusSeeOther || !strings.HasPrefix(hdr.Get("Location"), "/login") {
		t.Errorf("GET without the token: status %d, location %q", status, hdr.Get("Location"))
	}
	if status, _, _ := httpGet(t, base+"/", "Authorization", "Bearer wrong-token-wrong-token"); status != http.StatusUnauthorized {
		t.Errorf("wrong bearer token: status %d, want 401", status)
	}
	status, _, body := httpGet(t, base+"/dead", "Authorization", "Bearer "+testConsoleToken)
	if status != http.StatusOK || !strings.Contains(body, b.old.ID.String()) {
		t.Errorf("GET with the token: status %d:\n%s", status, body)
	}
	if strings.Contains(body, testConsoleToken) {
		t.Errorf("the page shows the token")
	}
	if strings.Contains(stderr.String(), testConsoleToken) || !strings.Contains(stderr.String(), `"token_required":true`) {
		t.Errorf("the log shows the token, or does not say one is required:\n%s", stderr.String())
	}
}

// TestConsoleFlagsServeARelay is how `outbox relay --http-addr` serves the console: the
// relay's counters and id reach the overview, and an empty --http-addr serves nothing.
func TestConsoleFlagsServeARelay(t *testing.T) {
	t.Parallel()
	b := migrated(t)
	ctx := context.Background()
	inv := &invocation{stdout: io.Discard, stderr: io.Discard, env: func(string) string { return "" }, secrets: &secrets{}, path: "outbox relay"}
	var logs syncBuffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	stats := func() outbox.RelayStats { return outbox.RelayStats{Published: 42, Shards: 64} }

	fs := newFlagSet("relay")
	c := addConsoleFlags(fs, "")
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	stop, err := c.start(ctx, inv, console.Config{Admin: b.driver(t), RelayStats: stats, RelayID: "relay-7"}, log)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if logs.String() != "" {
		t.Errorf("an empty --http-addr served a console:\n%s", logs.String())
	}

	fs = newFlagSet("relay")
	c = addConsoleFlags(fs, "")
	if err := fs.Parse([]string{"--http-addr", "127.0.0.1:0"}); err != nil {
		t.Fatal(err)
	}
	if err := c.check(ctx, inv); err != nil {
		t.Fatal(err)
	}
	stop, err = c.start(ctx, inv, console.Config{Admin: b.driver(t), RelayStats: stats, RelayID: "relay-7"}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	base := strings.TrimSuffix(listeningURL(logs.String()), "/")
	status, _, body := httpGet(t, base+"/")
	if status != http.StatusOK || !strings.Contains(body, `data-stat="relay-published">42<`) || !strings.Contains(body, "relay-7") {
		t.Errorf("overview served for a relay: status %d:\n%s", status, body)
	}
}
