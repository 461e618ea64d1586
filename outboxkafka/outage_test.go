package outboxkafka_test

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxkafka"
)

// The tests in this file make the broker fail: kfake answers chosen produce requests
// with a Kafka error code (Cluster.Fault), or the proxies in front of it cut every
// connection. Each test runs its own cluster.

func batchOf(n int) []*outbox.Message {
	batch := make([]*outbox.Message, n)
	for i := range batch {
		batch[i] = testenv.Message("x", "key-"+strconv.Itoa(i), []byte(strconv.Itoa(i)))
	}
	return batch
}

// publishEventually publishes batch as the relay would after an outage: again and again
// until it is confirmed, failing the test when the outages stay the same for
// testenv.Stall(). Anything but an outage fails the test at once.
func publishEventually(t *testing.T, pub *outboxkafka.Publisher, batch []*outbox.Message) {
	t.Helper()
	testenv.Await(t, "the batch to be confirmed after the fault", func() (any, bool) {
		ctx, cancel := testenv.CallContext() // per attempt
		defer cancel()
		errs := pub.Publish(ctx, batch)
		for i, err := range errs {
			if err != nil && !outbox.IsOutage(err) {
				t.Fatalf("message %d: %v, want an outage or success", i, err)
			}
		}
		return errs, errs == nil
	})
}

func produceFault(topic string, err *kerr.Error, count int) kfake.Fault {
	return kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: err, Count: count}
}

// TestFaultRetriedByClient: franz-go retries retriable errors itself, so a few of them
// cost the Publish nothing.
func TestFaultRetriedByClient(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 2, nil)
	// NOT_LEADER_FOR_PARTITION makes the client reload metadata, by default at most
	// every 5 s.
	pub := tc.dial(t, outboxkafka.Config{Route: topic}, kgo.MetadataMinAge(50*time.Millisecond))
	for _, code := range []*kerr.Error{kerr.NotLeaderForPartition, kerr.NotEnoughReplicas, kerr.RequestTimedOut} {
		h := tc.Fault(produceFault(topic, code, 2))
		testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batchOf(4)))
		if h.Hits() != 2 {
			t.Errorf("%s: the fault answered %d produce requests, want 2", code.Message, h.Hits())
		}
	}
	// REQUEST_TIMED_OUT is answered after the append: the idempotent producer's retry
	// is deduplicated by the broker.
	if n := len(tc.read(t, topic, 12)); n != 12 {
		t.Errorf("%d records in the topic, want 12", n)
	}
}

// TestFaultOutages answers every produce with an error the package classifies as an
// outage: retriable ones make Publish wait until its ctx is done (a 1 s deadline, the
// input here), the others fail at once, whatever the deadline; none is a rejection. Once the fault is gone the same publisher publishes again.
// The first Publish after the fault may still fail as an outage: franz-go fails the
// records still buffered for the partition with the earlier Publish's ctx error, which
// is why the relay simply tries again.
func TestFaultOutages(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		err       *kerr.Error
		retriable bool
	}{
		{kerr.NotEnoughReplicas, true},
		{kerr.KafkaStorageError, true},
		{kerr.LeaderNotAvailable, true},
		{kerr.TopicAuthorizationFailed, false},
		{kerr.InvalidTimestamp, false},
		{kerr.UnknownServerError, false},
		{kerr.PolicyViolation, false},
		{kerr.UnsupportedForMessageFormat, false},
	} {
		t.Run(tt.err.Message, func(t *testing.T) {
			t.Parallel()
			tc := startCluster(t)
			topic := tc.createTopic(t, 2, nil)
			pub := tc.dial(t, outboxkafka.Config{Route: topic})
			h := tc.Fault(produceFault(topic, tt.err, -1))
			// A non-retriable error must come back however slow the machine: no
			// deadline it could miss, only the hang bound.
			ctx := testenv.Context(t)
			if tt.retriable {
				ctx = ctxT(t, time.Second)
			}
			errs := pub.Publish(ctx, batchOf(3))
			testenv.RequireAllOutages(t, errs, 3)
			for i, err := range errs {
				want := error(tt.err)
				if tt.retriable {
					want = context.DeadlineExceeded
				}
				if !errors.Is(err, want) {
					t.Errorf("message %d: %v, want it to match %v", i, err, want)
				}
			}
			h.Remove()
			publishEventually(t, pub, batchOf(3))
		})
	}
}

