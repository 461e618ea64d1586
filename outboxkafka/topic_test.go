package outboxkafka_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxkafka"
)

func TestCheckTopic(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 1, nil)
	pub := tc.dial(t, outboxkafka.Config{})
	if err := pub.CheckTopic(testenv.Context(t), topic); err != nil {
		t.Errorf("existing topic: %v", err)
	}
	err := pub.CheckTopic(testenv.Context(t), "missing")
	if !errors.Is(err, outboxkafka.ErrNoTopic) || !strings.Contains(err.Error(), `"missing"`) {
		t.Errorf("missing topic: %v, want ErrNoTopic naming it", err)
	}
	if err := pub.CheckTopic(testenv.Context(t), "bad name"); err == nil || errors.Is(err, outboxkafka.ErrNoTopic) {
		t.Errorf("invalid name: %v, want an error other than ErrNoTopic", err)
	}
	tc.Cut()
	// An input: cut off, CheckTopic waits for the cluster until this deadline.
	if err := pub.CheckTopic(ctxT(t, time.Second), topic); err == nil || errors.Is(err, outboxkafka.ErrNoTopic) {
		t.Errorf("cut off: %v, want an error other than ErrNoTopic", err)
	}
}

func TestSeeds(t *testing.T) {
	t.Parallel()
	for in, want := range map[string][]string{
		"kafka://k1:9092":                     {"k1:9092"},
		"kafka://k1:9092,k2:9093":             {"k1:9092", "k2:9093"},
		"kafka://k1:9092, kafka://k2:9093/":   {"k1:9092", "k2:9093"},
		"kafka://k1":                          {"k1:9092"},
		"kafka://[::1]:9094,[::1]":            {"[::1]:9094", "[::1]:9092"},
		" kafka://127.0.0.1:19092,127.0.0.1 ": {"127.0.0.1:19092", "127.0.0.1:9092"},
	} {
		got, err := outboxkafka.Seeds(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("Seeds(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{
		"", "k1:9092", "nats://k1:4222", "kafka://", "kafka://k1:9092,,k2", "kafka://user:s3cret@k1:9092",
		"kafka://k1:9092/path", "kafka://k1:9092?x=1", "kafka://k1:", "kafka://:9092", "kafka://::1",
	} {
		got, err := outboxkafka.Seeds(in)
		if err == nil {
			t.Errorf("Seeds(%q) = %q, want an error", in, got)
		} else if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Seeds(%q): %v quotes the password", in, err)
		}
	}
}
