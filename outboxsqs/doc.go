// Package outboxsqs publishes outbox messages to Amazon SQS queues, standard and FIFO.
// Its Publisher implements outbox.Publisher and outbox.Pinger.
//
// # Quick start
//
//	pub, err := outboxsqs.Dial(ctx, "sqs://?region=eu-west-1", outboxsqs.Config{Route: "orders-events.fifo"})
//	if err != nil {
//		return err
//	}
//	defer pub.Close()
//	relay, err := outbox.NewRelay(store, pub, outbox.RelayConfig{})
//
// New takes an *sqs.Client of your own instead; give it BufferRequests, which works
// around an SDK race that otherwise drops connections under load. Publisher.Client
// returns the client Dial made, for receiving or creating queues with the same settings.
//
// Config.Route maps a message to its queue (outbox.ParseRoute): the default "{topic}"
// sends a message with Topic "orders" to the queue named "orders"; a template without
// placeholders sends everything to one queue; a template may also give a queue URL
// ("https://sqs.eu-west-1.amazonaws.com/123456789012/{topic}"). Queue names are
// resolved to URLs with GetQueueUrl once and cached. Queues are not created: create them
// (with the attributes you want: FIFO, encryption, redrive policy) before the relay runs.
// A route whose fixed text cannot form an SQS queue name ("events.{topic}": dots are
// allowed only in the ".fifo" suffix) fails New and Dial with an *outbox.ConfigError.
//
// # On the wire
//
// The payload is the message body, as it is when it is non-empty UTF-8 text made only
// of the characters SQS accepts (#x9, #xA, #xD, #x20 to #xD7FF, #xE000 to #xFFFD,
// #x10000 to #x10FFFF): JSON and other text payloads arrive as they were written. Any
// other payload travels in standard base64 with padding and the message attribute
// Outbox-Body-Encoding = "base64". An empty payload, which SQS cannot carry (a body has
// at least one character), is the body "-" with Outbox-Body-Encoding = "empty". The
// content type does not decide: a text payload labelled application/octet-stream is
// sent as text. Consumers call Decode, or check Outbox-Body-Encoding themselves.
//
// SQS allows ten message attributes per message, so headers are laid out in at most ten
// String attributes:
//
//   - Outbox-Id, Outbox-Dedup-Key, Outbox-Key, Outbox-Aggregate-Type,
//     Outbox-Event-Type, Outbox-Topic, Outbox-Created-At and Content-Type, each an
//     attribute of its own when set (so SNS filter policies and Lambda event filters
//     can use them);
//   - Outbox-Headers: every other header (the message's own headers, traceparent, ...)
//     as one JSON object of strings, present only when there is one; a header of the
//     list above whose value is empty or holds a character SQS refuses goes here too;
//   - Outbox-Body-Encoding, as above.
//
// Decode reverses the layout into the headers of outbox.Message.WireHeaders. Receive with
// MessageAttributeNames ["All"]. Attributes count towards the message size, as SQS counts
// it: body plus every attribute's name, type and value.
//
// On a FIFO queue (its name ends in ".fifo") the message also carries
// MessageDeduplicationId = the dedup key and MessageGroupId = the key. SQS limits both to
// 128 characters of ASCII letters, digits and punctuation; a dedup key or key that does
// not fit is replaced by its lowercase hex SHA-256 (64 characters), and a message without
// a key gets its id as its group, since it is ordered with respect to no other message.
// Outbox-Dedup-Key and Outbox-Key always carry the originals. On a standard queue there
// is no native dedup field or group: consumers deduplicate by the Outbox-Id attribute.
//
// # Guarantees
//
// A message counts as published only when SendMessageBatch listed it as Successful: SQS
// then stored it redundantly before answering. A FIFO queue also answers Successful for a
// message it dropped as a duplicate of one sent within the last five minutes.
//
// Publish groups a batch by queue and sends each queue's messages in SendMessageBatch
// calls of up to 10 entries and Config.MaxMessageBytes in total, all calls at once (at
// most Config.MaxInflight over all Publish calls). A call whose outcome is unknown
// (timeout, connection lost, ctx done) is an outage: the relay sends its messages again,
// and the SDK's retryer may already have sent them again within the call. On a FIFO queue
// the retry carries the same MessageDeduplicationId, so SQS drops it within the
// five-minute deduplication interval; on a standard queue, and after a longer outage,
// the copy is delivered, and consumers drop it by Outbox-Id.
//
// Per-key order holds on FIFO queues only: messages of one key share a message group,
// and the relay sends the next message of a key only after the previous one was
// confirmed. A standard queue delivers in no particular order, whatever the publisher
// does. Use a FIFO queue when consumers need the order.
//
// # Errors
//
// Publish returns, per message, either an outage (outbox.IsUnavailable reports true: the
// relay burns no attempt) or a rejection of that message on its merits (the relay counts
// an attempt and dead-letters the message after its attempt limit).
//
// An outage of one queue (outbox.DestinationOutage: the relay holds back that queue's
// messages, with a growing delay, and goes on with the others):
//
//   - the queue does not exist (QueueDoesNotExist, AWS.SimpleQueueService.NonExistentQueue),
//     reported as a *NoQueueError (errors.Is(err, ErrNoQueue)) naming the queue.
//
// Outages of the whole service (wrapped with outbox.Outage: the relay pauses):
//
//   - network errors, timeouts, ctx done, a closed Publisher (ErrClosed): the outcome is
//     unknown;
//   - throttling (RequestThrottled, ThrottlingException, OverLimit, KmsThrottled),
//     service errors (InternalError, ServiceUnavailable, any 5xx);
//   - credentials and permissions (AccessDenied, InvalidClientTokenId,
//     SignatureDoesNotMatch, ExpiredToken, ...) and the queue's KMS key (KmsAccessDenied,
//     KmsDisabled, KmsNotFound, KmsInvalidState, ...): they fail every message alike;
//   - a SendMessageBatch entry that failed with SenderFault = false (*EntryError);
//   - any error this package does not recognise.
//
// Rejections (returned as they are):
//
//   - the message is larger than Config.MaxMessageBytes (ErrTooLarge; not sent);
//   - the route gives an invalid queue name or URL (ErrInvalidQueue; not sent), or a
//     placeholder's field is empty (*outbox.RouteError);
//   - a SendMessageBatch entry that failed with SenderFault = true (*EntryError):
//     InvalidMessageContents, InvalidParameterValue (such as a message over the queue's
//     MaximumMessageSize), MissingParameter, ...; unless its code is one of the outage
//     codes above;
//   - a call refused as a whole for InvalidMessageContents, InvalidParameterValue,
//     MissingParameter, InvalidAttributeName, InvalidAttributeValue or
//     BatchRequestTooLong: Publish then sends the call's messages one by one, so that
//     only the guilty one is rejected.
//
// Configuration problems that affect every message (no queue, no permission, a disabled
// key) are outages on purpose: dead-lettering the whole outbox because a queue is
// missing would be worse than pausing until someone creates it. The error text names the
// queue, so the relay's log says what to fix. Unrecognised errors are outages too: they
// cost a pause, never a message.
//
// # Testing
//
// This package's tests run against fauxqs, an SQS emulator (see internal/testinfra/testsqs), not
// against AWS. They show that the publisher speaks the SQS API as fauxqs implements it:
// batching, FIFO groups and deduplication, attributes, per-entry failures, outages cut
// by a proxy. They do not show that AWS behaves the same: its real limits and
// throttling, IAM and KMS errors, the exact codes it returns, that it accepts the
// characters from #x10000 up in a body (fauxqs 1.9 refuses them, so no test sends
// them), its redelivery behaviour and its latency are not tested here.
//
// # Concurrency
//
// A Publisher is safe for concurrent use; the relay calls Publish from several
// goroutines.
package outboxsqs
