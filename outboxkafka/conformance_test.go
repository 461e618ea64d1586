package outboxkafka_test

import (
	"context"
	"crypto/rand"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxkafka"
	"github.com/outboxkit/outbox/outboxtest/conformance"
)

// TestConformance runs the publisher suite against a three-broker kfake cluster behind
// toxiproxies. Topics have four partitions and a max.message.bytes of 2 MiB, under the
// publisher's MaxMessageBytes of 4 MiB: the refused message is refused by the broker,
// and the records batched with it must still be confirmed.
//
// The suite cuts the broker off for 2 s while its Publish calls wait up to 5 s, and
// expects an outage to be reported. franz-go retries a produce until the Publish gives
// up, so a cut shorter than the Publish's ctx is ridden out without one. Restore
// therefore first waits until a Publish has reported an outage: the suite then checks
// that nothing was lost, duplicated beyond what was in flight, or reordered across a
// real outage.
func TestConformance(t *testing.T) {
	t.Parallel()
	tc := startCluster(t, kfake.NumBrokers(3))
	var outages atomic.Int64
	conformance.Run(t, conformance.Broker{
		Destination: func(t *testing.T) string {
			return tc.createTopic(t, 4, map[string]string{"max.message.bytes": strconv.Itoa(topicMaxBytes)})
		},
		Publisher: func(t *testing.T, route string) outbox.Publisher {
			pub := tc.dial(t, outboxkafka.Config{Route: route, MaxMessageBytes: 2 * topicMaxBytes})
			return outageCounter{pub, &outages}
		},
		Read: func(t *testing.T, dest string, n int) []conformance.Received {
			return received(tc.read(t, dest, n))
		},
		Reject: func(t *testing.T, dest string) *outbox.Message {
			// Random, so that compression cannot bring it under the limit.
			return testenv.Message("big", "big", randomBytes(topicMaxBytes+1))
		},
		Cut: func(t *testing.T) {
			outages.Store(0)
			tc.Cut()
		},
		Restore: func(t *testing.T) {
			testenv.AwaitCond(t, "a Publish to report an outage while the cluster is cut off", func() bool { return outages.Load() > 0 })
			tc.Restore(t)
		},
	})
}

// outageCounter counts the outages its publisher reports.
type outageCounter struct {
	outbox.Publisher
	n *atomic.Int64
}

func (p outageCounter) Publish(ctx context.Context, batch []*outbox.Message) []error {
	errs := p.Publisher.Publish(ctx, batch)
	for _, err := range errs {
		if outbox.IsOutage(err) {
			p.n.Add(1)
		}
	}
	return errs
}

const topicMaxBytes = 2 << 20

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}
