// Package outboxredis publishes outbox messages to Redis Streams. Its Publisher
// implements outbox.Publisher and outbox.Pinger.
//
// # Quick start
//
//	pub, err := outboxredis.Dial(ctx, "redis://127.0.0.1:6379", outboxredis.Config{Route: "events.{topic}"})
//	if err != nil {
//		return err
//	}
//	defer pub.Close()
//	relay, err := outbox.NewRelay(store, pub, outbox.RelayConfig{})
//
// A message with Topic "orders" is added to the stream "events.orders" with XADD (the
// stream is created on first use). New takes a client the application already has: a
// *redis.Client, a Sentinel-managed *redis.Client (redis.NewFailoverClient), a
// *redis.ClusterClient or a *redis.Ring.
//
// # Entry layout
//
// Redis streams have no headers, content type or message id of their own, so an entry
// is a flat list of fields:
//
//	payload                the payload, byte for byte (binary safe)
//	h:<header name>        one field per header
//
// The headers are the message's own (traceparent, ...) and the metadata headers of
// package outbox: h:Outbox-Id, h:Outbox-Dedup-Key, h:Outbox-Key, h:Outbox-Aggregate-Type,
// h:Outbox-Event-Type, h:Outbox-Topic, h:Outbox-Created-At, h:Content-Type (empty
// metadata is left out). Names keep their case. An entry as XRANGE shows it, field by
// field:
//
//	payload              {"id":42}
//	h:traceparent        00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
//	h:Outbox-Id          0190b6c2-7d3e-7abc-9def-0123456789ab
//	h:Outbox-Dedup-Key   order-42-placed
//	h:Outbox-Key         order-42
//	h:Outbox-Topic       orders
//	h:Content-Type       application/json
//
// Consumers read entries with XREADGROUP (or XREAD, XRANGE) and decode them with
// ParseEntry, or by the layout above in any language.
//
// The entry ID is Redis's own ("1718000000000-0"): XADD with an explicit ID cannot carry
// the dedup key, so the publisher always lets Redis choose ("*").
//
// # Guarantees
//
// A message counts as published when the XADD reply came back with its entry ID. That
// reply means the entry is in the memory of the primary, no more: whether it survives
// a crash of the primary depends on the server's persistence, and whether it survives a
// failover depends on replication.
//
//   - Without persistence (save "" and appendonly no, as on the test machine) a restart
//     loses every stream. RDB snapshots alone lose what came after the last snapshot.
//     With appendonly yes and appendfsync everysec (the usual setting) a crash loses
//     up to a second or two of confirmed entries; with appendfsync always the server
//     replies only after the AOF is fsynced, so a confirmed entry survives a crash
//     of the server or the machine, at a cost in throughput.
//   - Replication is asynchronous: a failover can promote a replica that lacks the last
//     confirmed entries. Config.WaitReplicas closes most of that gap: every pipeline
//     ends with WAIT n, and a message is confirmed only when n replicas acknowledged it
//     within Config.WaitTimeout; otherwise it fails as an outage (it is on the primary,
//     so the retry adds a second copy). WAIT makes a failover that promotes an
//     acknowledging replica lose nothing; it does not make the replicas fsync.
//     Redis 7.2 and later also have WAITAOF, which waits for AOF fsyncs; this package
//     does not send it yet.
//
// Publish pipelines: it sends the whole batch as one pipeline (MULTI is not needed: the
// messages of a batch have distinct keys), then WAIT when configured, and reads every
// reply. Per-key order holds because the relay sends the next message of a key only after
// the previous one was confirmed. With a *redis.ClusterClient, go-redis splits the
// pipeline by node; with WaitReplicas the publisher itself sends one pipeline and one
// WAIT per master, concurrently, since WAIT counts the writes of its own connection.
//
// Each XADD can trim its stream (Config.MaxLen: MAXLEN ~ n by default, = n with
// MaxLenExact). Trimming drops entries whether or not a consumer group read them.
//
// # Deduplication
//
// Redis has no native deduplication that this package uses (XADD IDMP arrived with
// Redis 8.6), so by default a retry after an unknown outcome (a timeout, a connection
// lost before the reply, a WAIT that fell short) adds a second entry with the same
// h:Outbox-Id and h:Outbox-Dedup-Key. Consumers drop those with an inbox keyed by the
// dedup key. Duplicates are bounded by what was in flight at a fault.
//
// Config.DedupWindow makes publishing idempotent within a window instead: each message
// goes through a Lua script that checks a marker key "{<stream>}:outbox-dedup:<dedup
// key>", and either returns the entry ID the marker holds (the message is confirmed, no
// second entry; the marker's expiry is renewed) or adds the entry and sets the marker
// to expire after the window, atomically. The bounds:
//
//   - a retry later than the window adds a second entry;
//   - markers take Redis memory: about 150 bytes plus the length of the marker's name
//     each (some 210 bytes with a UUID dedup key, measured on Redis 7.0), so a 2-minute
//     window at 1,000 messages/s holds 120,000 markers, about 25 MB;
//   - markers share the stream's fate in a restart or failover, and a trimmed or
//     deleted entry still counts as added while its marker lives;
//   - the script needs Redis 7 or later, whose scripts keep the error codes of the
//     commands they call.
//
// Consumers that need exactly-once effects still use an inbox: the window only cuts the
// duplicates that reach them.
//
// # Errors
//
// Publish returns, per message, either an outage (outbox.IsOutage reports true: the relay
// pauses and burns no attempt) or a rejection of that message on its merits (the relay
// counts an attempt and dead-letters the message after its attempt limit).
//
// Rejections (returned as they are):
//
//   - WRONGTYPE: the stream's key exists and holds another type (a string, a list, ...);
//   - a route placeholder whose field is empty (outbox.ErrUnroutable);
//   - ERR The stream has exhausted the last possible ID; ERR Protocol error (a field
//     over the server's proto-max-bulk-len, 512 MB by default, beyond which the
//     server also closes the connection);
//   - CROSSSLOT, with DedupWindow on a cluster: a stream name holding a "}" without a
//     hash tag, whose marker cannot share its slot.
//
// Outages (wrapped with outbox.Outage):
//
//   - connection errors: refused, reset, closed, EOF, read or write timeouts, an
//     exhausted or closed pool (redis.ErrClosed, redis.ErrPoolTimeout);
//   - ctx done: the outcome is unknown;
//   - backpressure and server states: OOM (command not allowed when used memory >
//     maxmemory), BUSY (a script or function running), LOADING, MASTERDOWN, MISCONF
//     (RDB snapshot failing with stop-writes-on-bgsave-error);
//   - failover and cluster states: READONLY (the address now points at a replica),
//     TRYAGAIN, CLUSTERDOWN, MOVED and ASK that go-redis did not follow, NOREPLICAS;
//   - configuration: NOAUTH, WRONGPASS, NOPERM (an ACL that does not allow XADD, EVAL
//     or the stream's key), ERR unknown command (a server or proxy without streams);
//   - fewer than WaitReplicas replicas acknowledged (ErrNotReplicated), or WAIT failed;
//   - every other ERR reply and any error this package does not recognise.
//
// Configuration problems that affect every message are outages on purpose: dead-
// lettering the whole outbox because of an ACL would be worse than pausing until someone
// fixes it; the error text names the stream, so the relay's log says what to fix.
// Unrecognised errors are outages too: they cost a pause, never a message.
//
// # Concurrency
//
// A Publisher is safe for concurrent use; the relay calls Publish from several
// goroutines, and each call takes its own connection from the client's pool (PoolSize,
// 10 per CPU by default).
package outboxredis
