// Package outboxwebhook publishes outbox messages as signed HTTP webhooks, with the
// standard library's net/http only. Its Publisher implements outbox.Publisher and
// outbox.Pinger; Verify and VerifyHandler check the signatures on the receiving side.
//
// # Quick start
//
//	pub, err := outboxwebhook.Dial(ctx, "https://hooks.example.com/outbox", outboxwebhook.Config{
//		Secrets: [][]byte{secret}, // 32 random bytes, shared with the receiver
//	})
//	if err != nil {
//		return err
//	}
//	defer pub.Close()
//	relay, err := outbox.NewRelay(store, pub, outbox.RelayConfig{})
//
// and on the receiving side:
//
//	http.Handle("/outbox/", http.MaxBytesHandler(
//		outboxwebhook.VerifyHandler([][]byte{secret}, 0, handler), 4<<20))
//
// # The request
//
// Each message is one POST to the URL its route gives (Config.Route, "{topic}" by
// default, appended to Config.URL: a message with topic "orders" goes to
// https://hooks.example.com/outbox/orders). The body is the payload byte for byte. The
// headers are the message's own headers, the Outbox-* headers of package outbox
// (Outbox-Id, Outbox-Dedup-Key, Outbox-Key, Outbox-Event-Type, ..., W3C traceparent when
// the message has one) and Content-Type, plus:
//
//	Idempotency-Key:  the message's dedup key (outbox.Message.DedupID)
//	Outbox-Signature: t=<unix seconds>,v2=<hex HMAC-SHA256>[,v2=<...>]
//
// Each v2 value is the HMAC-SHA256, with one of Config.Secrets, of the timestamp, the
// method, the request target (path and query as sent), the Outbox-Id, the
// Idempotency-Key and the body, each but the body followed by a line feed (see Sign for
// the exact rule and why). A request captured on the way can therefore be replayed only
// to the same endpoint, within the tolerance, under the same Outbox-Id: a receiver that
// records the ids it processed (outbox.Inbox) drops it. A receiver checks it with Verify or VerifyHandler, or in any language: recompute
// the HMAC with each of its secrets, compare in constant time, and refuse timestamps more
// than a few minutes from its clock. Header names travel in canonical form (traceparent
// arrives as Traceparent: HTTP header names are case-insensitive), and values are trimmed
// of surrounding white space, as HTTP does.
//
// # Guarantees
//
// A message counts as published only when the receiver answered its POST with a 2xx
// status. A receiver must therefore answer 2xx only once it has stored the event durably
// (or applied it): a 202 that queues the event in memory loses it if the receiver
// crashes. Delivery is at least once: a request whose answer was lost (a timeout, a
// broken connection) is sent again with the same Idempotency-Key and Outbox-Id, and
// receivers drop the copies they already have by that key, as the IETF Idempotency-Key
// draft describes. net/http itself may resend a request once, on a fresh connection, when
// a reused connection broke before the answer: it does so for requests carrying an
// Idempotency-Key, which is exactly the duplicate that the key makes harmless.
//
// The messages of a batch are sent concurrently (Config.MaxConcurrency requests in flight
// over all calls), over kept-alive connections. The relay gives a batch at most one
// message per key and sends a key's next message only after the last was confirmed, so
// each key's messages reach the receiver in order.
//
// # Errors
//
// Publish returns, per message, either an outage (outbox.IsUnavailable reports true: the
// relay burns no attempt) or a rejection of that message on its merits (the relay counts
// an attempt and dead-letters the message after its attempt limit). An outage of the
// receiver is an outage of its host only (outbox.DestinationOutage, the destination
// "scheme://host"): the relay holds back the messages to that host, with a growing delay,
// and goes on with the other hosts. A closed Publisher and a cancelled Publish are
// outages of the whole relay (outbox.Outage). Answers other
// than 2xx come as a *StatusError holding the status, the redacted URL and the start of
// the answer's body (1 KiB at most), so the relay's log and the dead-letter record say
// what the receiver objected to.
//
// Outages:
//
//   - no answer: connection refused or reset, DNS failure, a TLS handshake failure (an
//     unknown certificate authority included), a request over Config.Timeout, ctx done,
//     the Publisher closed (ErrClosed);
//   - 5xx: the receiver is in trouble;
//   - 408 Request Timeout, 425 Too Early and 429 Too Many Requests: the receiver asks to
//     come back later. A Retry-After header on an outage answer (a 429, a 503; seconds
//     or an HTTP date, at most 5 minutes honoured) holds back every request to that host,
//     and Ping, until it has passed;
//   - 409 Conflict: with idempotency keys it means "a request with this key is being
//     processed": the outcome is unknown, not refused. A receiver that refuses a message
//     answers 422;
//   - 401 Unauthorized and 403 Forbidden: the receiver refuses the publisher, not the
//     message (wrong secrets, a rotation done in the wrong order, clocks out of step,
//     revoked credentials). Every message would fail alike: pausing until the
//     configuration is fixed loses nothing, while rejections would dead-letter the whole
//     outbox. VerifyHandler answers a bad signature with 401 for this reason;
//   - 3xx: redirects are never followed (a 301, 302 or 303 would turn the POST into a GET
//     without its body, and following would send signed events to an address nobody
//     configured). A redirect means the endpoint moved, which concerns every message; the
//     error names the new Location, so the fix is to update the URL;
//   - any status this list does not name (1xx).
//
// Rejections (returned as they are):
//
//   - every other 4xx: 400 Bad Request, 404 Not Found, 410 Gone, 413 Content Too Large,
//     415 Unsupported Media Type, 422 Unprocessable Content, ...;
//   - a message the route cannot map (*outbox.RouteError), or whose destination is not a
//     URL (a path with a "." or ".." segment, a full URL without a host);
//   - a message header that HTTP cannot carry (a name that is not a token, a control
//     character in a value, a connection header such as Host or Transfer-Encoding). It is
//     not sent.
//
// Credentials never appear in errors: the user information of URLs is replaced, their
// query too (it often holds a token), and the secrets are used for signing only.
//
// # Concurrency
//
// A Publisher is safe for concurrent use; the relay calls Publish from several
// goroutines. Verify and VerifyHandler are safe for concurrent use too.
package outboxwebhook
