package outboxcli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/brokers"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testrabbit"
)

// amqpURL is the RabbitMQ of the tests: OUTBOX_TEST_AMQP_URL, or the local server.
func amqpURL() string { return testrabbit.URL() }

// amqpConn connects to the test server, until the test ends. A missing server fails the
// test.
func amqpConn(t *testing.T) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(amqpURL())
	if err != nil {
		t.Fatalf("RabbitMQ is needed (set OUTBOX_TEST_AMQP_URL, or start it: rabbitmq-server -detached): %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// amqpChannel opens a channel on a connection of its own.
func amqpChannel(t *testing.T) *amqp.Channel {
	t.Helper()
	ch, err := amqpConn(t).Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// amqpTopology writes a topology file with one topic exchange and one queue bound to it
// by "orders.#", named after a fresh prefix, and deletes both when the test ends.
func amqpTopology(t *testing.T, ttl string) (path, exchange, queue string) {
	t.Helper()
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	prefix := "cli-" + hex.EncodeToString(b)
	exchange, queue = prefix+".events", prefix+".orders"
	path = writeFile(t, "topology.yaml", `
exchanges:
  - {name: `+exchange+`, type: topic}
queues:
  - {name: `+queue+`, message-ttl: `+ttl+`}
bindings:
  - {exchange: `+exchange+`, queue: `+queue+`, routing-key: "orders.#"}
`)
	t.Cleanup(func() {
		ch := amqpChannel(t)
		_, _ = ch.QueueDelete(queue, false, false, false)
		_ = ch.ExchangeDelete(exchange, false, false)
	})
	return path, exchange, queue
}

func TestRabbitMQDeclare(t *testing.T) {
	t.Parallel()
	path, exchange, queue := amqpTopology(t, "60s")
	env := map[string]string{"OUTBOX_BROKER": amqpURL()}
	for range 2 { // idempotent
		r := must(t, 0, env, "rabbitmq", "declare", "-f", path)
		if !strings.Contains(r.stdout, "declared 1 exchanges, 1 queues and 1 bindings") || strings.Contains(r.stdout, "guest:guest") {
			t.Errorf("output: %s", r)
		}
	}
	if _, err := amqpChannel(t).QueueDeclarePassive(queue, true, false, false, false, nil); err != nil {
		t.Errorf("queue %s was not declared: %v", queue, err)
	}
	if err := amqpChannel(t).ExchangeDeclarePassive(exchange, "topic", true, false, false, false, nil); err != nil {
		t.Errorf("exchange %s was not declared: %v", exchange, err)
	}

	// The same queue with another TTL: a failure naming the queue.
	conflict := writeFile(t, "conflict.yaml", "queues: [{name: "+queue+", message-ttl: 30s}]\n")
	r := must(t, 1, env, "rabbitmq", "declare", "--file", conflict)
	if line := errorLine(r.stderr); !strings.Contains(line, `queue "`+queue+`"`) || !strings.Contains(line, "other settings") {
		t.Errorf("conflict: %s", r)
	}

	// Mistakes in the file or the flags are usage errors, found before connecting.
	unreachable := map[string]string{"OUTBOX_BROKER": "amqp://127.0.0.1:1/"}
	for name, args := range map[string][]string{
		"unknown key":   {"-f", writeFile(t, "typo.yaml", "queues: [{name: q, mesage-ttl: 1s}]\n")},
		"bad duration":  {"-f", writeFile(t, "ttl.yaml", "queues: [{name: q, message-ttl: 10}]\n")},
		"invalid":       {"-f", writeFile(t, "quorum.yaml", "queues: [{name: q, type: quorum, max-priority: 5}]\n")},
		"empty":         {"-f", writeFile(t, "empty.yaml", "")},
		"no file":       {},
		"missing file":  {"-f", "/nonexistent/topology.yaml"},
		"tls with amqp": {"-f", path, "--broker-tls-server-name", "rabbit"},
		"no user":       {"-f", path, "--rabbitmq-password", "secret"},
	} {
		r := cli(t, unreachable, append([]string{"rabbitmq", "declare"}, args...)...)
		if r.code != 2 {
			t.Errorf("%s: want exit 2, got %s", name, r)
		}
	}
}

// TestRabbitMQDeclareExample checks that the example topology file reads and validates.
func TestRabbitMQDeclareExample(t *testing.T) {
	t.Parallel()
	top, err := brokers.LoadTopology("file", "../deploy/rabbitmq/topology.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(top.Exchanges) != 3 || len(top.Queues) != 5 || len(top.Bindings) != 5 {
		t.Errorf("example topology: %d exchanges, %d queues, %d bindings", len(top.Exchanges), len(top.Queues), len(top.Bindings))
	}
}

// TestRelayRabbitMQ runs the relay against RabbitMQ: it declares the topology given with
// --rabbitmq-declare, takes the password from a file (never printed), and publishes
// through the exchange.
func TestRelayRabbitMQ(t *testing.T) {
	t.Parallel()
	b := migrated(t)
	path, exchange, queue := amqpTopology(t, "10m")
	u, err := url.Parse(amqpURL())
	if err != nil {
		t.Fatal(err)
	}
	password, _ := u.User.Password()
	u.User = url.User(u.User.Username())
	pwFile := writeFile(t, "password", password+"\n")

	m := outbox.Message{ID: outbox.NewID(), Topic: "orders.placed", Key: "o-1", Payload: []byte(`{"n":1}`), DedupKey: "order-1-placed"}
	b.Write(t, m)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	env := with(b.env, "OUTBOX_POLL_INTERVAL", "50ms")
	go func() {
		done <- run(ctx, []string{"relay", "--broker", u.String(), "--rabbitmq-password-file", pwFile,
			"--rabbitmq-exchange", exchange, "--rabbitmq-declare", path, "--log-format", "json"},
			func(k string) string { return env[k] }, &stdout, &stderr)
	}()

	conn := amqpConn(t)
	var d amqp.Delivery
	if err := testenv.Progress(context.Background(), "a message in "+queue, testenv.Stall(), func() (any, bool) {
		// A fresh channel each time: until the relay declared the queue, Get fails with
		// a 404, which closes the channel.
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		got, ok, err := ch.Get(queue, true)
		_ = ch.Close()
		if err == nil && ok {
			d = got
			return nil, true
		}
		return fmt.Sprintf("ok=%t err=%v", ok, err), false
	}); err != nil {
		t.Fatalf("%v; relay log:\n%s", err, stderr.String())
	}
	if string(d.Body) != `{"n":1}` || d.MessageId != "order-1-placed" || d.RoutingKey != "orders.placed" || d.DeliveryMode != amqp.Persistent {
		t.Errorf("delivery: body %s, message_id %q, routing key %q, delivery mode %d", d.Body, d.MessageId, d.RoutingKey, d.DeliveryMode)
	}
	cancel()
	if code := testenv.AwaitRecv(t, "the relay to stop after its context ended", done); code != 0 {
		t.Fatalf("relay exited %d\n%s", code, stderr.String())
	}
	logs := stderr.String()
	if !strings.Contains(logs, "RabbitMQ topology declared") {
		t.Errorf("log lacks the declaration:\n%s", logs)
	}
	if len(password) >= 4 && strings.Contains(logs, password) {
		t.Errorf("the password appears in the log:\n%s", logs)
	}
}
