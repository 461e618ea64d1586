package outboxcli

import (
	"context"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

// TestRelayKafka runs the relay against an in-process Kafka cluster (kfake) that requires
// SASL: the password comes from a file and never appears in the output, the message
// arrives with its key and dedup header, and a pending topic that does not exist is
// reported before the relay starts.
func TestRelayKafka(t *testing.T) {
	t.Parallel()
	const user, password = "outbox", "kafka-s3cret-pw"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(),
		kfake.Superuser("PLAIN", user, password), kfake.SeedTopics(2, "events.orders"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	addr := cluster.ListenAddrs()[0]

	b := migrated(t)
	m := outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "o-1", Payload: []byte(`{"n":1}`), DedupKey: "order-1-placed"}
	b.Write(t, m, outbox.Message{ID: outbox.NewID(), Topic: "nowhere", Key: "n-1", Payload: []byte(`{}`)})
	pwFile := writeFile(t, "password", password+"\n")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	env := with(b.env, "OUTBOX_POLL_INTERVAL", "50ms")
	go func() {
		done <- run(ctx, []string{"relay", "--broker", "kafka://" + addr, "--route", "events.{topic}",
			"--kafka-sasl-mechanism", "plain", "--kafka-sasl-user", user, "--kafka-sasl-password-file", pwFile,
			"--kafka-compression", "zstd", "--log-format", "json"},
			func(k string) string { return env[k] }, &stdout, &stderr)
	}()

	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.SASL(plain.Auth{User: user, Pass: password}.AsMechanism()),
		kgo.ConsumeTopics("events.orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// One record awaited: the poll's context bounds a hang, not how long the relay takes.
	pctx := testenv.Context(t)
	var got *kgo.Record
	for got == nil && pctx.Err() == nil {
		cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) { got = r })
	}
	if got == nil {
		t.Fatalf("no record in events.orders within %v\n%s", testenv.Stall(), stderr.String())
	}
	headers := map[string]string{}
	for _, h := range got.Headers {
		headers[h.Key] = string(h.Value)
	}
	if string(got.Key) != "o-1" || string(got.Value) != `{"n":1}` || headers[outbox.HeaderDedupKey] != "order-1-placed" {
		t.Errorf("record: key %q, value %s, headers %v", got.Key, got.Value, headers)
	}
	cancel()
	if code := testenv.AwaitRecv(t, "the relay to stop after its context ended", done); code != 0 {
		t.Fatalf("relay exited %d\n%s", code, stderr.String())
	}
	logs := stderr.String()
	if !strings.Contains(logs, "until the Kafka topic exists") || !strings.Contains(logs, `"kafka_topic":"events.nowhere"`) {
		t.Errorf("log does not warn about the missing topic:\n%s", logs)
	}
	if strings.Contains(logs, password) || strings.Contains(stdout.String(), password) {
		t.Errorf("the password appears in the output:\n%s", logs)
	}
}

// TestRelayKafkaBadFlags checks that mistakes in the Kafka flags are usage errors (exit
// 2), found before the relay publishes anything.
func TestRelayKafkaBadFlags(t *testing.T) {
	t.Parallel()
	b := migrated(t)
	pw := writeFile(t, "pw", "secret\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--broker", "kafka://user:pw@127.0.0.1:1"}, "credentials do not go in the URL"},
		{[]string{"--broker", "kafka://127.0.0.1:1/path"}, "--broker"},
		{[]string{"--kafka-sasl-mechanism", "plain"}, "--kafka-sasl-mechanism: give --kafka-sasl-user"},
		{[]string{"--kafka-sasl-user", "u", "--kafka-sasl-password", "p"}, "give --kafka-sasl-mechanism too"},
		{[]string{"--kafka-sasl-mechanism", "gssapi", "--kafka-sasl-user", "u", "--kafka-sasl-password", "p"}, "not one of plain"},
		{[]string{"--kafka-sasl-password", "p", "--kafka-sasl-password-file", pw}, "give one"},
		{[]string{"--kafka-sasl-password-file", "/nonexistent"}, "--kafka-sasl-password-file"},
		{[]string{"--kafka-compression", "brotli"}, "--kafka-compression"},
		{[]string{"--kafka-max-message-bytes", "100"}, "--kafka-max-message-bytes"},
		{[]string{"--route", "events/{topic}"}, "--route"},
	} {
		args := append([]string{"relay", "--broker", "kafka://127.0.0.1:1"}, tc.args...)
		r := cli(t, b.env, args...)
		if r.code != 2 || !strings.Contains(errorLine(r.stderr), tc.want) {
			t.Errorf("relay %v: want exit 2 and %q, got %s", tc.args, tc.want, r)
		}
	}
	// Good flags and no broker: a connection failure (exit 1) naming the address.
	if r := cli(t, b.env, "relay", "--broker", "kafka://127.0.0.1:1"); r.code != 1 || !strings.Contains(r.stderr, "127.0.0.1:1") {
		t.Errorf("unreachable broker: want exit 1 naming it, got %s", r)
	}
}
