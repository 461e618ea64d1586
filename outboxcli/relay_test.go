package outboxcli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testnats"
	"github.com/outboxkit/outbox/outboxdriver"
)

// natsStream returns a fresh stream name and subject prefix, and deletes the stream
// (which the relay under test creates) when the test ends.
func natsStream(t *testing.T, js jetstream.JetStream) (name, prefix string) {
	t.Helper()
	unique := testnats.Unique()
	name, prefix = "CLI_"+strings.ToUpper(unique), unique+"."
	t.Cleanup(func() {
		ctx, cancel := testenv.CallContext()
		defer cancel()
		if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Logf("delete stream %s: %v", name, err)
		}
	})
	return name, prefix
}

// streamMessages waits until stream holds n messages and returns them in order.
func streamMessages(t *testing.T, js jetstream.JetStream, stream string, n int) []*jetstream.RawStreamMsg {
	t.Helper()
	var s jetstream.Stream
	testenv.Await(t, fmt.Sprintf("%d messages in stream %s", n, stream), func() (any, bool) {
		ctx, cancel := testenv.CallContext()
		defer cancel()
		var err error
		if s, err = js.Stream(ctx, stream); err != nil {
			return err, false
		}
		info, err := s.Info(ctx)
		if err != nil {
			return err, false
		}
		return fmt.Sprintf("%d messages", info.State.Msgs), info.State.Msgs >= uint64(n)
	})
	ctx := testenv.Context(t)
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; len(out) < int(info.State.Msgs); seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("get message %d: %v", seq, err)
		}
		out = append(out, m)
	}
	return out
}

func statusJSON(t *testing.T, b *testBundle) outboxdriver.Status {
	t.Helper()
	r := must(t, 0, b.env, "status", "--json")
	var st outboxdriver.Status
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("status --json does not parse: %v\n%s", err, r)
	}
	return st
}

