// Package outboxsns publishes outbox messages to Amazon SNS topics, standard and FIFO.
// Its Publisher implements outbox.Publisher and outbox.Pinger.
//
// # Quick start
//
//	pub, err := outboxsns.Dial(ctx, "sns://?region=eu-west-1", outboxsns.Config{Route: "orders-events.fifo"})
//	if err != nil {
//		return err
//	}
//	defer pub.Close()
//	relay, err := outbox.NewRelay(store, pub, outbox.RelayConfig{})
//
// Config.Route maps a message to its topic (outbox.ParseRoute): a topic name ("{topic}",
// the default), found with ListTopics once and cached, or a topic ARN
// ("arn:aws:sns:eu-west-1:123456789012:{topic}"), whose placeholders may fill only the
// name: a message never chooses the account or the region. Topics are not created:
// create them (FIFO or not, with their subscriptions) before the relay runs. A missing
// topic is an outage of that topic alone (ErrNoTopic), never a reason to dead-letter.
//
// # On the wire
//
// Messages are laid out as outboxsqs lays them out (see its documentation): the payload
// is the message when it is text SNS and SQS accept, base64 otherwise (attribute
// Outbox-Body-Encoding), and the headers are at most ten String attributes (the Outbox-*
// metadata and Content-Type each, the rest as JSON in Outbox-Headers). A subscription
// with raw message delivery hands SQS consumers exactly what outboxsqs sends, and
// outboxsqs.Decode reads it back; a subscription without it wraps the message in SNS's
// JSON envelope, whose MessageAttributes carry the same attributes.
//
// On a FIFO topic (its name ends in ".fifo") the message also carries
// MessageGroupId = the key (its id when it has none) and MessageDeduplicationId = the
// dedup key, replaced by their hex SHA-256 where SNS's rules refuse them, as on SQS: SNS
// keeps a group's order and drops resends within 5 minutes. A standard topic keeps no
// order and does not deduplicate: consumers dedupe by the Outbox-Id attribute.
//
// # Confirmed, outage, rejection
//
// A nil error for a message means PublishBatch listed it as successful. Calls carry up
// to 10 messages and Config.MaxMessageBytes, several at once (Config.MaxInflight). An
// entry SNS fails as the sender's fault is a rejection; one it fails on its own side,
// throttling, KMS and credential problems, network failures, a cancelled context and a
// missing topic are outages. When SNS refuses a whole call for its contents, the
// messages are sent again one by one, so that only the guilty one is rejected. A message
// over Config.MaxMessageBytes is rejected before it is sent (ErrTooLarge).
package outboxsns