// TestFaultIdempotentWriteDenied: without the IDEMPOTENT_WRITE permission the client
// gets no producer id; that is a configuration problem, an outage.
func TestFaultIdempotentWriteDenied(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 1, nil)
	pub := tc.dial(t, outboxkafka.Config{Route: topic})
	tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.InitProducerID}, Err: kerr.ClusterAuthorizationFailed, Count: -1})
	errs := pub.Publish(testenv.Context(t), batchOf(2))
	testenv.RequireAllOutages(t, errs, 2)
	if len(errs) > 0 && !errors.Is(errs[0], kerr.ClusterAuthorizationFailed) {
		t.Errorf("%v, want it to match CLUSTER_AUTHORIZATION_FAILED", errs[0])
	}
}

// TestFaultPoisonRecord: Kafka refuses a record batch holding one invalid record with
// INVALID_RECORD, which fails every record of the batch. Only the invalid one may be
// rejected: the others are sent again alone and confirmed.
func TestFaultPoisonRecord(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 1, nil)
	poison := []byte("poison-payload")
	h := tc.Fault(kfake.Fault{
		Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.InvalidRecord, Count: -1,
		When: func(req kmsg.Request) bool {
			for _, rt := range req.(*kmsg.ProduceRequest).Topics {
				for _, rp := range rt.Partitions {
					if bytes.Contains(rp.Records, poison) {
						return true
					}
				}
			}
			return false
		},
	})
	// Uncompressed, so that the fault sees the payload; the linger puts the whole
	// Publish in one record batch.
	pub := tc.dial(t, outboxkafka.Config{Route: topic, Compression: "none"}, kgo.ProducerLinger(50*time.Millisecond))
	batch := batchOf(8)
	batch[3].Payload = poison
	errs := pub.Publish(testenv.Context(t), batch)
	if len(errs) != len(batch) {
		t.Fatalf("errs = %v, want %d entries", errs, len(batch))
	}
	for i, err := range errs {
		switch {
		case i == 3 && (err == nil || outbox.IsOutage(err) || !errors.Is(err, kerr.InvalidRecord)):
			t.Errorf("poison: %v, want a rejection matching INVALID_RECORD", err)
		case i != 3 && err != nil:
			t.Errorf("message %d, batched with the poison: %v", i, err)
		}
	}
	if h.Hits() < 2 {
		t.Errorf("the fault answered %d requests: the poison was not batched with others, then sent alone", h.Hits())
	}
	if n := len(tc.read(t, topic, 7)); n != 7 {
		t.Errorf("%d records in the topic, want 7", n)
	}
}

// TestFaultCorruptOnce: a record batch corrupted once (CORRUPT_MESSAGE, which franz-go
// does not retry) is sent again record by record and confirmed.
func TestFaultCorruptOnce(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 1, nil)
	pub := tc.dial(t, outboxkafka.Config{Route: topic}, kgo.ProducerLinger(20*time.Millisecond))
	h := tc.Fault(produceFault(topic, kerr.CorruptMessage, 1))
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batchOf(5)))
	if h.Hits() != 1 {
		t.Errorf("the fault answered %d requests, want 1", h.Hits())
	}
}

// TestNoTopic: a topic that does not exist (and is not auto-created) is a configuration
// problem: an outage naming the topic, never a rejection.
func TestNoTopic(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	pub := tc.dial(t, outboxkafka.Config{Route: "missing-{topic}"})
	errs := pub.Publish(testenv.Context(t), batchOf(2))
	testenv.RequireAllOutages(t, errs, 2)
	for i, err := range errs {
		if !errors.Is(err, outboxkafka.ErrNoTopic) || !errors.Is(err, kerr.UnknownTopicOrPartition) ||
			!strings.Contains(err.Error(), `"missing-x"`) {
			t.Errorf("message %d: %v, want ErrNoTopic naming the topic", i, err)
		}
	}
}