func TestRelayEndToEnd(t *testing.T) {
	t.Parallel()
	b := migrated(t)
	js := testnats.JetStream(t, "")
	stream, prefix := natsStream(t, js)

	msgs := []outbox.Message{
		{ID: outbox.NewID(), Topic: "orders", Key: "o-1", EventType: "order.placed", Payload: []byte(`{"n":1}`), DedupKey: "order-1-placed"},
		{ID: outbox.NewID(), Topic: "orders", Key: "o-1", EventType: "order.paid", Payload: []byte(`{"n":2}`)},
		{ID: outbox.NewID(), Topic: "billing", Key: "b-1", Payload: []byte(`{"n":3}`), Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}},
	}
	b.Write(t, msgs[:2]...) // before the relay starts

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	env := with(b.env, "OUTBOX_POLL_INTERVAL", "50ms")
	go func() {
		done <- run(ctx, []string{"relay", "--broker", testnats.URL(), "--route", prefix + "{topic}",
			"--nats-create-stream", stream, "--log-format", "json", "--relay-id", "cli-e2e", "--http-addr", "127.0.0.1:0"},
			func(k string) string { return env[k] }, &stdout, &stderr)
	}()

	got := streamMessages(t, js, stream, 2)
	// The relay serves the web console, with its own counters.
	console := listeningURL(stderr.String())
	if console == "" {
		t.Fatalf("no web console URL in the log:\n%s", stderr.String())
	}
	if code, _, body := httpGet(t, strings.TrimSuffix(console, "/")+"/"); code != 200 || !strings.Contains(body, "This relay") || !strings.Contains(body, `data-stat="relay-published"`) {
		t.Fatalf("console overview: %d\n%s", code, body)
	}
	b.Write(t, msgs[2]) // while it runs
	got = streamMessages(t, js, stream, 3)
	if len(got) != 3 {
		t.Fatalf("stream holds %d messages, want 3", len(got))
	}
	for i, m := range msgs {
		g := got[i]
		wantDedup := m.DedupKey
		if wantDedup == "" {
			wantDedup = m.ID.String()
		}
		if g.Subject != prefix+m.Topic || string(g.Data) != string(m.Payload) || g.Header.Get("Nats-Msg-Id") != wantDedup ||
			g.Header.Get(outbox.HeaderID) != m.ID.String() {
			t.Errorf("message %d: subject %q, data %q, headers %v; want %q, %q, dedup %q, id %s",
				i, g.Subject, g.Data, g.Header, prefix+m.Topic, m.Payload, wantDedup, m.ID)
		}
	}
	if got[2].Header.Get("traceparent") == "" {
		t.Errorf("headers not carried: %v", got[2].Header)
	}

	// While it runs, status shows the relay holding every shard, and the messages published.
	testenv.Await(t, "status to show 3 published and the relay holding every shard", func() (any, bool) {
		st := statusJSON(t, b)
		// Only what moves toward the goal: a relay's heartbeat changes on every renewal,
		// and would make a stuck relay look like progress.
		var relays []string
		for _, r := range st.Relays {
			relays = append(relays, fmt.Sprintf("%s live=%v shards=%d", r.ID, r.Live, r.Shards))
		}
		seen := fmt.Sprintf("published %d, pending %d, %d shards leased, relays %v", st.Published, st.Pending, st.ShardsLeased, relays)
		return seen, st.Published == 3 && st.Pending == 0 && len(st.Relays) == 1 && st.Relays[0].ID == "cli-e2e" &&
			st.Relays[0].Live && st.Relays[0].Shards == 64 && st.ShardsLeased == 64
	})

	cancel()
	if code := testenv.AwaitRecv(t, "the relay to stop after its context ended", done); code != 0 {
		t.Fatalf("relay exited %d after a graceful stop\nstderr:\n%s", code, stderr.String())
	}
	// Its leases were given back.
	if st := statusJSON(t, b); st.ShardsLeased != 0 {
		t.Errorf("%d shards still leased after the relay stopped", st.ShardsLeased)
	}

	// Every log line is JSON, says where it connected (redacted), and nothing failed.
	logs := stderr.String()
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("log line is not JSON: %q", line)
			continue
		}
		if rec["level"] == "ERROR" {
			t.Errorf("error logged: %s", line)
		}
	}
	for _, want := range []string{`"msg":"connecting to PostgreSQL"`, `"msg":"connecting to the broker"`, `"msg":"JetStream stream ready"`, `"msg":"relay exited cleanly"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %s:\n%s", want, logs)
		}
	}
	if stdout.String() != "" {
		t.Errorf("the relay wrote to stdout: %q", stdout.String())
	}
}

// TestRelayWarnsAboutUncapturedTopics: pending messages whose subject no stream captures
// are named in a warning at start.
func TestRelayWarnsAboutUncapturedTopics(t *testing.T) {
	t.Parallel()
	b := migrated(t)
	prefix := testnats.Unique() + "." // no stream captures it
	b.Write(t, outbox.Message{Topic: "orphans", Payload: []byte(`{}`)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"relay", "--broker", testnats.URL(), "--route", prefix + "{topic}"},
			func(k string) string { return b.env[k] }, &syncBuffer{}, &stderr)
	}()
	testenv.AwaitCond(t, "a warning about the uncaptured subject", func() bool {
		return strings.Contains(stderr.String(), "subject="+prefix+"orphans")
	})
	cancel()
	if code := testenv.AwaitRecv(t, "the relay to stop after its context ended", done); code != 0 {
		t.Fatalf("relay exited %d\n%s", code, stderr.String())
	}
}

// TestBinary builds the real binary and checks what only a process shows: SIGTERM stops
// the relay gracefully with status 0, exit statuses reach the shell, and -ldflags sets
// the version.
func TestBinary(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "outbox")
	build := exec.Command("go", "build", "-ldflags", "-X main.version=v9.9.9-test", "-o", bin, "../cmd/outbox")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	out, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.Contains(string(out), "outbox v9.9.9-test") {
		t.Fatalf("version: %v\n%s", err, out)
	}
	err = exec.Command(bin, "status", "--bogus").Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("unknown flag: want exit status 2, got %v", err)
	}

	b := migrated(t)
	js := testnats.JetStream(t, "")
	stream, prefix := natsStream(t, js)
	b.Write(t, outbox.Message{Topic: "orders", Payload: []byte(`{}`)})
	cmd := exec.Command(bin, "relay", "--broker", testnats.URL(), "--route", prefix+"{topic}", "--nats-create-stream", stream)
	cmd.Env = append(os.Environ(), "OUTBOX_DATABASE_URL="+b.env["OUTBOX_DATABASE_URL"], "OUTBOX_SCHEMA="+b.Schema, "OUTBOX_POLL_INTERVAL=50ms")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	streamMessages(t, js, stream, 1)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("relay after SIGTERM: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "relay exited cleanly") {
		t.Fatalf("no clean exit logged:\n%s", stderr.String())
	}
}

// TestRelayExportsTraces: with --otel the relay sends a publish span per message to the
// OTLP/HTTP endpoint of the standard environment, and the exporter's headers (a secret)
// are not logged.
func TestRelayExportsTraces(t *testing.T) {
	b := migrated(t)
	js := testnats.JetStream(t, "")
	stream, prefix := natsStream(t, js)
	got := make(chan string, 16)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- r.URL.Path + " " + r.Header.Get("Authorization") + " " + string(body)
	}))
	defer collector.Close()
	const token = "otlp-api-key-0123456789"
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer "+token)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")

	b.Write(t, outbox.Message{Topic: "traced", Key: "k", Payload: []byte(`{}`)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	env := with(b.env, "OUTBOX_POLL_INTERVAL", "50ms")
	go func() {
		done <- run(ctx, []string{"relay", "--broker", testnats.URL(), "--route", prefix + "{topic}",
			"--nats-create-stream", stream, "--otel", "--log-format", "json"},
			func(k string) string { return env[k] }, &stdout, &stderr)
	}()
	var req string
	if err := testenv.Progress(context.Background(), "spans exported to the collector", testenv.Stall(), func() (any, bool) {
		select {
		case req = <-got:
			return nil, true
		default:
			return "none yet", false
		}
	}); err != nil {
		t.Fatalf("%v; log:\n%s", err, stderr.String())
	}
	if !strings.HasPrefix(req, "/v1/traces Bearer "+token) || !strings.Contains(req, "publish traced") {
		t.Errorf("collector got %.200q", req)
	}
	cancel()
	if code := testenv.AwaitRecv(t, "the relay to stop after its context ended", done); code != 0 {
		t.Fatalf("relay exited %d:\n%s", code, stderr.String())
	}
	if strings.Contains(stderr.String(), token) || !strings.Contains(stderr.String(), "exporting traces over OTLP/HTTP") {
		t.Fatalf("log:\n%s", stderr.String())
	}
}
