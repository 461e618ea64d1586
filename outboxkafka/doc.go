// Package outboxkafka publishes outbox messages to Apache Kafka with franz-go, and
// consumes them in a consumer group (Consume, see Consuming below). Its Publisher
// implements outbox.Publisher and outbox.Pinger.
//
// # Quick start
//
//	pub, err := outboxkafka.Dial(ctx, []string{"kafka-1:9092", "kafka-2:9092"},
//		outboxkafka.Config{Route: "events.{topic}"})
//	if err != nil {
//		return err
//	}
//	defer pub.Close()
//	relay, err := outbox.NewRelay(store, pub, outbox.RelayConfig{})
//
// Dial builds and owns a franz-go client (TLS and SASL in Config); New takes a
// *kgo.Client the application already has, after checking that it produces with acks=all
// and idempotently (see New). Topics must exist: create them with the partition count,
// replication factor and min.insync.replicas the events deserve.
//
// # On the wire
//
// A message becomes one record:
//
//   - topic: Config.Route applied to the message ("events.{topic}" sends Topic "orders"
//     to "events.orders"; outbox.RouteDebezium gives Debezium's layout);
//   - key: Message.Key, so that the messages of a key share a partition (franz-go hashes
//     keys with murmur2, as the Java client does); an empty Key gives a null key;
//   - value: the payload byte for byte; an empty payload is an empty value, never a null
//     one (which compacted topics read as a tombstone);
//   - headers: the message's own headers (W3C traceparent included), then Outbox-Id,
//     Outbox-Dedup-Key, Outbox-Key, Outbox-Aggregate-Type, Outbox-Event-Type,
//     Outbox-Topic, Outbox-Created-At and Content-Type, each name once (a metadata
//     header replaces an own header of the same name; names are case-sensitive);
//   - timestamp: when the record was produced (creation time is in Outbox-Created-At).
//
// Kafka has no field for a deduplication id or a content type: both travel as headers
// only (Outbox-Dedup-Key, Content-Type).
//
// # Guarantees
//
// A message counts as published only when Kafka acknowledged its record with acks=all:
// the partition leader answers once every in-sync replica has the record. How many
// replicas that is depends on the topic: with replication.factor=3 and
// min.insync.replicas=2 an acknowledged record survives the loss of any one broker;
// with min.insync.replicas=1 (the broker default) the leader alone may acknowledge.
// Kafka acknowledges records that replicas hold in memory and leaves the flush to disk
// to the operating system: durability comes from replication, not from fsync.
//
// Per-key order. The relay never has two messages of one key in flight: it hands a
// key's next message to Publish only after the previous one was confirmed. A key always
// maps to the same partition, and within a partition records are stored in the order
// they were produced; the idempotent producer keeps that order across franz-go's own
// retries (sequence numbers per partition, up to five requests in flight per broker).
// When a Publish gives up on a record (its ctx is done), the client may still deliver it;
// the relay sends the message again, and the second copy is produced behind the first in
// the same partition, before the key's next message. Adding partitions to a topic moves
// keys to other partitions: order across that change is not guaranteed, as with any
// Kafka producer.
//
// Duplicates. Kafka does not deduplicate by message id. The idempotent producer drops
// the duplicates of its own retries within one producer session (producer id and
// sequence numbers), so a lost acknowledgement that the client retries stores one copy.
// It cannot recognise a message the relay sends again after a Publish gave up, after a
// relay restart or from another relay: those are stored twice, and consumers drop them
// by the Outbox-Dedup-Key (or Outbox-Id) header.
//
// Publish produces the whole batch at once (no linger with Dial) and waits for every
// acknowledgement; franz-go puts the records of a partition into one record batch per
// request.
//
// # Errors
//
// Publish returns, per message, either an outage (outbox.IsOutage reports true: the relay
// pauses and burns no attempt) or a rejection of that message on its merits (the relay
// counts an attempt and dead-letters the message after its attempt limit). Kafka's codes
// are matched with errors.Is against franz-go's kerr values.
//
// Rejections (returned as they are):
//
//	no destination        a route placeholder whose field is empty (outbox.ErrUnroutable);
//	                      not sent
//	invalid topic name    the route gives a name Kafka refuses: empty, "." or "..", over 249
//	                      characters, or characters other than ASCII letters, digits, '.',
//	                      '_' and '-' (kerr.InvalidTopicException); not sent
//	MESSAGE_TOO_LARGE     the record is larger than Config.MaxMessageBytes (franz-go refuses
//	                      it without sending it) or than the topic's max.message.bytes
//	RECORD_LIST_TOO_LARGE the record is larger than the topic's segment.bytes
//	INVALID_RECORD        the broker refuses the record: a null key on a compacted topic, ...
//	CORRUPT_MESSAGE       the same, from older brokers (and a checksum failure, see below)
//	INVALID_TOPIC_EXCEPTION
//	                      the broker refuses the topic name
//
// Kafka answers MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE, INVALID_RECORD and
// CORRUPT_MESSAGE for a whole record batch, and franz-go then fails every record it
// holds for the partition, the innocent with the guilty. Publish therefore sends each
// record that got one of them again, alone in its partition's batch, and reports only
// what that second try says: the records that fit are confirmed, the one that does not
// is rejected, and a batch corrupted in transit heals at once.
//
// Outages (wrapped with outbox.Outage):
//
//	connection            the broker is unreachable, the connection broke, TLS or SASL
//	                      failed (SASL_AUTHENTICATION_FAILED)
//	no answer in time     ctx done while a record was unacknowledged (the outcome is
//	                      unknown); kgo.ErrRecordTimeout (with Dial, a record still
//	                      unacknowledged a minute after it was produced), kgo.ErrRecordRetries
//	closed                the publisher or the client is closed (kgo.ErrClientClosed)
//	retriable codes       every code Kafka marks retriable and franz-go retried until the
//	                      ctx ran out: NOT_LEADER_OR_FOLLOWER (kerr.NotLeaderForPartition),
//	                      LEADER_NOT_AVAILABLE, NOT_ENOUGH_REPLICAS (fewer in-sync
//	                      replicas than min.insync.replicas), NOT_ENOUGH_REPLICAS_AFTER_APPEND,
//	                      REQUEST_TIMED_OUT, NETWORK_EXCEPTION, KAFKA_STORAGE_ERROR,
//	                      THROTTLING_QUOTA_EXCEEDED, ...
//	missing topic         UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID after franz-go's
//	                      retries: a *NoTopicError (errors.Is(err, ErrNoTopic)) naming it
//	permissions           TOPIC_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED (no
//	                      IDEMPOTENT_WRITE before Kafka 3.0),
//	                      TRANSACTIONAL_ID_AUTHORIZATION_FAILED
//	configuration         INVALID_REQUIRED_ACKS, UNSUPPORTED_COMPRESSION_TYPE (zstd on a
//	                      broker before 2.1), UNSUPPORTED_FOR_MESSAGE_FORMAT,
//	                      UNSUPPORTED_VERSION, POLICY_VIOLATION, INVALID_TIMESTAMP (the
//	                      relay's clock is off from the broker's by more than the topic's
//	                      message.timestamp.*.max.ms: records carry the produce time)
//	producer state        OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH,
//	                      UNKNOWN_PRODUCER_ID: franz-go resets the producer id and retries
//	anything else         UNKNOWN_SERVER_ERROR and every error this package does not know
//
// Problems that affect every message of a topic (a missing topic, a missing ACL, a
// misconfigured broker) are outages on purpose: dead-lettering the whole outbox because
// a topic was not created would be worse than pausing until someone creates it. The
// error text names the topic, so the relay's log says what to fix. A broker with
// auto.create.topics.enable creates a missing topic only for a client that asks for it:
// pass kgo.AllowAutoTopicCreation() to Dial to have it do so. Unrecognised errors are
// outages too: they cost a pause, never a message.
//
// franz-go never lets a record of a partition through ahead of an earlier record of the
// same partition that failed: when a record fails (its Publish's ctx ran out while it
// waited for a retry, its delivery timed out), every record buffered behind it in the
// partition fails with the same error, including those of later Publish calls. Those are
// outages too, and the relay sends them again after its pause.
//
// # Concurrency
//
// A Publisher is safe for concurrent use; the relay calls Publish from several
// goroutines, and they share the client's buffers and connections.
// Config.MaxBufferedRecords bounds the records awaiting an acknowledgement over all
// calls.
//
// # Consuming
//
// Consume runs an outbox.Handler for the records of a consumer group:
//
//	err := outboxkafka.Consume(ctx, []string{"kafka-1:9092"}, outboxkafka.ConsumerConfig{
//		Group:           "billing",
//		Topics:          []string{"events.orders"},
//		DeadLetterTopic: "billing.dead",
//	}, outbox.InboxHandler(inbox, inTx, work))
//
// It builds its own client from the seeds and options it is given, because a correct
// group consumer needs settings only a new client takes: manual commits
// (kgo.DisableAutoCommit), rebalances held back while polled records are handed out
// (kgo.BlockRebalanceOnPoll) and callbacks for revoked and lost partitions. It returns
// once ctx is done and the shutdown below is complete.
//
// Order. The records of a partition are handled one at a time, in offset order, by a
// goroutine of their own; partitions are handled in parallel (ConsumerConfig.Concurrency
// caps how many handlers run at once). Since the publisher sends the messages of a key
// to one partition, a key's messages are handled in the order they were written. Each
// partition queues up to ConsumerConfig.QueueSize fetched records; a full queue pauses
// the partition's fetching until it is half empty, so a partition held up by a record
// never holds up the others.
//
// Offsets. A record's offset is committed only after the handler returned nil for it,
// or it was dead-lettered: the group resumes after the last record handled, never after
// one that was only fetched. Commits run one at a time in the background, each covering
// every record handled since the one before, so they cost one request per round trip
// whatever the rate of records. A consumer that dies (a crash, a lost network) leaves
// the records it handled since its last acknowledged commit, and those in its
// handlers, to be delivered again to the next owner of their partitions: these are the
// only duplicates. outbox.InboxHandler turns them into exactly-once effects.
//
// Rebalances. When the group takes a partition away, the member stops starting new
// records of it, lets the handler call in progress finish (a retry wait is abandoned),
// commits what it handled and only then gives the partition up: the next owner starts
// after the last handled record, and a rebalance between live members delivers nothing
// twice (unless that commit fails). A member removed from the group (its session
// expired) cannot commit any more: its partitions resume at the last commit. A handler
// call that outlasts the group's rebalance timeout (kgo.RebalanceTimeout, 60 s by
// default) holds up the rebalance and gets the member removed: give handlers shorter
// timeouts.
//
// Retries. Kafka has no redelivery: a handler error is retried in place, which holds
// up the record's partition and so keeps its order. The next attempt comes after
// outbox.RetryDelay(err, ConsumerConfig.RetryDelay); Delivery.Attempt counts the
// attempts, from 1. After ConsumerConfig.MaxAttempts calls (5 by default; -1 for no
// limit), or at once for an outbox.Permanent error or a panic, the record is
// dead-lettered. The count lives in the consumer: a record whose partition moves, or
// whose consumer restarts, during its retries starts again at attempt 1.
//
// Dead letters. With ConsumerConfig.DeadLetterTopic set, a dead-lettered record is
// copied there (same key, value and headers, plus Outbox-Dead-Topic, -Partition,
// -Offset, -Group, -Reason and -Attempts) with acks=all, and its offset is committed
// only once Kafka acknowledged the copy. If the copy cannot be produced (an outage),
// it is tried again every RetryDelay, holding up the partition; a crash between the
// copy and the commit stores a second copy with the same Outbox-Dead-Topic, -Partition
// and -Offset. A copy Kafka refuses on its merits (larger than the topic's
// max.message.bytes, ...) is logged and the record skipped. ListDead reads the
// dead-letter topic and ReplayDead produces chosen dead letters back to their topics.
//
// Without a dead-letter topic, a dead-lettered record is logged at error level (with
// its topic, partition and offset) and skipped, as Spring Kafka and most Kafka
// consumers do by default: the record stays in its topic at its offset until retention
// deletes it, and can be read again from there. Stopping the partition instead would
// hold up every key of the partition behind one bad record; set MaxAttempts to -1 for
// that behaviour for retryable errors.
//
// Shutdown. When ctx is done, Consume stops polling and starts no new record or
// attempt, lets the handler calls in progress finish (handlers get a context that the
// shutdown does not cancel), commits, and leaves the group, so that its partitions move
// to the other members at once; the commit and the leave are bounded by
// ConsumerConfig.ShutdownTimeout. Records fetched but not started are left, uncommitted,
// to the next owner.
//
// Deliveries. The handler gets an outbox.Delivery (see NewDelivery) whose ID is the
// Outbox-Id header, else Outbox-Dedup-Key, else "topic/partition/offset"; whose Key is
// the record key; and whose context carries the record's traceparent header. Records
// that did not come through an outbox (no headers, repeated or binary headers, null
// keys or values) are handled like any other.
package outboxkafka
