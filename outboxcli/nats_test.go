package outboxcli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testnats"
	"github.com/outboxkit/outbox/outboxnats"
)

func TestNATSDeadListAndReplay(t *testing.T) {
	t.Parallel()
	js := testnats.JetStream(t, "")
	stream, prefix := testnats.Stream(t, js)
	dlq, dlqPrefix := testnats.Stream(t, js)
	pub, err := outboxnats.New(js, outboxnats.Config{Route: prefix + "{topic}"})
	if err != nil {
		t.Fatal(err)
	}
	var batch []*outbox.Message
	for i := range 3 {
		batch = append(batch, &outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "k" + strconv.Itoa(i), Payload: []byte(strconv.Itoa(i))})
	}
	if errs := pub.Publish(context.Background(), batch); errs != nil {
		t.Fatal(errs)
	}
	// A consumer that dead-letters everything, until the three are parked.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- outboxnats.Consume(ctx, js, outboxnats.ConsumerConfig{Stream: stream, Durable: "cli", DeadLetterSubject: dlqPrefix + "dead"},
			func(context.Context, *outbox.Delivery) error {
				return outbox.Permanent(errors.New("schema v2 expected"))
			})
	}()
	testenv.Await(t, "3 messages dead-lettered to "+dlq, func() (any, bool) {
		dead, err := outboxnats.ListDead(context.Background(), js, dlq, 0)
		return fmt.Sprintf("%d (%v)", len(dead), err), len(dead) == 3
	})
	cancel()
	if err := testenv.AwaitRecv(t, "the consumer to stop after its context ended", done); err != nil {
		t.Fatal(err)
	}

	env := map[string]string{"OUTBOX_BROKER": testnats.URL()}
	r := cli(t, env, "nats", "dead", "list", "--stream", dlq)
	if r.code != 0 || strings.Count(r.stdout, "permanent: schema v2 expected") != 3 || !strings.Contains(r.stdout, prefix+"orders") {
		t.Fatalf("list: %s", r)
	}
	if r := cli(t, env, "nats", "dead", "replay", "--stream", dlq, "--limit", "2"); r.code != 2 || !strings.Contains(r.stdout, "would replay 2") {
		t.Fatalf("replay without --yes: %s", r)
	}
	if r := cli(t, env, "nats", "dead", "replay", "--stream", dlq, "--limit", "2", "--yes"); r.code != 0 || !strings.Contains(r.stdout, "replayed 2 of 2") {
		t.Fatalf("replay: %s", r)
	}
	if dead, err := outboxnats.ListDead(context.Background(), js, dlq, 0); err != nil || len(dead) != 1 {
		t.Fatalf("after replaying 2 of 3: %d left, %v", len(dead), err)
	}
	if r := cli(t, env, "nats", "dead", "list"); r.code != 2 || !strings.Contains(r.stderr, "--stream") {
		t.Fatalf("list without --stream: %s", r)
	}
}
