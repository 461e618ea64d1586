package outboxkafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
)

// TestClassify pins the error table of the package documentation, including errors the
// tests against kfake cannot provoke.
func TestClassify(t *testing.T) {
	t.Parallel()
	// franz-go adds sizes to MESSAGE_TOO_LARGE this way.
	tooLarge := fmt.Errorf("%w (uncompressed_bytes=2000000)", kerr.MessageTooLarge)
	for _, tc := range []struct {
		err    error
		outage bool
	}{
		// Rejections: the record itself.
		{tooLarge, false},
		{kerr.MessageTooLarge, false},
		{kerr.RecordListTooLarge, false},
		{kerr.InvalidRecord, false},
		{kerr.CorruptMessage, false},
		{kerr.InvalidTopicException, false},

		// Outages: the connection, the client, time.
		{kgo.ErrClientClosed, true},
		{kgo.ErrRecordTimeout, true},
		{kgo.ErrRecordRetries, true},
		{kgo.ErrMaxBuffered, true},
		{context.DeadlineExceeded, true},
		{context.Canceled, true},
		{io.EOF, true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{errors.New("something new"), true},
		// Outages: retriable Kafka errors the client gave up on.
		{kerr.NotLeaderForPartition, true},
		{kerr.LeaderNotAvailable, true},
		{kerr.NotEnoughReplicas, true},
		{kerr.NotEnoughReplicasAfterAppend, true},
		{kerr.RequestTimedOut, true},
		{kerr.NetworkException, true},
		{kerr.KafkaStorageError, true},
		{kerr.BrokerNotAvailable, true},
		{kerr.ThrottlingQuotaExceeded, true},
		// Outages: configuration and permissions, the same for every message.
		{kerr.UnknownTopicOrPartition, true},
		{kerr.UnknownTopicID, true},
		{kerr.TopicAuthorizationFailed, true},
		{kerr.ClusterAuthorizationFailed, true},
		{kerr.TransactionalIDAuthorizationFailed, true},
		{kerr.SaslAuthenticationFailed, true},
		{kerr.InvalidRequiredAcks, true},
		{kerr.UnsupportedCompressionType, true},
		{kerr.UnsupportedForMessageFormat, true},
		{kerr.UnsupportedVersion, true},
		{kerr.InvalidTimestamp, true},
		{kerr.PolicyViolation, true},
		// Outages: the idempotent producer's state, which the client recovers.
		{kerr.OutOfOrderSequenceNumber, true},
		{kerr.InvalidProducerEpoch, true},
		{kerr.UnknownProducerID, true},
		{kerr.UnknownServerError, true},
	} {
		got := classify(tc.err, "orders")
		if outbox.IsOutage(got) != tc.outage {
			t.Errorf("%v: IsOutage = %v, want %v", tc.err, !tc.outage, tc.outage)
		}
		if !errors.Is(got, tc.err) {
			t.Errorf("%v does not wrap %v", got, tc.err)
		}
		if !strings.Contains(got.Error(), `"orders"`) {
			t.Errorf("%v does not name the topic", got)
		}
	}
	if err := classify(kerr.UnknownTopicOrPartition, "orders"); !errors.Is(err, ErrNoTopic) {
		t.Errorf("unknown topic: %v, want ErrNoTopic", err)
	}
	already := outbox.Outage(errors.New("given up"))
	if got := classify(already, "orders"); got != already {
		t.Errorf("an outage was wrapped again: %v", got)
	}
}

func TestBatchLevel(t *testing.T) {
	t.Parallel()
	for err, want := range map[error]bool{
		fmt.Errorf("%w (uncompressed_bytes=1)", kerr.MessageTooLarge): true,
		kerr.RecordListTooLarge:    true,
		kerr.InvalidRecord:         true,
		kerr.CorruptMessage:        true,
		kerr.InvalidTopicException: false, // the topic's, not the batch's
		kerr.NotEnoughReplicas:     false,
		context.Canceled:           false,
	} {
		if got := batchLevel(err); got != want {
			t.Errorf("batchLevel(%v) = %v, want %v", err, got, want)
		}
	}
}

func TestCheckTopic(t *testing.T) {
	t.Parallel()
	for name, valid := range map[string]bool{
		"orders": true, "a.b_c-D9": true, "...": true, strings.Repeat("x", 249): true,
		"": false, ".": false, "..": false, strings.Repeat("x", 250): false,
		"a b": false, "a/b": false, "a:b": false, "ü": false, "a\x00": false, "{topic}": false,
		"__consumer_offsets": false, "__transaction_state": false, "_single": true, "a__b": true,
	} {
		if got := checkTopic(name) == ""; got != valid {
			t.Errorf("checkTopic(%.20q) valid = %v, want %v", name, got, valid)
		}
	}
}

func TestHeaders(t *testing.T) {
	t.Parallel()
	m := &outbox.Message{
		ID: outbox.NewID(), Topic: "orders", Key: "k",
		Headers: map[string]string{"a": "1", outbox.HeaderKey: "forged", "content-type": "x"},
	}
	got := map[string]int{}
	for _, h := range headers(m) {
		got[h.Key]++
		if h.Key == outbox.HeaderKey && string(h.Value) != "k" {
			t.Errorf("%s = %q, want the message's key", h.Key, h.Value)
		}
	}
	for k, n := range got {
		if n != 1 {
			t.Errorf("header %s sent %d times", k, n)
		}
	}
	// Kafka header names are case-sensitive: an own "content-type" is not Content-Type.
	if got["content-type"] != 1 || got["a"] != 1 {
		t.Errorf("own headers missing: %v", got)
	}
}
