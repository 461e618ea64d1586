package outboxamqp_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxamqp"
)

// parked is a parking queue filled by RabbitMQ: a topic exchange routes "orders.#" to a
// work queue and to another queue; the work queue dead-letters to the parking queue,
// and a consumer of it rejected n messages (payloads "0", "1", ...).
type parked struct {
	exchange, work, other, parking string
}

func parkSetup(t *testing.T, conn *amqp.Connection, n int) parked {
	t.Helper()
	p := parked{exchange: unique("dead-ex")}
	p.work, p.other, p.parking = p.exchange+".work", p.exchange+".other", p.exchange+".parking"
	declareExchange(t, conn, p.exchange, "topic", nil)
	declareQueue(t, conn, p.parking, nil)
	declareQueue(t, conn, p.work, amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": p.parking})
	declareQueue(t, conn, p.other, nil)
	bind(t, conn, p.work, "orders.#", p.exchange)
	bind(t, conn, p.other, "orders.#", p.exchange)

	pub := newPublisher(t, conn, outboxamqp.Config{Exchange: p.exchange})
	var batch []*outbox.Message
	for i := range n {
		batch = append(batch, &outbox.Message{ID: outbox.NewID(), Topic: "orders.placed", Key: "k", Payload: []byte(strconv.Itoa(i)), EventType: "placed"})
	}
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batch))
	ch := channel(t, conn)
	if _, err := ch.QueuePurge(p.other, false); err != nil {
		t.Fatal(err)
	}
	for range n {
		d, ok, err := ch.Get(p.work, false)
		if err != nil || !ok {
			t.Fatalf("get from %s: %v, %v", p.work, ok, err)
		}
		if err := d.Reject(false); err != nil {
			t.Fatal(err)
		}
	}
	awaitDepth(t, conn, p.parking, n)
	return p
}

func payloads(dls []outboxamqp.DeadLetter) string {
	var out []string
	for _, dl := range dls {
		out = append(out, string(dl.Payload))
	}
	return strings.Join(out, ",")
}

// TestListDead reads the parking queue twice: the same messages, in the same order, with
// the broker's reasons, and all of them still there.
func TestListDead(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	p := parkSetup(t, conn, 5)
	ctx := testenv.Context(t)

	first, err := outboxamqp.ListDead(ctx, conn, p.parking, 0)
	if err != nil {
		t.Fatal(err)
	}
	second, err := outboxamqp.ListDead(ctx, conn, p.parking, 0)
	if err != nil {
		t.Fatal(err)
	}
	if payloads(first) != "0,1,2,3,4" || payloads(second) != payloads(first) {
		t.Fatalf("listed %q then %q", payloads(first), payloads(second))
	}
	for _, dl := range first {
		if dl.Queue != p.work || dl.Reason != "rejected" || dl.Attempts != 1 || !dl.Known || dl.Exchange != p.exchange ||
			fmt.Sprint(dl.RoutingKeys) != "[orders.placed]" || len(dl.Deaths) != 1 || dl.DeadAt.IsZero() ||
			dl.ID == "" || dl.ID != dl.Headers[outbox.HeaderID] || dl.MessageID == "" || dl.EventType != "placed" {
			t.Errorf("dead letter %+v", dl)
		}
	}
	if n := depth(t, conn, p.parking); n != 5 {
		t.Fatalf("%d messages in the parking queue after listing, want 5", n)
	}
	if two, err := outboxamqp.ListDead(ctx, conn, p.parking, 2); err != nil || payloads(two) != "0,1" {
		t.Fatalf("ListDead with limit 2 = %q, %v", payloads(two), err)
	}
	if _, err := outboxamqp.ListDead(ctx, conn, p.parking+".nosuch", 0); err == nil {
		t.Fatal("ListDead of a missing queue succeeded")
	}
}

