package outbox_test

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxtest"
)

// TestMemRelayFingerprintGivesWay: a relay whose fingerprint (its destinations and
// routing) differs from the running relay's takes no shard and publishes nothing while
// that one runs, says why in its log, and takes every shard once it stopped: a rolling
// change of the routing publishes each key's messages under one routing at a time.
func TestMemRelayFingerprintGivesWay(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := setupMem(t)
		oldPub, newPub := &outboxtest.Publisher{}, &outboxtest.Publisher{}
		old := b.relay(t, oldPub, outbox.RelayConfig{ID: "old", Fingerprint: "routing-1"})
		testenv.Await(t, "the old relay to lease every shard", holdsShards(old, 64))
		keys := memKeys("k", 20)
		b.writeRounds(t, 2, keys)

		var log testenv.Buffer
		next := b.relay(t, newPub, outbox.RelayConfig{ID: "new", Fingerprint: "routing-2",
			Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		// A fellow of the old routing shares the shards as usual.
		fellow := b.relay(t, oldPub, outbox.RelayConfig{ID: "fellow", Fingerprint: "routing-1"})
		testenv.Await(t, "the old relays to share the shards", func() (any, bool) {
			a, f := old.Stats().Shards, fellow.Stats().Shards
			return fmt.Sprintf("old %d, fellow %d", a, f), a+f == 64 && a > 0 && f > 0
		})
		b.writeRounds(t, 3, keys)
		time.Sleep(10 * time.Second) // lease rounds every second: the bubble's clock, no wall time
		synctest.Wait()
		b.awaitPublished(t, oldPub)
		if n, got := next.Stats().Shards, len(newPub.Messages()); n != 0 || got != 0 {
			t.Fatalf("beside relays of another routing, the new relay holds %d shards and published %d messages", n, got)
		}
		if !strings.Contains(log.String(), "taking no shards") || !strings.Contains(log.String(), "their_fingerprints=routing-1") {
			t.Errorf("the new relay's log does not say why it waits:\n%s", log.String())
		}
		for _, r := range b.status(t).Relays {
			want := map[string]string{"old": "routing-1", "fellow": "routing-1", "new": "routing-2"}[r.ID]
			if r.Fingerprint != want {
				t.Errorf("status shows relay %s with fingerprint %q, want %q", r.ID, r.Fingerprint, want)
			}
		}

		before := len(oldPub.Messages())
		for _, r := range []*outbox.Relay{old, fellow} {
			ctx, cancel := testenv.CallContext()
			if err := r.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			cancel()
		}
		testenv.Await(t, "the new relay to take every shard once the old ones stopped", holdsShards(next, 64))
		b.writeRounds(t, 2, keys)
		testenv.Await(t, "the new relay to publish the messages written since", func() (any, bool) {
			n := len(newPub.Messages())
			return fmt.Sprintf("%d published, %d pending", n, b.status(t).Pending), n == 2*len(keys) && b.status(t).Pending == 0
		})
		if after := len(oldPub.Messages()); after != before {
			t.Errorf("the old relays published %d messages after they stopped", after-before)
		}
		b.checkHistory(t, append(oldPub.Messages(), newPub.Messages()...))
	})
}
