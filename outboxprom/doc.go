// Package outboxprom exports an outbox's metrics to Prometheus: a relay's work through
// the outbox.Observer hook (Metrics), and the outbox's backlog, read from the store on
// each scrape (StatusCollector). The root package stays free of the Prometheus client;
// only programs that import this package compile it.
//
// # Quick start
//
//	reg := prometheus.NewRegistry()
//	relay, err := outbox.NewRelay(store, pub, outbox.RelayConfig{
//		ID:       "relay-1",
//		Observer: outboxprom.New(outboxprom.Config{Registerer: reg, Broker: "nats"}),
//	})
//	...
//	reg.MustRegister(outboxprom.NewStatusCollector(store, outboxprom.StatusConfig{})) // store: an outboxdriver.Admin (outboxpgx.Driver)
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// `outbox relay --metrics-addr :9187` serves the same metrics, with /healthz and /readyz.
//
// # Metrics of a relay (Metrics)
//
// Every series carries the label relay, the relay's ID (outbox.RelayConfig.ID). topic is
// the message's topic; broker is Config.Broker (nats, amqp, kafka, redis, sqs, webhook).
//
//	Metric                                  Type       Labels                       Meaning
//	outbox_relay_up                         gauge      relay                        1 while the relay runs, 0 once it stopped
//	outbox_published_total                  counter    relay, topic, broker         messages the broker confirmed, counted at the confirmation
//	outbox_publish_failed_total             counter    relay, topic, broker, reason failed attempts: reason "outage" (broker unreachable or outcome unknown; no attempt counted, sent again), "destination" (the message's destination does not exist or cannot take it yet; no attempt counted) or "rejected" (the broker refused the message; an attempt counted)
//	outbox_retried_total                    counter    relay, topic, broker         rejections after which the message waits for another attempt
//	outbox_dead_lettered_total              counter    relay, topic, broker         messages dead-lettered after their last rejected attempt
//	outbox_publish_latency_seconds          histogram  relay, topic                 created_at -> broker confirmation (see Latencies)
//	outbox_commit_latency_seconds           histogram  relay, topic                 known committed -> broker confirmation, a lower bound (see Latencies)
//	outbox_last_publish_timestamp_seconds   gauge      relay                        Unix time of the last confirmation
//	outbox_publish_batch_size               histogram  relay                        messages per Publisher.Publish call
//	outbox_fetch_batch_size                 histogram  relay                        messages per fetch that returned any
//	outbox_fetch_duration_seconds           histogram  relay                        duration of every fetch, empty and failed ones included
//	outbox_record_duration_seconds          histogram  relay                        duration of the database writes that record outcomes
//	outbox_fetch_errors_total               counter    relay                        fetches that failed (database errors)
//	outbox_record_errors_total              counter    relay                        recordings of outcomes that failed (retried a second later)
//	outbox_shards_held                      gauge      relay                        shards the relay holds a lease on
//	outbox_shards_gained_total              counter    relay                        leases taken: at start, in a rebalance, or over from a relay that died
//	outbox_shards_lost_total                counter    relay                        leases lost or given back: at stop, in a rebalance, or taken over while the relay stalled
//	outbox_outcomes_refused_total           counter    relay                        outcomes not recorded because the lease had moved on (fenced); the new owner publishes those messages again
//	outbox_broker_pauses_total              counter    relay                        pauses of sending after a broker outage
//	outbox_wal_reading                      gauge      relay                        WAL mode: 1 while the relay streams the slot (its reader, stream live)
//	outbox_wal_heartbeat_timestamp_seconds  gauge      relay                        WAL mode: Unix time the relay's last heartbeat came back through its stream
//	outbox_wal_silent_reopens_total         counter    relay                        WAL mode: stream found silent (no heartbeat for three intervals) and opened again
//	outbox_wal_slot_recreations_total       counter    relay                        WAL mode: slot made anew after PostgreSQL lost it or it went missing
//	outbox_wal_log_messages_total           counter    relay                        WAL mode: messages taken from the stream to publish without a fetch
//
// The per-topic counters count at the relay, when the broker answers, before the outcome
// is recorded. A message whose outcome is refused (fenced) is published again by the
// shard's new owner and counted there too, so outbox_published_total counts what the
// broker received, duplicates included. Per-topic series appear with a topic's first
// event, the WAL series with a WAL-mode relay's first stream news; the others exist from
// the relay's start, at zero.
//
// # Metrics of a relay's destinations (DestinationCollector)
//
// For a relay whose publisher is an outbox.Router, read from Router.Stats on each scrape.
//
//	Metric                                  Type     Labels              Meaning
//	outbox_destination_up                   gauge    relay, destination  1 while up, 0 from an outage until a message reaches it again or it reconnects
//	outbox_destination_published_total      counter  relay, destination  messages it confirmed
//	outbox_destination_failed_total         counter  relay, destination  messages it rejected (an attempt counted)
//	outbox_destination_deferred_total       counter  relay, destination  messages held back by its outages, no attempt counted
//
// # Metrics of the outbox (StatusCollector)
//
// Read with outboxdriver.Admin.Status when scraped; the same figures on every relay of an
// outbox (aggregate with max, not sum).
//
//	Metric                                  Type   Labels  Meaning
//	outbox_status_up                        gauge  -       1 when the status was read, 0 when it failed or timed out (the other series are then left out)
//	outbox_pending                          gauge  topic   messages neither published nor dead, due or not
//	outbox_due                              gauge  topic   pending messages due now
//	outbox_retrying                         gauge  topic   pending messages rejected at least once
//	outbox_dead                             gauge  topic   dead-lettered messages
//	outbox_oldest_pending_age_seconds       gauge  topic   age of the oldest pending message, from its created_at, in database time
//	outbox_priority_pending                 gauge  priority pending messages of a priority, once one with a priority was pending
//	outbox_priority_oldest_pending_age_seconds gauge priority age of the oldest pending message of a priority
//	outbox_relays_live                      gauge  -       relays with an unexpired heartbeat
//	outbox_relay_routings                   gauge  -       different destinations-and-routing fingerprints among the live relays
//	outbox_shards                           gauge  -       shards the outbox is divided into
//	outbox_shards_leased                    gauge  -       shards with an unexpired lease
//	outbox_partitions                       gauge  -       daily partitions of the published history (PostgreSQL)
//	outbox_partition_days_ahead             gauge  -       days after today that have a partition; below 0 outcomes cannot be recorded
//	outbox_ring_rotations                   gauge  -       times the pending ring moved on (PostgreSQL)
//	outbox_ring_rows_since_rotation         gauge  -       messages written since; far above RotateRows, long-pending messages hold the ring
//	outbox_oldest_transaction_age_seconds   gauge  -       oldest open transaction in the database (pins vacuum)
//	outbox_wal_source                       gauge  slot, state   WAL mode: 1 for the state its reader recorded (starting, streaming, fallback)
//	outbox_wal_slot_exists                  gauge  slot    1 when PostgreSQL has the recorded slot
//	outbox_wal_slot_active                  gauge  slot    1 when a session reads it
//	outbox_wal_slot_status                  gauge  slot, status  1 for its wal_status (reserved, extended, unreserved, lost)
//	outbox_wal_slot_lag_bytes               gauge  slot    its confirmed position behind the server's WAL
//	outbox_wal_slot_retained_bytes          gauge  slot    WAL it keeps
//	outbox_wal_slot_safe_wal_size_bytes     gauge  slot    WAL before it is lost (absent without max_slot_wal_keep_size)
//
// # Latencies
//
// outbox_publish_latency_seconds runs from the message's created_at to the broker's
// confirmation. In PostgreSQL created_at is now() in the writing transaction: the
// transaction's start. The figure therefore includes the whole writing transaction, the
// wait until a relay fetched the message (notification or poll, and the backlog ahead of
// it), retries and outages, a DeliverAt delay, and the broker round trip. The
// confirmation is read on the relay's clock and created_at on the database's, so clock
// skew between the two hosts shifts it (a negative value counts as 0).
//
// outbox_commit_latency_seconds needs the commit time, which PostgreSQL does not keep
// (only with track_commit_timestamp, which the store does not read). What the relay
// knows for certain is that a message was committed by the time a fetch returned it: the
// histogram runs from the return of the last fetch that returned messages before the
// message's first publish attempt on this relay, to the confirmation, both on the relay's
// monotonic clock. That is a lower bound of the true commit -> confirmed latency: it
// leaves out the time between the commit and the fetch (the notification or poll delay,
// and the wait behind a backlog, which outbox_oldest_pending_age_seconds shows) and any
// attempts another relay made before a takeover. It includes retries, outages and the
// broker round trip. The true commit -> confirmed latency lies between the two
// histograms; the gap is the writing transaction's length plus the fetch delay.
//
// p95 of the publish latency per topic, over 5 minutes:
//
//	histogram_quantile(0.95, sum by (topic, le) (rate(outbox_publish_latency_seconds_bucket[5m])))
package outboxprom
