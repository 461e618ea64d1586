package outboxcli

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testnats"
	"github.com/outboxkit/outbox/outboxdriver"
)

// TestRelayDestinations: one relay, two destinations (NATS, --broker's, and RabbitMQ,
// named audit in the config file): each message reaches the destination its routing rule
// names (under the rule's own route when it has one), a message no rule matches goes to
// the default, and with the default set to none
// such a message is dead-lettered with the reason. RabbitMQ's password, given in the
// destination's URL, never appears in the log.
func TestRelayDestinations(t *testing.T) {
	t.Parallel()
	b := migrated(t)
	js := testnats.JetStream(t, "")
	stream, prefix := natsStream(t, js)
	topology, exchange, queue := amqpTopology(t, "10m")
	u, err := url.Parse(amqpURL())
	if err != nil {
		t.Fatal(err)
	}
	password, _ := u.User.Password()

	config := writeFile(t, "outbox.yaml", fmt.Sprintf(`
broker: %s
route: "%s{topic}"
nats-create-stream: %s
destinations:
  audit:
    broker: %s
    rabbitmq-exchange: %s
    rabbitmq-declare: %s
routing:
  - topic: "orders.*"
    event-type: "order.refunded"
    destination: audit
    route: "orders.refunds.{event_type}"
  - headers: {audit: "yes"}
    destination: audit
`, testnats.URL(), prefix, stream, u.String(), exchange, topology))

	msgs := []outbox.Message{
		{Topic: "orders.placed", Key: "o-1", EventType: "order.placed", Payload: []byte(`{"n":1}`)},
		{Topic: "orders.placed", Key: "o-1", EventType: "order.refunded", Payload: []byte(`{"n":2}`)},
		{Topic: "orders.x", Key: "o-2", Payload: []byte(`{"n":3}`), Headers: map[string]string{"audit": "yes"}},
		{Topic: "billing", Key: "b-1", Payload: []byte(`{"n":4}`)},
	}
	b.Write(t, msgs...)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	env := with(b.env, "OUTBOX_POLL_INTERVAL", "50ms")
	go func() {
		done <- run(ctx, []string{"relay", "--config", config, "--log-format", "json", "--metrics-addr", "127.0.0.1:0", "--relay-id", "routed"},
			func(k string) string { return env[k] }, &stdout, &stderr)
	}()

	got := streamMessages(t, js, stream, 2)
	var subjects []string
	for _, m := range got {
		subjects = append(subjects, m.Subject+" "+string(m.Data))
	}
	if want := []string{prefix + `orders.placed {"n":1}`, prefix + `billing {"n":4}`}; strings.Join(subjects, "|") != strings.Join(want, "|") {
		t.Errorf("NATS got %q, want %q", subjects, want)
	}
	conn := amqpConn(t)
	var bodies []string
	if err := testenv.Progress(context.Background(), "two messages in "+queue, testenv.Stall(), func() (any, bool) {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		d, ok, err := ch.Get(queue, true)
		if err == nil && ok {
			bodies = append(bodies, d.RoutingKey+" "+string(d.Body))
		}
		return fmt.Sprintf("%q, err=%v", bodies, err), len(bodies) == 2
	}); err != nil {
		t.Fatalf("%v; relay log:\n%s", err, stderr.String())
	}
	slices.Sort(bodies) // two keys: no order between them
	if want := []string{`orders.refunds.order.refunded {"n":2}`, `orders.x {"n":3}`}; strings.Join(bodies, "|") != strings.Join(want, "|") {
		t.Errorf("RabbitMQ got %q, want %q", bodies, want)
	}
	// Each destination's counters and state: in /metrics, /readyz (which pings both) and
	// outbox status (from the relay's heartbeat).
	addr := regexp.MustCompile(`"msg":"serving metrics and health checks","addr":"([^"]+)"`).FindStringSubmatch(stderr.String())
	if addr == nil {
		t.Fatalf("no metrics address in the log:\n%s", stderr.String())
	}
	testenv.Await(t, "both destinations' counters in /metrics", func() (any, bool) {
		_, body := opsGet(t, "http://"+addr[1]+"/metrics")
		lines := grepLines(body, "outbox_destination_")
		return lines, strings.Contains(body, `outbox_destination_published_total{destination="audit",relay="routed"} 1`) &&
			strings.Contains(body, `outbox_destination_published_total{destination="audit@rule1",relay="routed"} 1`) &&
			strings.Contains(body, `outbox_destination_published_total{destination="default",relay="routed"} 2`) &&
			strings.Contains(body, `outbox_destination_up{destination="audit",relay="routed"} 1`)
	})
	testenv.Await(t, "/readyz ready", func() (any, bool) {
		code, body := opsGet(t, "http://"+addr[1]+"/readyz")
		return fmt.Sprintf("%d %q", code, body), code == 200
	})
	if r := must(t, 0, b.env, "status"); !strings.Contains(r.stdout, "default up, audit up, audit@rule1 up") {
		t.Errorf("outbox status does not show the destinations:\n%s", r.stdout)
	}
	cancel()
	if code := testenv.AwaitRecv(t, "the relay to stop after its context ended", done); code != 0 {
		t.Fatalf("relay exited %d\n%s", code, stderr.String())
	}
	logs := stderr.String()
	if strings.Contains(logs, ":"+password+"@") {
		t.Errorf("the password appears in the log:\n%s", logs)
	}
	if !strings.Contains(logs, `"msg":"publishing by the routing rules"`) {
		t.Errorf("the log does not say the relay routes:\n%s", logs)
	}

	// With no default, a message no rule matches is dead-lettered, and says why.
	b.Write(t, outbox.Message{Topic: "billing", Key: "b-2", Payload: []byte(`{"n":5}`)})
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	var stderr2 syncBuffer
	go func() {
		done <- run(ctx, []string{"relay", "--config", config, "--default-destination", "none"},
			func(k string) string { return env[k] }, &stdout, &stderr2)
	}()
	testenv.Await(t, "the unroutable message dead-lettered", func() (any, bool) {
		st := statusJSON(t, b)
		return fmt.Sprintf("dead %d, pending %d", st.Dead, st.Pending), st.Dead == 1 && st.Pending == 0
	})
	cancel()
	if code := testenv.AwaitRecv(t, "the relay to stop after its context ended", done); code != 0 {
		t.Fatalf("relay exited %d\n%s", code, stderr2.String())
	}
	if r := must(t, 0, b.env, "dead", "list"); !strings.Contains(r.stdout, "no routing rule matches") {
		t.Errorf("dead list does not give the reason:\n%s", r)
	}
}

