package outboxnats_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testnats"
	"github.com/outboxkit/outbox/internal/testinfra/testproxy"
	"github.com/outboxkit/outbox/outboxnats"
	"github.com/outboxkit/outbox/outboxtest/conformance"
)

func TestConformance(t *testing.T) {
	js := testnats.JetStream(t, "")
	host := strings.TrimPrefix(testnats.URL(), "nats://")
	proxy := testproxy.New(t, host)
	var mu sync.Mutex
	streams := map[string]string{} // destination subject -> stream
	conformance.Run(t, conformance.Broker{
		Destination: func(t *testing.T) string {
			stream, prefix := testnats.Stream(t, js)
			mu.Lock()
			defer mu.Unlock()
			streams[prefix+"conformance"] = stream
			return prefix + "conformance"
		},
		Publisher: func(t *testing.T, route string) outbox.Publisher {
			pub, err := outboxnats.Dial(testenv.Context(t), "nats://"+proxy.Addr(), outboxnats.Config{Route: route})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pub.Close)
			return pub
		},
		Read: func(t *testing.T, dest string, n int) []conformance.Received {
			mu.Lock()
			stream := streams[dest]
			mu.Unlock()
			return readStream(t, js, stream, n)
		},
		Reject: func(t *testing.T, dest string) *outbox.Message {
			// Over the server's max_payload: refused before it is sent.
			return &outbox.Message{ID: outbox.NewID(), Topic: "big", Key: "big", Payload: make([]byte, 2<<20)}
		},
		Cut:     func(t *testing.T) { proxy.Cut() },
		Restore: func(t *testing.T) { proxy.Restore(t) },
		// The server's max_payload (1 MiB by default) bounds headers and payload together.
		MaxPayload: 1<<20 - 4096,
	})
}

// readStream reads every message of stream in stream order, once it holds n or their
// number has stopped growing for testenv.Stall() (then the suite reports what is missing).
func readStream(t *testing.T, js jetstream.JetStream, stream string, n int) []conformance.Received {
	t.Helper()
	// Progress gets no deadline of its own: the stall detector is the bound, and each poll
	// has a context of its own.
	err := testenv.Progress(context.Background(), fmt.Sprintf("%d messages in stream %s", n, stream), testenv.Stall(), func() (any, bool) {
		ctx, cancel := testenv.CallContext()
		defer cancel()
		info, err := js.Stream(ctx, stream)
		if err != nil {
			t.Fatalf("stream %s: %v", stream, err)
		}
		got := info.CachedInfo().State.Msgs
		return got, got >= uint64(n)
	})
	if err != nil {
		t.Logf("reading what there is: %v", err)
	}
	cons, err := js.OrderedConsumer(testenv.Context(t), stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatalf("ordered consumer on %s: %v", stream, err)
	}
	var out []conformance.Received
	for {
		batch, err := cons.FetchNoWait(1000)
		if err != nil {
			t.Fatalf("fetch: %v", err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			h := map[string]string{}
			for k := range m.Headers() {
				h[k] = m.Headers().Get(k)
			}
			out = append(out, conformance.Received{
				DedupID:     h[jetstream.MsgIDHeader],
				Key:         h[outbox.HeaderKey],
				ContentType: h[outbox.HeaderContentType],
				Headers:     h,
				Payload:     m.Data(),
			})
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			t.Fatalf("fetch: %v", err)
		}
		if got == 0 {
			return out
		}
	}
}
