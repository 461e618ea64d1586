// Package outboxkinesis publishes outbox messages to Amazon Kinesis Data Streams. Its
// Publisher implements outbox.Publisher and outbox.Pinger.
//
// # Quick start
//
//	pub, err := outboxkinesis.Dial(ctx, "kinesis://?region=eu-west-1", outboxkinesis.Config{Route: "orders-events"})
//	if err != nil {
//		return err
//	}
//	defer pub.Close()
//	relay, err := outbox.NewRelay(store, pub, outbox.RelayConfig{})
//
// Config.Route maps a message to its stream by name (outbox.ParseRoute; "{topic}" by
// default). Streams are not created: create them before the relay runs. A missing stream
// is an outage of that stream alone (ErrNoStream), never a reason to dead-letter.
//
// # Order
//
// A message's key is its record's partition key (its id when it has none, its hex
// SHA-256 when longer than 256 characters): Kinesis puts a partition key's records in
// one shard, in the order of their sequence numbers, and the relay sends a key's next
// message only once the previous one has its sequence number. So consumers reading a
// shard in order see each key's messages in the outbox's order.
//
// # On the wire
//
// Kinesis records carry no headers: a record's data is a JSON object, {"headers": {...},
// "data": ...} with the headers of outbox.Message.WireHeaders (Outbox-Id,
// Outbox-Dedup-Key, ..., Content-Type) and the payload as "data" when it is compact JSON
// of a JSON content type, or as "data_base64" otherwise. Decode reads it back. Kinesis
// does not deduplicate: consumers dedupe by the Outbox-Id header.
//
// # Confirmed, outage, rejection
//
// A nil error means the record got a sequence number: it is stored in its shard. Calls
// carry up to 500 records and 5 MiB, several at once (Config.MaxInflight). A record
// over Config.MaxRecordBytes (data and partition key) is rejected before it is sent
// (ErrTooLarge); a call Kinesis refuses as invalid is sent again record by record, so
// that only the guilty one is rejected. Throttling (ProvisionedThroughputExceeded), a
// failure on Kinesis's side, KMS and credential problems, a stream being updated,
// network failures, a cancelled context and a missing stream are outages.
package outboxkinesis
