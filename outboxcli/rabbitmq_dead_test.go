package outboxcli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

// amqpParking makes a parking queue that RabbitMQ filled: a topic exchange routes
// "orders.#" to a work queue, which dead-letters to the parking queue; n messages were
// published with the key "orders.placed" and rejected by a consumer. It deletes all of
// it when the test ends.
func amqpParking(t *testing.T, n int) (exchange, work, parking string) {
	t.Helper()
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	exchange = "cli-dead-" + hex.EncodeToString(b)
	work, parking = exchange+".work", exchange+".parking"
	ch := amqpChannel(t)
	t.Cleanup(func() {
		ch := amqpChannel(t)
		_, _ = ch.QueueDelete(work, false, false, false)
		_, _ = ch.QueueDelete(parking, false, false, false)
		_ = ch.ExchangeDelete(exchange, false, false)
	})
	must0 := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must0(ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil))
	_, err := ch.QueueDeclare(parking, true, false, false, false, nil)
	must0(err)
	_, err = ch.QueueDeclare(work, true, false, false, false, amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": parking})
	must0(err)
	must0(ch.QueueBind(work, "orders.#", exchange, false, nil))
	for i := range n {
		must0(ch.PublishWithContext(context.Background(), exchange, "orders.placed", false, false, amqp.Publishing{
			MessageId: fmt.Sprintf("m-%d", i), Type: "placed", Body: []byte(fmt.Sprint(i)),
			Headers: amqp.Table{"Outbox-Id": fmt.Sprintf("id-%d", i)},
		}))
	}
	rejected := 0
	testenv.Await(t, fmt.Sprintf("%d messages rejected from %s", n, work), func() (any, bool) {
		d, ok, err := ch.Get(work, false)
		must0(err)
		if ok {
			must0(d.Reject(false))
			rejected++
		}
		return rejected, rejected == n
	})
	waitDepth(t, parking, n)
	return exchange, work, parking
}

