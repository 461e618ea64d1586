// Package outbox is a transactional outbox for Go: it writes events in the application's
// own database transaction, and a relay publishes the committed ones to a broker.
//
// # Guarantees
//
//  1. Atomic write. A message exists if and only if the transaction that wrote it
//     committed; rolled-back and savepoint-rolled-back writes are never published.
//  2. At-least-once publish, confirmed. A message is marked published only after the
//     broker confirmed it durably. Nothing committed is lost across relay crashes,
//     broker outages or database restarts.
//  3. Stable identity. Every message carries its ID and dedup key to the broker
//     (Nats-Msg-Id, headers), so brokers and consumers drop duplicates. Duplicates
//     happen only around faults and are bounded by RelayConfig.MaxInFlight.
//  4. Per-key order. Messages with the same Key are published in the order they were
//     written, across retries and any number of relays. A failing message holds back
//     only its own key, until it succeeds or is dead-lettered.
//  5. Safe scale-out. Relays lease shards of the key space in database time with fenced
//     tokens: no two relays publish the same key at once, a paused relay's late writes
//     are refused, and a dead relay's shards are taken over within the lease TTL plus
//     one renewal interval.
//  6. Nothing stuck, nothing silent. Rejected messages are retried with exponential
//     backoff and jitter, then dead-lettered with their last error; a broker outage
//     pauses the relay without counting attempts.
//  7. Exactly-once effects for consumers that use the Inbox: the handler's effects and
//     the record that the message was processed commit in one transaction.
//
// docs/guarantees.md says how each is tested.
//
// # Quick start
//
// Write in your transaction (pgx shown; outboxsql does the same for *sql.Tx):
//
//	drv, _ := outboxpgx.New(pool, outboxpgx.Config{})
//	w, _ := outbox.NewWriter(drv, outbox.WriterConfig{})
//	tx, _ := pool.Begin(ctx)
//	// ... your business writes ...
//	err := w.Write(ctx, tx, outbox.Message{Topic: "orders", Key: orderID, EventType: "order.placed", Payload: body})
//	tx.Commit(ctx)
//
// Run a relay (or the `outbox relay` daemon):
//
//	pub, _ := outboxnats.Dial(ctx, "nats://127.0.0.1:4222", outboxnats.Config{Route: "events.{topic}"})
//	r, _ := outbox.NewRelay(drv, pub, outbox.RelayConfig{})
//	r.Start(ctx)
//	defer r.Stop(ctx)
//
// Consume with exactly-once effects (any runner: outboxnats, outboxamqp, outboxkafka):
//
//	inbox, _ := outbox.NewInbox[pgx.Tx](drv, outbox.InboxConfig{Consumer: "shipping"})
//	h := outbox.InboxHandler(inbox, inTx, func(ctx context.Context, tx pgx.Tx, d *outbox.Delivery) error {
//		return ship(ctx, tx, d) // in the same transaction as the inbox record
//	})
//
// Stores (outboxpgx, outboxsql, outboxsqlite, outboxmysql), brokers (outboxnats,
// outboxamqp, outboxkafka, outboxredis, outboxsqs, outboxwebhook) and plugins (outboxprom,
// outboxotel) live in their own packages. The interfaces a store implements, and the
// status and dead-letter types operators' tools read, are in outboxdriver; this package
// imports only it, outboxtype (whose names it declares as its own) and the standard
// library.
package outbox
