package outboxcli

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testnats"
)

// TestReplay, as an operator would use it: messages published by a relay in two rounds;
// outbox replay of the second round's time range and one topic to another NATS stream
// publishes exactly those, each key's in order, with their IDs and the Outbox-Replay
// header; --dry-run counts them first; outbox status shows the replay; running it again
// under its name says it is done.
func TestReplay(t *testing.T) {
	t.Parallel()
	b := migrated(t)
	js := testnats.JetStream(t, "")
	stream, prefix := natsStream(t, js)
	env := with(b.env, "OUTBOX_POLL_INTERVAL", "50ms")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"relay", "--broker", testnats.URL(), "--route", prefix + "{topic}", "--nats-create-stream", stream},
			func(k string) string { return env[k] }, &stdout, &stderr)
	}()
	round := func(n int) {
		t.Helper()
		var msgs []outbox.Message
		for i := range 5 {
			for _, topic := range []string{"orders.placed", "billing"} {
				key := topic[:1] + strconv.Itoa(i)
				msgs = append(msgs, outbox.Message{Topic: topic, Key: key, Payload: fmt.Appendf(nil, `{"round":%d,"key":%q}`, n, key)})
			}
		}
		b.Write(t, msgs...)
		testenv.Await(t, fmt.Sprintf("round %d published", n), func() (any, bool) {
			st := statusJSON(t, b)
			return fmt.Sprintf("pending %d, published %d", st.Pending, st.Published), st.Pending == 0 && st.Published == int64(10*n)
		})
	}
	round(1)
	round(1 + 1)
	between := time.Now()
	round(3)
	round(4)
	cancel()
	testenv.AwaitRecv(t, "the relay to stop", done)

	// Rounds 3 and 4 of the orders.* topic: 10 messages, 5 keys, 2 each.
	target, targetPrefix := natsStream(t, js)
	args := []string{"replay", "--since", between.UTC().Format(time.RFC3339Nano), "--topic", "orders.*",
		"--broker", testnats.URL(), "--route", targetPrefix + "{topic}", "--nats-create-stream", target}
	r := must(t, 0, b.env, append(args, "--dry-run", "--json")...)
	var dry replayResult
	if err := json.Unmarshal([]byte(r.stdout), &dry); err != nil || !dry.DryRun || dry.Messages != 10 {
		t.Fatalf("dry run: %v %+v\n%s", err, dry, r)
	}
	r = must(t, 0, b.env, append(args, "--name", "orders-again", "--json")...)
	var res replayResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.State != "done" || res.Sent != 10 || res.Failed != 0 {
		t.Fatalf("replay: %v %+v\n%s", err, res, r)
	}
	got := streamMessages(t, js, target, 10)
	last := map[string]int{}
	for _, m := range got {
		var body struct {
			Round int
			Key   string
		}
		if err := json.Unmarshal(m.Data, &body); err != nil {
			t.Fatal(err)
		}
		if m.Subject != targetPrefix+"orders.placed" || body.Round < 3 || m.Header.Get(outbox.HeaderReplay) != "orders-again" || m.Header.Get(outbox.HeaderID) == "" {
			t.Errorf("replayed %s %s with headers %v", m.Subject, m.Data, m.Header)
		}
		if body.Round < last[body.Key] {
			t.Errorf("key %s: round %d replayed after round %d", body.Key, body.Round, last[body.Key])
		}
		last[body.Key] = body.Round
	}

	r = must(t, 0, b.env, "status")
	if !strings.Contains(r.stdout, "orders-again") || !strings.Contains(r.stdout, "done") {
		t.Errorf("outbox status does not show the replay:\n%s", r.stdout)
	}
	if r := must(t, 0, b.env, append(args, "--name", "orders-again")...); !strings.Contains(r.stdout, "replay orders-again is done: 10 messages sent") {
		t.Errorf("a done replay run again: %s", r)
	}
	// Another selection under the same name is refused.
	if r := must(t, 2, b.env, "replay", "--name", "orders-again", "--since", "1h", "--broker", testnats.URL()); !strings.Contains(r.stderr, "selects") {
		t.Errorf("a name reused for another selection: %s", r)
	}
	if r := must(t, 2, b.env, "replay", "--broker", testnats.URL()); !strings.Contains(r.stderr, "--since is required") {
		t.Errorf("no time range: %s", r)
	}
	if r := must(t, 2, b.env, "replay", "--since", "1h", "--broker", testnats.URL(), "--destination", "audit"); !strings.Contains(r.stderr, "--destination audit: no such destination") {
		t.Errorf("an unknown destination: %s", r)
	}
}
