// Package broken switches on deliberate bugs, for the correctness suite's canaries: a
// suite that passes a relay with one of these bugs proves nothing. The bugs exist only in
// builds with the outbox_broken build tag, and then only when OUTBOX_BROKEN names them; in
// every other build Has is a constant false and the compiler drops the broken branches.
package broken

// Bug names one deliberate bug.
type Bug string

// The bugs the suite must catch.
const (
	// MarkBeforeConfirm records a message as published whatever the broker answered.
	MarkBeforeConfirm Bug = "mark-before-confirm"
	// CursorPolling fetches only rows above the highest sequence seen so far ("id >
	// cursor" polling), so a transaction that commits after a later one is skipped.
	CursorPolling Bug = "cursor-polling"
	// NoKeyGate lets every relay fetch every key, ignoring shard leases and held keys.
	NoKeyGate Bug = "no-key-gate"
	// LocalClockLeases judges lease expiry by the relay's own clock (skewed by
	// OUTBOX_BROKEN_CLOCK_SKEW) instead of the database's.
	LocalClockLeases Bug = "local-clock-leases"
	// IgnoreReturns counts a RabbitMQ confirm as success even when the message was
	// returned as unroutable.
	IgnoreReturns Bug = "ignore-returns"
	// TruncateStragglers empties a retired bucket of the pending ring without first
	// moving its pending rows to the current bucket.
	TruncateStragglers Bug = "truncate-stragglers"
	// WALAckOnReceipt acknowledges each transaction of the WAL stream as soon as it
	// arrives, before its messages are published.
	WALAckOnReceipt Bug = "wal-ack-on-receipt"
	// WALAckMax acknowledges the end of the latest resolved transaction, even with
	// earlier ones unresolved (confirmations arriving out of order).
	WALAckMax Bug = "wal-ack-max"
	// WALStartAtCurrent starts reading the slot at the server's current position
	// instead of the slot's confirmed one, skipping what committed meanwhile.
	WALStartAtCurrent Bug = "wal-start-at-current"
	// NoStallWatch leaves outboxpgx's statements unwatched: one on a connection that
	// went silent waits for its own deadline.
	NoStallWatch Bug = "no-stall-watch"
	// StallKillsSlow makes outboxpgx's stall watch close the connection of every
	// statement out for long, a running one too.
	StallKillsSlow Bug = "stall-kills-slow"
	// StallIdleUnsent makes outboxpgx's stall watch take every idle session for one its
	// statement never reached, so a session that answered and waits for the client to
	// read (or to send the transaction's next statement) is closed after a quarter of a
	// second.
	StallIdleUnsent Bug = "stall-idle-unsent"
	// StallKeepsOrphans leaves the session of a statement that gave up on a silent
	// connection to the server, which keeps it, and its locks, until TCP keepalive.
	StallKeepsOrphans Bug = "stall-keeps-orphans"
	// GateKeepsLeft makes outboxpgx's Listen take a gate held by a listening session it
	// closed before for another relay's: it answers covered, and the relay waits for a
	// notification that session will never take.
	GateKeepsLeft Bug = "gate-keeps-left"
	// FleetOneRoute makes a relay serving an outboxes list publish every outbox's
	// messages with the first route's publisher: they reach another outbox's destination.
	FleetOneRoute Bug = "fleet-one-route"
	// RouteTopicOnly makes a routing rule match on the topic alone, ignoring its
	// aggregate type, event type and headers: messages reach another destination than
	// the one their rule names.
	RouteTopicOnly Bug = "route-topic-only"
	// PriorityOvertakes lets a priority fetch take a message whose key has an earlier
	// pending message the relay does not hold: it overtakes that message.
	PriorityOvertakes Bug = "priority-overtakes"
	// WALTrustAll makes WAL mode's log path publish every fresh row the stream brings,
	// before its catch-up and whatever its key holds back.
	WALTrustAll Bug = "wal-trust-all"
)

// EnvVar names the environment variable that lists the bugs to switch on, separated by
// commas.
const EnvVar = "OUTBOX_BROKEN"