// TestRelayDestinationsConfigErrors: mistakes in destinations and routing fail before
// anything connects, with status 2, naming the file, the line and what is wrong.
func TestRelayDestinationsConfigErrors(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OUTBOX_DATABASE_URL": "postgres://nobody@127.0.0.1:1/x"}
	for _, tc := range []struct{ config, want string }{
		{"destinations:\n  audit:\n    route: x\n", "outbox.yaml:2: destination \"audit\": broker is required"},
		{"destinations:\n  default:\n    broker: nats://x\n", "the name is reserved"},
		{"destinations:\n  audit:\n    broker: nats://x\n    nats-nope: 1\n", "destination \"audit\": NATS JetStream has no setting \"nats-nope\""},
		{"destinations:\n  audit:\n    broker: amqp://x\n    nats-create-stream: S\n", "RabbitMQ has no setting \"nats-create-stream\""},
		{"destinations:\n  audit:\n    broker: nats://x\n    route: \"{nope}\"\n", "unknown placeholder {nope}"},
		{"destinations:\n  audit:\n    broker: nats://x\nrouting:\n  - topic: a\n    destination: audti\n", "outbox.yaml:5: routing rule 1: destination: unknown destination \"audti\""},
		{"destinations:\n  audit:\n    broker: nats://x\nrouting:\n  - topic: \"[a\"\n    destination: audit\n", "routing rule 1: topic: \"[a\" is not a valid glob"},
		{"routing:\n  - topic: a\n", "outbox.yaml:2: a rule needs a destination"},
		{"destinations:\n  audit:\n    broker: nats://x\nrouting:\n  - topic: a\n    destination: audit\n    route: \"{nope}\"\n", "outbox.yaml:5: routing rule 1: route: \"{nope}\": unknown placeholder {nope}"},
		{"routing:\n  - queue: a\n    destination: default\n", "a rule has no key \"queue\""},
		{"destinations:\n  audit:\n    broker: nats://x\ndefault-destination: nope\n", "--default-destination: unknown destination \"nope\""},
		{"default-destination: none\n", "--default-destination: only used with a config file's destinations"},
	} {
		path := writeFile(t, "outbox.yaml", tc.config)
		r := must(t, 2, env, "relay", "--config", path)
		if !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%q:\nstderr %s\nwant %q", tc.config, r.stderr, tc.want)
		}
	}
	for _, config := range []string{
		"outboxes:\n  - schema: a\ndestinations:\n  audit:\n    broker: nats://x\n",
		"outboxes:\n  - schema: a\ndefault-destination: none\n",
	} {
		path := writeFile(t, "outbox.yaml", config)
		if r := must(t, 2, env, "relay", "--config", path); !strings.Contains(r.stderr, "destinations and routing serve a relay of one outbox") {
			t.Errorf("a fleet with %q: %s", config, r.stderr)
		}
	}
}

