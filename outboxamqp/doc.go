// Package outboxamqp publishes outbox messages to RabbitMQ (AMQP 0-9-1, with
// github.com/rabbitmq/amqp091-go) with publisher confirms. Its Publisher implements
// outbox.Publisher and outbox.Pinger; its Topology declares exchanges, queues and
// bindings. Consume runs handlers over a queue, with retries and dead letters (see
// Consuming), and ListDead and ReplayDead operate its dead-letter queue.
//
// # Quick start
//
//	pub, err := outboxamqp.Dial(ctx, "amqp://user:pass@rabbit:5672/", outboxamqp.Config{
//		Exchange: "events.topic",
//		Route:    "{aggregate_type}.{event_type}",
//	})
//	if err != nil {
//		return err
//	}
//	defer pub.Close()
//	relay, err := outbox.NewRelay(store, pub, outbox.RelayConfig{})
//
// A message goes to Config.Exchange ("" is the default exchange, which delivers to the
// queue named by the routing key) with the routing key that Config.Route makes of it
// ("{topic}" by default). The exchanges and queues must exist: declare them with
// Topology, Publisher.Declare, or `outbox rabbitmq declare -f topology.yaml`
// (deploy/rabbitmq/topology.yaml is an example with critical and background queues, an
// alternate exchange and a dead-letter exchange).
//
// On the wire every message is persistent (delivery mode 2) and published mandatory. Its
// body is the payload byte for byte; message_id is its dedup key (Message.DedupID);
// content_type, type (the event type) and timestamp (the creation time, in seconds) are
// set when the message has them; priority comes from Config.Priority or the message's
// Outbox-Priority header (HeaderPriority); the headers table holds the message's own
// headers plus the Outbox-* headers of package outbox and Content-Type, all as strings,
// W3C traceparent included. RabbitMQ does not deduplicate: consumers do, by message_id
// or the Outbox-Id header.
//
// # Guarantees
//
// A message counts as published only when RabbitMQ acked it (basic.ack in confirm mode)
// and did not return it. For a persistent message, RabbitMQ acks once every queue it was
// routed to has it: a durable classic queue once it is written to disk, a quorum queue
// once a majority of its replicas has it. A message routed to no queue but taken by the
// exchange's alternate exchange is routed, so it is acked and counts as published: it is
// wherever the alternate exchange put it (a parking queue to alert on).
//
// RabbitMQ acks an unroutable mandatory message too, right after returning it
// (basic.return, reply 312 NO_ROUTE). The return comes first on the same channel, and
// the publisher looks at everything returned before it looks at an ack, matching returns
// to messages by message_id: an unroutable message is never reported as published. When
// two messages in flight on a channel share a message_id, a return marks both unroutable:
// the one that did arrive is then published again, a duplicate, never a loss.
//
// Publish pipelines: it sends the whole batch on one channel without waiting, then waits
// for all the confirms. Each concurrent Publish call has a channel of its own (a channel
// carries one sequence of delivery tags), up to Config.MaxChannels. The messages of a
// batch reach each queue in batch order.
//
// # Errors
//
// Publish returns, per message, either an outage (outbox.IsOutage reports true: the
// relay pauses and burns no attempt) or a rejection of that message on its merits (the
// relay counts an attempt and dead-letters the message after its attempt limit).
//
// Outages (wrapped with outbox.Outage):
//
//   - the connection is lost, reconnecting, or was closed; the channel closed before the
//     message's confirm came, whatever the reason (an *amqp.Error from the broker: 320
//     CONNECTION_FORCED, 404 NOT_FOUND for a missing exchange, 403 ACCESS_REFUSED without
//     write permission, 406 PRECONDITION_FAILED for a body over the server's
//     max_message_size, 541 INTERNAL_ERROR, 501 FRAME_ERROR, ...): a channel exception
//     ends every message in flight on the channel, whose outcome is then unknown;
//   - a nack (basic.nack, a *NackError): a queue at its max-length with x-overflow
//     reject-publish, or a queue that cannot take messages now (a quorum queue without a
//     leader): backpressure;
//   - the broker blocks publishers (connection.blocked: a memory or disk alarm);
//   - ctx is done, or the publisher was closed, before the confirm came;
//   - any error this package does not recognise.
//
// Rejections (returned as they are):
//
//   - returned as unroutable (a *ReturnError; errors.Is(err, outbox.ErrUnroutable)): no
//     queue is bound to the exchange with a matching key and it has no alternate exchange;
//   - the route has no value for the message (an *outbox.RouteError, ErrUnroutable too);
//   - the body is over Config.MaxMessageSize, or the properties and headers do not fit
//     one frame (ErrTooLarge);
//   - a routing key, message_id, content type, event type or header name over 255 bytes,
//     or an Outbox-Priority header that is not a number from 0 to 255 (ErrBadProperty).
//
// The last three are checked before sending: RabbitMQ would answer them by closing the
// channel or the connection, an outage for every message in flight, forever.
//
// Unroutable is a rejection, not an outage, because routing is decided per message: its
// routing key comes from its own fields, and one event type that nobody binds must not
// stop the rest of the outbox. As a rejection it holds back only its key, is retried with
// backoff, and ends in the outbox's dead-letter store with the broker's reason, from
// where it can be replayed once a queue binds it. A missing binding for everything (a
// topology never declared) therefore dead-letters messages after the attempt limit:
// declare the topology before starting the relay, or give the exchange an alternate
// exchange, which parks unroutable messages in a queue of yours instead (they are then
// published, as far as the outbox is concerned). A missing exchange is different: it is a
// channel exception that fails every message in flight, and so an outage, which pauses
// the relay until the exchange exists; Ping checks the exchange.
//
// # Connections
//
// Dial owns its connection (heartbeats every 10 s) and dials again whenever it breaks,
// with exponential backoff; Publish fails at once as an outage meanwhile. New publishes on
// a connection of the caller's and never reconnects it. Neither works with amqp091-go's
// automatic recovery, which restarts delivery tags behind the publisher's back. A socket
// write cannot be interrupted by ctx: a Publish writing to a broker that stopped reading
// (blocked by an alarm after the batch started) waits until the broker reads again or the
// connection fails its heartbeats.
//
// # Consuming
//
// Consume runs an outbox.Handler over a work queue with manual acks; DialConsume does the
// same on a connection of its own that it re-dials when it breaks. A message is acked
// only after the handler returned nil for it, so delivery is at least once: wrap the
// handler with outbox.InboxHandler for exactly-once effects in the consumer's database.
//
//	err := outboxamqp.DialConsume(ctx, "amqp://user:pass@rabbit:5672/", outboxamqp.ConsumerConfig{
//		Queue:       outboxamqp.Queue{Name: "billing.high", Type: "quorum"},
//		MaxAttempts: 5,
//		RetryDelay:  5 * time.Second,
//		Concurrency: 8,
//	}, outbox.InboxHandler(inbox, inTx, work))
//
// Retries. Requeueing a failed message (basic.nack with requeue) puts it back at the
// head of the queue at once, a hot loop, and RabbitMQ counts nothing: no limit can be
// read from it. Consume instead rejects it without requeue, and the work queue's
// dead-letter exchange (the default exchange, with x-dead-letter-routing-key
// "<queue>.retry") moves it to a retry queue, whose x-message-ttl (RetryDelay) expires it
// back into the work queue (its own dead-letter exchange, again the default one with the
// work queue's name as routing key). Each pass is a dead-lettering inside the broker, so
// RabbitMQ itself counts the rejections in the x-death header, on every version:
// Delivery.Attempt is one plus the counts of the x-death entries of the work queue with
// reason "rejected" (or "delivery_limit", a quorum queue's). Nothing relies on a client
// republishing x-death, which RabbitMQ 3.13 and later no longer interpret. The delay is
// the retry queue's, the same for every retry: RabbitMQ cannot delay one rejected message
// differently, so the delay outbox.Retry asks for is not honoured.
//
// Dead letters. At attempt MaxAttempts, or at once for an outbox.Permanent error or a
// panic, Consume publishes a copy of the message to the dead-letter (parking) queue,
// "<queue>.dead" by default, with publisher confirms and the headers Outbox-Dead-Reason
// (the handler's error), Outbox-Dead-Queue, Outbox-Dead-Attempts, Outbox-Dead-At,
// Outbox-Dead-Exchange and Outbox-Dead-Routing-Key (where it was first published), and
// acks the original only once the copy is confirmed: a crash in between leaves two
// copies, never none. It cannot reject it to the dead-letter queue instead, as the
// queue's only dead-letter exchange leads to the retry queue. When the copy fails, the
// message is rejected to the retry queue and dead-lettered again after RetryDelay. One
// log line goes out per retry and per dead letter, with event_id, aggregate_id,
// event_type, attempt and err.
//
// Topology. A reject drops the message when the queue has no dead-letter exchange, and
// AMQP cannot read a queue's arguments. So Consume declares the work queue with the
// settings of ConsumerConfig.Queue plus its dead-letter arguments, and the retry queue:
// a queue that exists with other settings (no dead-letter exchange, another TTL) makes
// Consume fail before it takes a message, naming the queue. ConsumerConfig.Topology
// returns the three queues for a deploy-time declaration (`outbox rabbitmq declare`);
// with NoDeclare, for a user without the configure permission, Consume only checks that
// they exist. The parking queue is declared if missing and otherwise left alone, so
// several work queues may share one. A quorum work queue gets quorum retry and parking
// queues, the retry queue with at-least-once dead-lettering; give the work queue
// x-dead-letter-strategy at-least-once and x-overflow reject-publish too, or a node
// failure during a dead-lettering may lose the message (classic queues dead-letter at
// most once). A work queue with x-message-ttl or x-max-length loses what it expires or
// overflows: it passes through the retry queue, where RabbitMQ's cycle detection drops it
// (a cycle without a rejection).
//
// Prefetch and order. Prefetch (basic.qos, 32 by default) bounds the messages delivered
// and not yet acked; Concurrency handlers run at once. Messages with the same Outbox-Key
// are handled one at a time in delivery order, so one Consume handles a key's messages in
// queue order, except that a retried message comes back after RetryDelay, behind the
// key's later messages, and a message redelivered after a lost connection may repeat one
// already handled (the inbox skips it). A message without a key is ordered with no other:
// it waits only for a free handler. Several consumers of one queue each get part of every
// key: for per-key order across processes, give the queue x-single-active-consumer, or
// shard keys over queues with the consistent-hash exchange.
//
// Shutdown. When ctx is done, Consume cancels its subscription (basic.cancel), lets the
// handlers in progress finish (their context is not cancelled) and ack, and closes its
// channel, which returns every message delivered and not acked, the prefetched ones no
// handler started included, to the queue. Nothing is acked that was not handled.
//
// Connections. Consume returns an error when its channel or connection closes; DialConsume
// re-dials with backoff and goes on. RabbitMQ returns the messages unacked at that moment
// to the queue and delivers them again, marked redelivered; that is no attempt (x-death
// does not change). A message that kills the process every time is therefore delivered
// forever from a classic queue; a quorum queue's delivery limit (x-delivery-limit, 20 by
// default on RabbitMQ 4) dead-letters it to the retry queue, which counts as an attempt.
//
// Malformed input never stops Consume: header values of any AMQP type become strings
// (tables and arrays are left out; see HeaderStrings), a malformed x-death counts as no
// attempt, and a message without an Outbox-Id header is identified by
// outbox.DeliveryID: the Outbox-Dedup-Key header, the AMQP message_id, else a hash of the
// queue and body.
//
// Dead-letter tooling. ListDead reads a dead-letter queue without consuming it (it takes
// messages unacked with basic.get and returns them all by closing its channel, so each
// goes back to its place, marked redelivered). It shows Consume's headers, or for
// messages RabbitMQ dead-lettered itself, the x-death reasons. ReplayDead moves them,
// oldest first and in batches of 100, to the exchange and routing key they were first
// published with (or, ReplayOptions.ToQueue, to the queue they died in), with publisher
// confirms before each parked copy is acked, and without the x-death and Outbox-Dead-*
// headers, so attempts start afresh; a dry run changes nothing. The CLI has both:
// `outbox rabbitmq dead list` and `outbox rabbitmq dead replay`.
//
// # Concurrency
//
// A Publisher is safe for concurrent use; the relay calls Publish from several
// goroutines. Close is idempotent and safe concurrently with Publish. Consume, DialConsume,
// ListDead and ReplayDead may run concurrently, on one connection or several.
package outboxamqp
