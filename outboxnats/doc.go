// Package outboxnats publishes outbox messages to NATS JetStream. Its Publisher
// implements outbox.Publisher and outbox.Pinger.
//
// # Quick start
//
//	pub, err := outboxnats.Dial(ctx, "nats://127.0.0.1:4222", outboxnats.Config{Route: "events.{topic}"})
//	if err != nil {
//		return err
//	}
//	defer pub.Close()
//	if err := pub.EnsureStream(ctx, "EVENTS", []string{"events.>"}); err != nil {
//		return err
//	}
//	relay, err := outbox.NewRelay(store, pub, outbox.RelayConfig{})
//
// A message with Topic "orders" goes to the subject "events.orders": Config.Route is a
// template over the topic, aggregate type, event type and key (outbox.ParseRoute), so
// "outbox.event.{aggregate_type}" gives Debezium's layout. Every message carries its own headers plus the Outbox-* headers
// of package outbox, Content-Type, and Nats-Msg-Id set to its dedup key. The payload
// travels byte for byte. Header values are trimmed of surrounding white space by the
// NATS wire format.
//
// # Guarantees
//
// A message counts as published only when JetStream returned a PubAck for it. A PubAck
// means the stream stored the message as durably as the stream is configured: with one
// replica on one server, a file-backed stream survives a process crash but survives a
// power loss only if the server runs with "sync_interval: always" (by default it syncs
// to disk every two minutes); a replicated stream acks once a quorum has it.
//
// Publish pipelines: it sends the whole batch without waiting, then waits for every
// PubAck. The batch travels in order on one connection, so a stream stores it in batch
// order unless a message is retried by the client (after a no-responders blip). A publish whose
// outcome is unknown (timeout, connection lost before the PubAck) is reported as an
// outage and retried later; the retry carries the same Nats-Msg-Id, so JetStream drops
// it if the first copy was stored within the stream's duplicate window (Duplicates in
// the stream configuration, 2 minutes by default). Broker-side deduplication is bounded
// by that window: a retry after a longer outage can store a second copy, which consumers
// drop by the Outbox-Id header.
//
// # Errors
//
// Publish returns, per message, either an outage (outbox.IsUnavailable reports true: the
// relay burns no attempt) or a rejection of that message on its merits (the relay counts
// an attempt and dead-letters the message after its attempt limit).
//
// Outages of the server (wrapped with outbox.Outage: the relay pauses):
//
//   - the connection is closed, draining or reconnecting, or broke before the PubAck
//     came (nats.ErrConnectionClosed, nats.ErrDisconnected, ...);
//   - ctx is done, nats.ErrTimeout, an ack timeout: the outcome is unknown;
//   - storage full and resource limits, that is, backpressure: JetStream API errors
//     10023 insufficient resources, 10028 and 10047 memory or storage exhausted, 10077
//     store failed (a stream at its limits with discard new), 10002 account limits,
//     10167 too many requests, 10158 the same Nats-Msg-Id is being processed;
//   - JetStream not enabled (10076, 10039), a sealed stream (10109), a stream offline or
//     without leader: every API error with a 5xx code;
//   - too many async publishes pending on the connection (jetstream.ErrTooManyStalledMsgs);
//   - any error this package does not recognise.
//
// Rejections (returned as they are):
//
//   - the message, headers included, is larger than the server's max_payload
//     (nats.ErrMaxPayload; checked before sending, so it is not sent; wrapped with
//     outbox.Permanent, so the relay dead-letters it at once);
//   - the subject is invalid: empty, with white space, an empty token ("a..b") or a
//     wildcard token ("*", ">"), or reserved: a first token starting with "$" (the
//     server's APIs: $JS.API, where a publish can delete or purge a stream, $SYS, $KV,
//     $O, ...) or "_INBOX" or "_R_" (replies) (nats.ErrBadSubject; not sent; wrapped with
//     outbox.Permanent);
//   - an answer that is not a PubAck (jetstream.ErrInvalidJSAck): the subject is served
//     by something other than a stream;
//   - a header name NATS refuses (nats.ErrBadHeaderMsg);
//   - every other JetStream API error, which concerns the message itself (4xx codes):
//     10054 larger than the stream's max_msg_size, 10097 headers over 64 KiB, 10071 and
//     10164 wrong last sequence or 10070 wrong last msg id (when the message carries
//     Nats-Expected-* headers), 10060 expected stream mismatch, 10165 invalid TTL, ...
//
// An outage of one subject (outbox.DestinationOutage): no stream captures it (no
// responders), reported as a *NoStreamError (errors.Is(err, ErrNoStream)) naming the
// subject. The relay holds back that subject's messages, with a growing delay, and goes
// on with the others, until someone creates a stream for it.
//
// Configuration problems that affect every message (a sealed stream) are outages on
// purpose: dead-lettering the whole outbox because a stream is unusable would be worse
// than pausing until someone fixes it. The error text names the subject, so
// the relay's log says what to fix. Unrecognised errors are outages too: they cost a
// pause, never a message.
//
// # Concurrency
//
// A Publisher is safe for concurrent use; the relay calls Publish from several
// goroutines. Config.MaxPending bounds the messages awaiting a PubAck over all calls.
package outboxnats