// amqpDepth counts the messages ready in queue, on a channel of its own.
func amqpDepth(t *testing.T, queue string) int {
	t.Helper()
	conn, err := amqp.Dial(amqpURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

func waitDepth(t *testing.T, queue string, n int) {
	t.Helper()
	testenv.Await(t, fmt.Sprintf("queue %s to hold %d messages", queue, n), func() (any, bool) {
		d := amqpDepth(t, queue)
		return d, d == n
	})
}

func TestRabbitMQDeadList(t *testing.T) {
	t.Parallel()
	exchange, work, parking := amqpParking(t, 3)
	env := map[string]string{"OUTBOX_BROKER": amqpURL()}

	r := must(t, 0, env, "rabbitmq", "dead", "list", "--queue", parking)
	for _, want := range []string{"FROM QUEUE", work, "rejected", exchange, "orders.placed", "id-0", "id-1", "id-2"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("list lacks %q: %s", want, r)
		}
	}
	if strings.Index(r.stdout, "id-0") > strings.Index(r.stdout, "id-2") || strings.Contains(r.stdout+r.stderr, "guest:guest") {
		t.Errorf("list: %s", r)
	}
	if amqpDepth(t, parking) != 3 {
		t.Fatal("list removed messages")
	}

	r = must(t, 0, env, "rabbitmq", "dead", "list", "--queue", parking, "--limit", "2")
	if !strings.Contains(r.stdout, "showing the oldest 2") || strings.Contains(r.stdout, "id-2") {
		t.Errorf("list --limit 2: %s", r)
	}

	r = must(t, 0, env, "rabbitmq", "dead", "list", "--queue", parking, "--json")
	var out []struct {
		ID          string   `json:"id"`
		Queue       string   `json:"queue"`
		Reason      string   `json:"reason"`
		Exchange    string   `json:"exchange"`
		RoutingKeys []string `json:"routing_keys"`
		Deaths      []struct {
			Count int64 `json:"count"`
		} `json:"deaths"`
		Payload []byte `json:"payload"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("--json: %v\n%s", err, r)
	}
	if len(out) != 3 || out[0].ID != "id-0" || out[0].Queue != work || out[0].Reason != "rejected" || out[0].Exchange != exchange ||
		fmt.Sprint(out[0].RoutingKeys) != "[orders.placed]" || len(out[0].Deaths) != 1 || out[0].Deaths[0].Count != 1 || string(out[0].Payload) != "0" {
		t.Errorf("--json: %+v", out)
	}

	empty := exchange + ".work" // drained by the setup
	if r := must(t, 0, env, "rabbitmq", "dead", "list", "--queue", empty); !strings.Contains(r.stdout, "holds no dead letters") {
		t.Errorf("list of an empty queue: %s", r)
	}
	if r := must(t, 1, env, "rabbitmq", "dead", "list", "--queue", exchange+".nosuch"); !strings.Contains(errorLine(r.stderr), "NOT_FOUND") {
		t.Errorf("list of a missing queue: %s", r)
	}

	// Mistakes in the flags are usage errors, found before connecting.
	unreachable := map[string]string{"OUTBOX_BROKER": "amqp://127.0.0.1:1/"}
	for name, args := range map[string][]string{
		"no queue":       {"list"},
		"negative limit": {"list", "--queue", "q", "--limit", "-1"},
		"replay limit":   {"replay", "--queue", "q", "--limit", "-1"},
		"replay queue":   {"replay", "--yes"},
		"tls with amqp":  {"list", "--queue", "q", "--broker-tls-server-name", "rabbit"},
		"argument":       {"list", "--queue", "q", "extra"},
	} {
		if r := cli(t, unreachable, append([]string{"rabbitmq", "dead"}, args...)...); r.code != 2 {
			t.Errorf("%s: want exit 2, got %s", name, r)
		}
	}
}

func TestRabbitMQDeadReplay(t *testing.T) {
	t.Parallel()
	_, work, parking := amqpParking(t, 3)
	env := map[string]string{"OUTBOX_BROKER": amqpURL()}

	// Without --yes: says what it would do, exits 2, changes nothing.
	r := must(t, 2, env, "rabbitmq", "dead", "replay", "--queue", parking)
	if !strings.Contains(r.stdout, "would replay all 3 dead letters of queue "+parking) || !strings.Contains(r.stderr, "--yes") {
		t.Fatalf("replay without --yes: %s", r)
	}
	// --dry-run lists them and exits 0, changing nothing.
	r = must(t, 0, env, "rabbitmq", "dead", "replay", "--queue", parking, "--dry-run")
	if !strings.Contains(r.stdout, "would replay 3 dead letters") || !strings.Contains(r.stdout, "id-0") || !strings.Contains(r.stdout, "id-2") {
		t.Fatalf("replay --dry-run: %s", r)
	}
	if amqpDepth(t, parking) != 3 || amqpDepth(t, work) != 0 {
		t.Fatal("replay changed queues without --yes")
	}

	r = must(t, 0, env, "rabbitmq", "dead", "replay", "--queue", parking, "--limit", "1", "--yes")
	if !strings.Contains(r.stdout, "replayed 1 dead letter of queue "+parking+" to the exchanges and routing keys") {
		t.Fatalf("replay --limit 1 --yes: %s", r)
	}
	if amqpDepth(t, parking) != 2 || amqpDepth(t, work) != 1 {
		t.Fatal("replay --limit 1 did not move exactly the oldest")
	}
	r = must(t, 0, env, "rabbitmq", "dead", "replay", "--queue", parking, "--to-queue", "--yes")
	if !strings.Contains(r.stdout, "replayed 2 dead letters of queue "+parking+" to the queues they were dead-lettered from") {
		t.Fatalf("replay --to-queue --yes: %s", r)
	}
	if amqpDepth(t, parking) != 0 || amqpDepth(t, work) != 3 {
		t.Fatal("replay --to-queue did not move the rest")
	}
	if r := must(t, 0, env, "rabbitmq", "dead", "replay", "--queue", parking, "--yes"); !strings.Contains(r.stdout, "nothing to replay") {
		t.Fatalf("replay of nothing: %s", r)
	}
}
