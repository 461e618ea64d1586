// Package outboxpubsub publishes outbox messages to Google Cloud Pub/Sub topics, through
// the official client (cloud.google.com/go/pubsub/v2). Its Publisher implements
// outbox.Publisher and outbox.Pinger.
//
// # Quick start
//
//	pub, err := outboxpubsub.Dial(ctx, "pubsub://my-project", outboxpubsub.Config{Route: "orders-events"})
//	if err != nil {
//		return err
//	}
//	defer pub.Close()
//	relay, err := outbox.NewRelay(store, pub, outbox.RelayConfig{})
//
// New takes a *pubsub.Client of your own instead. Config.Route maps a message to its
// topic (outbox.ParseRoute): the default "{topic}" sends a message with Topic "orders"
// to the topic "orders" of the client's project; a template may also give full names
// ("projects/other-project/topics/{topic}"). Topics are not created: create them before
// the relay runs. A topic that does not exist is an outage of that destination
// (ErrNoTopic), never a reason to dead-letter its messages.
//
// # Order
//
// A message's key is its ordering key (its SHA-256 in hex when over 1,024 bytes): a
// subscription with message ordering enabled receives a key's messages in the order the
// outbox wrote them, as the relay publishes them one at a time per key. Pub/Sub keeps
// that order within a region: publish through a regional endpoint
// (option.WithEndpoint("europe-west1-pubsub.googleapis.com:443")) when the subscribers
// need it strictly. When a publish on a key fails, the client pauses the key and fails
// its later messages until it is told to resume; Publish resumes the key once none of
// its messages is left in flight, so the relay's next attempt, which starts again from
// the failed message, goes out in order. Config.Unordered sends no ordering keys.
//
// # On the wire
//
// The payload is the message's data, byte for byte. The headers are attributes: the
// message's own and the metadata of outbox.Message.WireHeaders (Outbox-Id,
// Outbox-Dedup-Key, Outbox-Key, Outbox-Aggregate-Type, Outbox-Event-Type, Outbox-Topic,
// Outbox-Created-At, Content-Type). Decode reads them back. Pub/Sub has no
// deduplication on publish: consumers deduplicate by Outbox-Id (or Outbox-Dedup-Key),
// as the outbox's inbox does.
//
// # Confirmed, outage, rejection
//
// A nil error for a message means the server returned its message id: it is stored. A
// message over Pub/Sub's limits (10 MB with its attributes; 100 attributes; attribute
// names of 256 bytes, values of 1,024; names starting with "goog") is rejected before it
// is sent (ErrInvalid), as is one the server refuses as invalid (InvalidArgument): the
// relay retries and then dead-letters it. Everything else is an outage, which the relay
// retries without counting an attempt: the server unreachable or not answering within
// Config.Timeout (the client retries meanwhile), a cancelled context, missing
// permissions, quota exhausted, a topic that does not exist (an outage of that topic
// alone, outbox.DestinationOutage), and a message of a paused key.
package outboxpubsub

import "cloud.google.com/go/pubsub/v2"

// Decode returns a received message's payload and the headers it was published with
// (outbox.Message.WireHeaders): the data and the attributes. It is what a consumer
// reads; the Outbox-* attributes carry the outbox's metadata.
func Decode(m *pubsub.Message) (payload []byte, headers map[string]string) {
	headers = make(map[string]string, len(m.Attributes))
	for k, v := range m.Attributes {
		headers[k] = v
	}
	return m.Data, headers
}