// TestReplayDead replays broker dead letters: a dry run changes nothing, a bounded run
// moves the oldest to their original exchange and routing key (every queue bound to it
// gets them), a run ToQueue moves the rest to the queue they died in only.
func TestReplayDead(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	p := parkSetup(t, conn, 5)
	ctx := testenv.Context(t)

	dry, err := outboxamqp.ReplayDead(ctx, conn, p.parking, outboxamqp.ReplayOptions{DryRun: true})
	if err != nil || payloads(dry) != "0,1,2,3,4" {
		t.Fatalf("dry run = %q, %v", payloads(dry), err)
	}
	if depth(t, conn, p.parking) != 5 || depth(t, conn, p.work) != 0 {
		t.Fatal("the dry run moved messages")
	}

	moved, err := outboxamqp.ReplayDead(ctx, conn, p.parking, outboxamqp.ReplayOptions{Limit: 2})
	if err != nil || payloads(moved) != "0,1" {
		t.Fatalf("replay of 2 = %q, %v", payloads(moved), err)
	}
	if a, b, c := depth(t, conn, p.parking), depth(t, conn, p.work), depth(t, conn, p.other); a != 3 || b != 2 || c != 2 {
		t.Fatalf("after replaying 2 to the exchange: parking %d, work %d, other %d; want 3, 2, 2", a, b, c)
	}
	back := readQueue(t, conn, p.work, 2)
	for i, d := range back {
		if string(d.Body) != strconv.Itoa(i) || d.MessageId != moved[i].MessageID || d.Headers[outbox.HeaderID] != moved[i].ID ||
			d.Headers["x-death"] != nil || d.Headers["x-first-death-queue"] != nil || d.DeliveryMode != amqp.Persistent || d.Exchange != p.exchange {
			t.Errorf("replayed message %d: %+v", i, d)
		}
		if outboxamqp.Attempt(d.Headers, p.work) != 1 {
			t.Errorf("replayed message %d does not start its attempts afresh", i)
		}
	}

	rest, err := outboxamqp.ReplayDead(ctx, conn, p.parking, outboxamqp.ReplayOptions{ToQueue: true})
	if err != nil || payloads(rest) != "2,3,4" {
		t.Fatalf("replay of the rest to the queue = %q, %v", payloads(rest), err)
	}
	if a, b, c := depth(t, conn, p.parking), depth(t, conn, p.work), depth(t, conn, p.other); a != 0 || b != 5 || c != 2 {
		t.Fatalf("after replaying 3 to the queue: parking %d, work %d, other %d; want 0, 5, 2", a, b, c)
	}
	if none, err := outboxamqp.ReplayDead(ctx, conn, p.parking, outboxamqp.ReplayOptions{}); err != nil || len(none) != 0 {
		t.Fatalf("replay of an empty queue = %v, %v", none, err)
	}
}

// TestReplayDeadNeverLoses: a message without a known origin, and one whose origin no
// longer routes, stay in the parking queue; the error names them; the others move.
func TestReplayDeadNeverLoses(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	p := parkSetup(t, conn, 1)
	ch := channel(t, conn)
	for _, m := range []amqp.Publishing{
		{MessageId: "no-origin", Body: []byte("x")},
		{MessageId: "unroutable", Body: []byte("y"), Headers: amqp.Table{
			outboxamqp.HeaderDeadQueue: p.work, outboxamqp.HeaderDeadExchange: p.exchange, outboxamqp.HeaderDeadRoutingKey: "nobody.binds.this",
		}},
	} {
		if err := ch.PublishWithContext(testenv.Context(t), "", p.parking, false, false, m); err != nil {
			t.Fatal(err)
		}
	}
	awaitDepth(t, conn, p.parking, 3)
	moved, err := outboxamqp.ReplayDead(testenv.Context(t), conn, p.parking, outboxamqp.ReplayOptions{})
	if payloads(moved) != "0" || err == nil || !strings.Contains(err.Error(), "2 left in the queue") ||
		!strings.Contains(err.Error(), "no-origin") || !strings.Contains(err.Error(), "unroutable") {
		t.Fatalf("ReplayDead = %q, %v", payloads(moved), err)
	}
	if n := depth(t, conn, p.parking); n != 2 {
		t.Fatalf("%d left in the parking queue, want 2", n)
	}
	if _, err := outboxamqp.ReplayDead(testenv.Context(t), conn, p.parking, outboxamqp.ReplayOptions{Limit: -1}); err == nil {
		t.Fatal("a negative limit was accepted")
	}
}

// TestConsumeDeadLetterReplay: a poison message goes to the dead-letter queue while the
// other flows; once the handler is fixed, replay brings it back once and it is handled.
func TestConsumeDeadLetterReplay(t *testing.T) {
	t.Parallel()
	conn := dialTest(t)
	cfg := consumerConfig(t, outboxamqp.Queue{})
	declareConsumer(t, conn, cfg)
	publishN(t, conn, cfg.Queue.Name, 2, 2) // payloads 0 and 1

	var mu sync.Mutex
	poisoned := true
	handled := map[string]int{}
	startConsumer(t, conn, cfg, func(ctx context.Context, d *outbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		if poisoned && string(d.Payload) == "1" {
			return outbox.Permanent(errors.New("poison"))
		}
		handled[string(d.Payload)]++
		return nil
	})
	dead := cfg.Queue.Name + ".dead"
	awaitDepth(t, conn, dead, 1)
	letters, err := outboxamqp.ListDead(testenv.Context(t), conn, dead, 0)
	if err != nil || len(letters) != 1 || string(letters[0].Payload) != "1" || letters[0].Reason != "permanent: poison" || letters[0].Queue != cfg.Queue.Name {
		t.Fatalf("dead letters %+v, %v", letters, err)
	}

	mu.Lock()
	poisoned = false // the fix is deployed
	mu.Unlock()
	if moved, err := outboxamqp.ReplayDead(testenv.Context(t), conn, dead, outboxamqp.ReplayOptions{}); err != nil || len(moved) != 1 {
		t.Fatalf("ReplayDead = %v, %v", moved, err)
	}
	testenv.Await(t, "the replayed message handled", func() (any, bool) {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprint("handled ", handled), handled["1"] == 1
	})
	awaitDepth(t, conn, cfg.Queue.Name, 0)
	mu.Lock()
	defer mu.Unlock()
	if handled["0"] != 1 || handled["1"] != 1 || depth(t, conn, dead) != 0 {
		t.Fatalf("handled %v, %d dead letters left; want each once and none", handled, depth(t, conn, dead))
	}
}