// TestRelayRoutingFingerprint, as a new user would meet it: a second relay started on
// the outbox with another broker takes no shard from the running one, and says why in
// its log, /readyz and outbox status; once the first stops, it takes every shard.
func TestRelayRoutingFingerprint(t *testing.T) {
	t.Parallel()
	b := migrated(t)
	js := testnats.JetStream(t, "")
	stream, prefix := natsStream(t, js)
	env := with(b.env, "OUTBOX_LEASE_TTL", "3s")
	start := func(ctx context.Context, stderr *syncBuffer, args ...string) chan int {
		done := make(chan int, 1)
		go func() {
			var stdout syncBuffer
			done <- run(ctx, append([]string{"relay", "--log-format", "json"}, args...), func(k string) string { return env[k] }, &stdout, stderr)
		}()
		return done
	}
	relayShards := func(st outboxdriver.Status, id string) (int, string, bool) {
		for _, r := range st.Relays {
			if r.ID == id && r.Live {
				return r.Shards, r.Fingerprint, true
			}
		}
		return 0, "", false
	}

	ctxA, stopA := context.WithCancel(context.Background())
	defer stopA()
	var logA syncBuffer
	doneA := start(ctxA, &logA, "--relay-id", "nats-relay", "--broker", testnats.URL(), "--route", prefix+"{topic}", "--nats-create-stream", stream)
	testenv.Await(t, "the first relay to hold every shard", func() (any, bool) {
		n, _, _ := relayShards(statusJSON(t, b), "nats-relay")
		return fmt.Sprintf("%d shards", n), n == 64
	})

	ctxB, stopB := context.WithCancel(context.Background())
	defer stopB()
	var logB syncBuffer
	doneB := start(ctxB, &logB, "--relay-id", "redis-relay", "--broker", "redis://"+redisAddr(), "--metrics-addr", "127.0.0.1:0")
	var fpA, fpB string
	testenv.Await(t, "the second relay to state its fingerprint and wait", func() (any, bool) {
		st := statusJSON(t, b)
		nA, a, _ := relayShards(st, "nats-relay")
		nB, bFP, live := relayShards(st, "redis-relay")
		fpA, fpB = a, bFP
		return fmt.Sprintf("nats-relay %d shards (%s), redis-relay live %v %d shards (%s)", nA, a, live, nB, bFP),
			live && nA == 64 && nB == 0 && a != "" && bFP != "" && a != bFP
	})
	testenv.AwaitCond(t, "the second relay's log to say why it waits", func() bool {
		return strings.Contains(logB.String(), "taking no shards") && strings.Contains(logB.String(), fpA)
	})
	addr := regexp.MustCompile(`"msg":"serving metrics and health checks","addr":"([^"]+)"`).FindStringSubmatch(logB.String())
	if addr == nil {
		t.Fatalf("no metrics address in the log:\n%s", logB.String())
	}
	if code, body := opsGet(t, "http://"+addr[1]+"/readyz"); code != 200 || !strings.Contains(body, "standby: relays nats-relay hold the shards under other destinations and routing") {
		t.Errorf("/readyz of the waiting relay: %d %q", code, body)
	}
	if _, body := opsGet(t, "http://"+addr[1]+"/metrics"); !strings.Contains(body, "outbox_relay_routings 2") {
		t.Errorf("/metrics lacks outbox_relay_routings 2:\n%s", grepLines(body, "outbox_relay"))
	}
	if r := must(t, 0, b.env, "status"); !strings.Contains(r.stdout, "relays redis-relay take no shards") || !strings.Contains(r.stdout, fpB) {
		t.Errorf("outbox status does not warn of the waiting relay:\n%s", r)
	}

	stopA()
	if code := testenv.AwaitRecv(t, "the first relay to stop", doneA); code != 0 {
		t.Fatalf("first relay exited %d\n%s", code, logA.String())
	}
	testenv.Await(t, "the second relay to take every shard", func() (any, bool) {
		n, _, _ := relayShards(statusJSON(t, b), "redis-relay")
		return fmt.Sprintf("%d shards", n), n == 64
	})
	stopB()
	if code := testenv.AwaitRecv(t, "the second relay to stop", doneB); code != 0 {
		t.Fatalf("second relay exited %d\n%s", code, logB.String())
	}
}
