// Package torture is the Jepsen-style correctness harness (issue 7): a workload
// generator that writes events through the real Writer while faults are injected, a
// History of every transaction it attempted, a DeliveryLog of what came back from the
// broker, and a checker that compares the two and prints one summary line per run.
//
// # The workload
//
// StartWorkload runs N writers, each on its own *pgx.Conn (never a pool, so a fault can be
// aimed at one writer: Workload.BackendPID). Prepare creates two business tables in the
// outbox's schema: aggregates(id text primary key, seq bigint), one row per key, and
// torture_ledger(event_id uuid primary key, key, seq, checksum). Each transaction:
//
//  1. picks a key and 1..MaxEventsPerTx events; XIDFirstShare of transactions take
//     their xid first (SELECT pg_current_xact_id()), before waiting for the lock;
//  2. UPDATE aggregates SET seq = seq + n ... RETURNING seq: the per-key sequence numbers
//     are assigned under the aggregate's row lock, so they are the order consumers must
//     see, and they are dense per key among committed transactions (a rollback gives its
//     numbers back);
//  3. writes the events with outbox.Writer (payload: JSON {id, key, seq, filler}; the
//     checksum is SHA-256 of the payload bytes; LargeShare of them LargeSize bytes;
//     PoisonShare of them with the header Torture-Poison: 1, which the runner's broker
//     side refuses so the relay must dead-letter them);
//  4. inserts one ledger row per event;
//  5. LongShare of transactions then stay open for about LongHold (the commit-order trap:
//     their outbox rows take early store positions and commit late);
//  6. RollbackShare roll back, the rest COMMIT.
//
// A shared rate limit (Rate, transactions per second) paces the writers. Writer i draws
// every choice from PCG(Seed, i), so a seed replays the same workload (not the same
// interleaving, and not the same event ids, which are fresh UUIDv7s). Stop drains: no new
// transaction starts and those in flight finish, or are cancelled when Stop's context
// ends. A writer whose connection breaks reconnects with backoff and carries on.
//
// # Outcomes
//
// A transaction is Committed when COMMIT returned success; RolledBack when it rolled back
// on purpose, failed before COMMIT was sent, or the server answered COMMIT with ROLLBACK;
// Unknown when the COMMIT call itself failed. History.Resolve settles every Unknown after
// the run by looking its event ids up in the ledger and the outbox's pending, published and
// dead tables: all found is committed, none found is rolled back, some found is an error
// (atomicity broken). Nothing is guessed. Note what pgx does to an Unknown COMMIT: when
// the caller's context ends, pgx sends a CancelRequest before closing, so the server
// usually rolls the COMMIT back; when the network dies the cancel cannot get through and
// the COMMIT usually completes. Both happen in real runs, which is why Resolve exists
// (TestResolveKilledCommit pins both).
//
// # The checker
//
// Check(history, log, bounds) counts, over events (not transactions):
//
//   - lost: committed, never delivered and not dead-lettered;
//   - phantom: delivered (first copy) but rolled back (PhantomAborted, Jepsen's G1a) or
//     never written at all;
//   - order: per key, in broker order, a first copy whose seq is not above every seq
//     already first-delivered for that key. Later copies of an event are duplicates,
//     never order violations; gaps are not order violations (they are lost or dead);
//   - mismatch: a copy of a committed event whose checksum, key or seq differ from what
//     was written (truncated or corrupted payloads);
//   - dup: copies beyond the first, summed over events, against the bound
//     Bounds.InFlight x Bounds.Faults;
//   - dead versus poison: the dead-letter set must be exactly the committed poison
//     events: DeadUnexpected counts dead events that are not, PoisonAlive counts poison
//     not dead;
//   - unresolved: events whose outcome is still Unknown make the run invalid.
//
// A run of several outboxes checks each outbox's history against the copies read back
// from its own destination and adds the reports up (Report.Add); the runner counts the
// copies found in another outbox's destination (Report.Crossed).
//
// The runner fills Label, Seed, RecoverySeconds, RSSMiB and Timing into the Report;
// Bounds can cap RecoverySeconds and RSSMiB. Report.String is the summary line of
// TESTING.md:
//
//	chaos nats seed=42 events=200000 committed=180213 faults=43 lost=0 phantom=0 order=0 dup=12 dup_bound=4300 dead=5 poison=5 mismatch=0 recovery_s=14.2 rss_mib=143 lat_p50_ms=4.1 lat_p99_ms=2870.5 heal_p99_ms=812.0 result=ok
//
// with outboxes= and crossed= after the timing fields in a run of several outboxes, and
// unresolved=, dead_unexpected=, poison_alive=, lease_steals= and slot_ahead= before
// result= when they are not zero. Report.Examples names the first anomalies, with event ids, for
// the test log.
//
// # Timing
//
// Measure(history, log, faults) turns the run's timestamps into figures, never into a
// verdict (they depend on the machine's speed, and no test asserts them):
//
//   - commit-to-arrival (lat_p50_ms, lat_p99_ms): per event of a transaction whose
//     COMMIT returned success, the earliest Delivery.Arrived of its copies minus Txn.End
//     (the instant COMMIT returned); over the whole run, drain included. Transactions
//     Resolve settled are left out: their commit instant is unknown.
//   - heal-to-first-arrival, per fault kind: for each fault injected without error, the
//     time from its heal (nemesis Record.End) to the first arrival of any copy, of any
//     event, at or after it. It is global, not per key or shard: the harness does not
//     know which relay published a copy, so with several relays a fault of one of them
//     is followed at once by the others' copies. KindTiming.Flowing counts the faults
//     during whose hold copies still arrived, which says when that is so, and
//     KindTiming.NextFault those whose first arrival came after the next fault began
//     (the value then ends where that fault began). heal_p99_ms is over the kinds that
//     can block publishing (FaultSpan.CannotBlock).
//
// Percentiles are nearest-rank (Percentile): always a value of the sample, so with fewer
// than 100 faults the p99 is the largest. Arrival is the broker's own stamp of when it
// stored the copy (JetStream's stored time), read back at the end: the first instant a
// subscriber could have received it, not counting a live subscriber's own reconnects.
// Brokers whose read-back has no such stamp (RabbitMQ; Kafka, whose record time is the
// producer's) leave Arrived zero, and the summary line then has no timing fields.
//
// Types here are safe for concurrent use where they say so: History and DeliveryLog
// accept concurrent Record and Add; Check reads snapshots.
package torture
