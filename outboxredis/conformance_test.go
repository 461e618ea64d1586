package outboxredis_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testproxy"
	"github.com/outboxkit/outbox/outboxredis"
	"github.com/outboxkit/outbox/outboxtest/conformance"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	t.Run("XADD", func(t *testing.T) {
		t.Parallel()
		runConformance(t, outboxredis.Config{})
	})
	t.Run("DedupWindow", func(t *testing.T) {
		t.Parallel()
		runConformance(t, outboxredis.Config{DedupWindow: time.Minute})
	})
}

// runConformance runs the suite with publishers made by Dial that reach the shared
// server through a proxy the suite can cut.
//
// The suite routes every message to the destination by a template without placeholders,
// but Redis refuses a message only for its stream (WRONGTYPE): so the publishers route by
// dest + ".{aggregate_type}", the suite's messages (aggregate type "widget") land in the
// stream dest + ".widget", which Read reads, and the refused message (aggregate type
// "wrongtype") goes to dest + ".wrongtype", a string key.
func runConformance(t *testing.T, cfg outboxredis.Config) {
	direct := newClient(t, sharedAddr())
	proxy := testproxy.New(t, sharedAddr())
	conformance.Run(t, conformance.Broker{
		Destination: func(t *testing.T) string { return uniqueStream(t, direct) },
		Publisher: func(t *testing.T, route string) outbox.Publisher {
			cfg := cfg
			cfg.Route = route + ".{aggregate_type}"
			// read_timeout: see newClient.
			pub, err := outboxredis.Dial(testenv.Context(t), "redis://"+proxy.Addr()+"?read_timeout=1m", cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pub.Close)
			return pub
		},
		Read: func(t *testing.T, dest string, n int) []conformance.Received {
			stream := dest + ".widget"
			var es []outboxredis.Entry
			// When fewer than n come and their number stops growing, the suite reports
			// what is missing.
			err := testenv.Progress(context.Background(), fmt.Sprintf("%d entries in %s", n, stream), testenv.Stall(), func() (any, bool) {
				es = entries(t, direct, stream)
				return len(es), len(es) >= n
			})
			if err != nil {
				t.Logf("reading what there is: %v", err)
			}
			out := make([]conformance.Received, len(es))
			for i, e := range es {
				out[i] = conformance.Received{
					DedupID:     e.DedupKey(),
					Key:         e.Headers[outbox.HeaderKey],
					ContentType: e.Headers[outbox.HeaderContentType],
					Headers:     e.Headers,
					Payload:     e.Payload,
				}
			}
			return out
		},
		Reject: func(t *testing.T, dest string) *outbox.Message {
			if err := direct.Set(testenv.Context(t), dest+".wrongtype", "not a stream", 0).Err(); err != nil {
				t.Fatal(err)
			}
			m := newMsg("conformance", "rejected", []byte(`{}`))
			m.AggregateType = "wrongtype"
			return m
		},
		Cut:     func(t *testing.T) { proxy.Cut() },
		Restore: func(t *testing.T) { proxy.Restore(t) },
	})
}