// TestOutageCutAndReconnect cuts every connection: Publish returns outages when its ctx
// ends (franz-go would retry for ever), Ping fails; once the network heals the same
// publisher confirms again, and every message it confirmed is in the topic.
func TestOutageCutAndReconnect(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 2, nil)
	pub := tc.dial(t, outboxkafka.Config{Route: topic})
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batchOf(3)))

	tc.Cut()
	errs := pub.Publish(ctxT(t, 500*time.Millisecond), batchOf(5))
	testenv.RequireAllOutages(t, errs, 5)
	for i, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("message %d: %v, want the Publish's own deadline as the cause", i, err)
		}
	}
	if err := pub.Ping(ctxT(t, 500*time.Millisecond)); !outbox.IsOutage(err) {
		t.Errorf("Ping while cut off = %v, want an outage", err)
	}

	tc.Restore(t)
	// The client retries the records the cut Publish gave up on: its first connection
	// after the failed ones tells the relay, without probing.
	testenv.AwaitRecv(t, "the publisher to report its reconnection", pub.Reconnected())
	testenv.Await(t, "the publisher to reconnect", func() (any, bool) {
		ctx, cancel := testenv.CallContext() // per ping
		defer cancel()
		err := pub.Ping(ctx)
		return err, err == nil
	})
	// The first Publish after the cut can still fail as an outage: records of the cut
	// Publish, whose ctx ended, may share a partition batch with the new ones, and
	// franz-go fails the batch with their ctx's error (seen once in CI under -race). The
	// relay sends such messages again; so does the test, until one Publish goes through.
	attempts := 0
	testenv.Await(t, "a Publish after the reconnection to go through", func() (any, bool) {
		attempts++
		errs := pub.Publish(testenv.Context(t), batchOf(4))
		if errs != nil {
			requireAllOutagesOrNil(t, errs)
		}
		return errs, errs == nil
	})
	// The 5 the cut Publish gave up on may still have been delivered since, and so may
	// the messages of a Publish that failed as an outage.
	if n, most := len(tc.read(t, topic, 3+4)), 3+5+4*attempts; n < 3+4 || n > most {
		t.Errorf("%d records in the topic, want 7 to %d", n, most)
	}
}

// requireAllOutagesOrNil fails t if any error of errs is not an outage.
func requireAllOutagesOrNil(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil && !outbox.IsOutage(err) {
			t.Fatalf("message %d: %v, want an outage or nil", i, err)
		}
	}
}

// TestOutageInFlight cuts the connections while acknowledgements are awaited: the
// messages whose outcome is unknown must be outages, never rejections.
func TestOutageInFlight(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 4, nil)
	pub := tc.dial(t, outboxkafka.Config{Route: topic})
	batch := make([]*outbox.Message, 2000)
	for i := range batch {
		batch[i] = testenv.Message("x", "key-"+strconv.Itoa(i), randomBytes(4096))
	}
	done := make(chan []error)
	go func() {
		// An input: the Publish gives up at this deadline, with acknowledgements still
		// out, whose outcome is then unknown.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		done <- pub.Publish(ctx, batch)
	}()
	tc.Cut()
	errs := testenv.AwaitRecv(t, "Publish to return after the cut", done)
	for i, err := range errs {
		if err != nil && !outbox.IsOutage(err) {
			t.Fatalf("message %d: %v, want an outage or success", i, err)
		}
	}
}

// TestOutageClusterGone: a cluster that is shut down is an outage for Publish and Ping.
func TestOutageClusterGone(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 1, nil)
	pub := tc.dial(t, outboxkafka.Config{Route: topic})
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batchOf(1)))
	tc.Close()
	testenv.RequireAllOutages(t, pub.Publish(ctxT(t, time.Second), batchOf(2)), 2) // waits for a broker until its ctx ends
	if err := pub.Ping(ctxT(t, time.Second)); !outbox.IsOutage(err) {
		t.Errorf("Ping = %v, want an outage", err)
	}
}

// TestCloseDuringPublish: Close makes a Publish waiting for acknowledgements return
// outages at once; Publish after Close fails without sending; closing twice is safe.
func TestCloseDuringPublish(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 1, nil)
	pub := tc.dial(t, outboxkafka.Config{Route: topic})
	testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batchOf(1)))
	tc.Cut() // acknowledgements never come
	done := make(chan []error, 1)
	go func() { done <- pub.Publish(context.Background(), batchOf(3)) }()
	// Shapes the fault: most likely the Publish is waiting when Close comes. Should it
	// start after Close instead, it fails at once, an outage all the same.
	time.Sleep(100 * time.Millisecond)
	pub.Close()
	errs := testenv.AwaitRecv(t, "Publish to return after Close", done)
	testenv.RequireAllOutages(t, errs, 3)
	pub.Close()
	errs = pub.Publish(testenv.Context(t), batchOf(2))
	testenv.RequireAllOutages(t, errs, 2)
	if !errors.Is(errs[0], kgo.ErrClientClosed) {
		t.Errorf("after Close: %v, want kgo.ErrClientClosed", errs[0])
	}
	if err := pub.Ping(testenv.Context(t)); !outbox.IsOutage(err) || !errors.Is(err, kgo.ErrClientClosed) {
		t.Errorf("Ping after Close = %v, want an outage matching kgo.ErrClientClosed", err)
	}
}
