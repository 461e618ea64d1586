package outboxkafka

import (
	"errors"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outboxkit/outbox"
)

// ErrNoTopic is matched (errors.Is) by every *NoTopicError.
var ErrNoTopic = errors.New("outboxkafka: the topic does not exist")

// NoTopicError reports a topic that does not exist (UNKNOWN_TOPIC_OR_PARTITION after the
// client's retries): nothing would store a message produced to it. Publish returns it
// wrapped as an outage, since it is a configuration problem that would otherwise
// dead-letter every message of the topic. A topic being created or a partition without
// a leader for a moment gives the same answer, which the client retries a few times
// before it gives up.
type NoTopicError struct {
	Topic string
	Err   error // the underlying error (kerr.UnknownTopicOrPartition, ...)
}

func (e *NoTopicError) Error() string {
	return fmt.Sprintf("outboxkafka: topic %q does not exist: create it (for example: kafka-topics.sh --create --topic %s) "+
		"or fix the publisher's Route; a broker creates missing topics only with auto.create.topics.enable and a client "+
		"that asks for it (kgo.AllowAutoTopicCreation)", e.Topic, e.Topic)
}

// Is makes errors.Is(err, ErrNoTopic) true.
func (e *NoTopicError) Is(target error) bool { return target == ErrNoTopic }

func (e *NoTopicError) Unwrap() error { return e.Err }

// classify turns franz-go's error for a record of topic into an outage or a rejection
// (see the package documentation).
func classify(err error, topic string) error {
	if outbox.IsOutage(err) {
		return err
	}
	switch {
	case errors.Is(err, kerr.UnknownTopicOrPartition), errors.Is(err, kerr.UnknownTopicID):
		return outbox.Outage(&NoTopicError{Topic: topic, Err: err})
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		return fmt.Errorf("outboxkafka: produce to topic %q: %w (the record must fit both the publisher's MaxMessageBytes and the topic's max.message.bytes)", topic, err)
	case rejection(err):
		return fmt.Errorf("outboxkafka: produce to topic %q: %w", topic, err)
	}
	// Connection-level errors, timeouts, retriable Kafka errors the client gave up on,
	// authorization and configuration problems, anything unknown: pause, lose nothing.
	return outbox.Outage(fmt.Errorf("outboxkafka: produce to topic %q: %w", topic, err))
}

// rejection reports whether err is Kafka refusing the record on its merits.
func rejection(err error) bool {
	return batchLevel(err) || errors.Is(err, kerr.InvalidTopicException)
}

// batchLevel reports whether err is a refusal that Kafka gives a whole record batch,
// so that every record of the batch gets it, whichever record caused it.
func batchLevel(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) ||
		errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord) ||
		errors.Is(err, kerr.CorruptMessage)
}

// Check returns a check for outbox.WriterConfig.Check that refuses at write time the
// messages whose Kafka topic, by route (the publisher's Config.Route; "" is "{topic}"),
// Kafka cannot hold: characters other than ASCII letters, digits, '.', '_' and '-', over
// 249 characters, or one of Kafka's internal topics. The relay would otherwise
// dead-letter them at their first attempt.
func Check(route string) (func(*outbox.Message) error, error) {
	r, err := outbox.ParseRoute(route)
	if err != nil {
		return nil, err
	}
	return r.Check("Kafka topic", checkTopic), nil
}

// checkTopic returns why name cannot be a Kafka topic, or "": topic names are 1 to 249
// ASCII letters, digits, '.', '_' and '-', and neither "." nor "..". Names starting with
// "__" are Kafka's internal topics (__consumer_offsets, __transaction_state, ...): a
// record there could corrupt consumer groups or transactions.
func checkTopic(name string) string {
	switch {
	case name == "":
		return "empty topic name"
	case name == "." || name == "..":
		return `"." and ".." are not topic names`
	case strings.HasPrefix(name, "__"):
		return `names starting with "__" are reserved for Kafka's internal topics`
	case len(name) > 249:
		return fmt.Sprintf("%d characters, over Kafka's limit of 249", len(name))
	}
	for i, c := range name {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Sprintf("character %q at byte %d: topic names hold only ASCII letters, digits, '.', '_' and '-'", c, i)
		}
	}
	return ""
}
