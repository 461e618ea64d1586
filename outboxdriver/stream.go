package outboxdriver

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/outboxkit/outbox/outboxtype"
)

// Streamer is implemented by stores that can follow the outbox's inserts in the database's
// log as their transactions commit (PostgreSQL logical replication: the relay's WAL mode,
// docs/design-wal.md). The stream is a wake-up and the slot's bookkeeping, not a copy of
// the messages: the relay still reads them with Fetch, so the stream carries only each
// inserted row's seq and each transaction's end position.
//
// The slot's confirmed position is moved only by the acknowledgements the relay sends on
// StreamRequest.Acks; a Streamer never acknowledges what it received on its own, and
// always starts reading from the slot's confirmed position.
type Streamer interface {
	// Stream reads the slot until ctx is done or the stream fails, calling emit (from
	// Stream's goroutine, one call at a time) with what arrived. It returns a
	// *StreamError saying why it stopped; a nil error only when ctx is done.
	Stream(ctx context.Context, req StreamRequest, emit func(StreamBatch)) error

	// NextDue returns the earliest time after now at which a pending message of the
	// given shards that waits (a retry backing off, or a delayed message) becomes due,
	// or the zero time if none waits. The relay sets a timer for it: the stream shows a
	// message once, when it is written, not when it becomes due.
	NextDue(ctx context.Context, leases []Lease) (time.Time, error)

	// RecordStreamState records, for operators ('outbox wal status'), that the relay
	// streams the slot (reason "") or polls instead (StreamFallback, with the reason).
	RecordStreamState(ctx context.Context, req StreamRequest, state StreamState, reason StreamReason) error
}

// SlotRecreator is implemented by Streamers that can make a lost or missing slot anew
// (outboxpgx). WAL mode calls it when the stream stops for StreamSlotMissing or
// StreamSlotLost (unless the relay is told to keep such a slot for an operator), then
// reads the new slot: the slot never holds the only copy of a message, so nothing is
// lost, and the relay's catch-up fetch reads what was written meanwhile.
type SlotRecreator interface {
	// RecreateSlot makes req.Slot anew if it is missing or lost, only for the relay that
	// holds the slot's lease under req.Token and only for a slot still recorded (an
	// operator's 'outbox wal drop' is never undone). It returns nil when a readable slot
	// exists afterwards; created says it made one.
	RecreateSlot(ctx context.Context, req StreamRequest) (created bool, err error)
}

// ErrNotSlotReader is RecreateSlot's error when the relay does not hold the slot's lease
// under its token, or the slot is not recorded at all ('outbox wal drop' deletes its
// record first): only the slot's reader makes it anew, and never one an operator dropped.
var ErrNotSlotReader = errors.New("the relay does not hold the slot's lease, or the slot is not recorded")

// WaitingReader is implemented by Streamers whose stream gives rows (StreamRequest.Rows)
// and that can say which pending rows hold keys back (outboxpgx): WAL mode then publishes
// fresh rows from the log (docs/design-wal.md, §2b), and needs to know, when it starts
// doing so, which keys it must leave to its fetches.
type WaitingReader interface {
	// Waiting returns, of the pending messages of the given shards, those that wait (a
	// retry backing off, or a delayed message, due or not) and every other pending
	// message of their keys; messages without a key are left out. It returns at most
	// limit+1 rows, in no order: more than limit says there are too many to keep. pos
	// is the log's position when it read them: every transaction that committed before
	// the read ends at or before pos in the stream.
	Waiting(ctx context.Context, leases []Lease, limit int) (rows []WaitingRow, pos uint64, err error)
}

// WaitingRow is a pending message Waiting returns.
type WaitingRow struct {
	Seq int64
	Key string
}

// StreamState is how the relays get their work in WAL mode.
type StreamState string

const (
	StreamStreaming StreamState = "streaming" // a relay reads the slot
	StreamFallback  StreamState = "fallback"  // the relays poll: the stream is unavailable
)

// StreamRequest is the input of Streamer.Stream.
type StreamRequest struct {
	RelayID string
	// Slot and Publication name what `outbox wal setup` made; empty means the store's
	// defaults for its outbox.
	Slot        string
	Publication string
	// Token is the slot reader's lease under which the relay reads
	// (LeaseState.SlotToken): a Streamer ends a session that still reads the slot only
	// while that lease is current, and records the state only under it.
	Token int64
	// Started, if set, is called once the database accepted to stream the slot (before
	// any emit): from then on every commit after the slot's confirmed position comes.
	Started func()
	// Acks carries the positions the relay may acknowledge: the end of the longest
	// prefix of transactions whose messages are all resolved (docs/design-wal.md, §2).
	// The Streamer sends the latest one to the database as the slot's written, flushed
	// and applied position when it changes, at least every StatusInterval, and when the
	// server asks for a reply, but only while the ack's Until is in the future.
	Acks <-chan StreamAck
	// StatusInterval is the longest time between two status updates; zero means 10 s.
	StatusInterval time.Duration
	// Rows, when set, asks for the rows the transactions inserted as well as their seqs
	// (StreamTxn.Rows), for the relay to publish from the log: whole rows for a
	// transaction that begins while Rows returns true, each row's seq and key only
	// (StreamTxn.KeysOnly) while it returns false. It is called from Stream's goroutine.
	Rows func() bool
}

// StreamAck is a position the relay vouches for, valid until Until (the relay's local
// deadline for its slot lease: after it, another relay may own the slot).
type StreamAck struct {
	LSN   uint64
	Until time.Time
}

// StreamBatch is what one emit call carries: the transactions that committed, in commit
// order, and the position of the stream between transactions when it is idle.
type StreamBatch struct {
	Txns []StreamTxn
	// Idle is a position past every transaction emitted so far and before any
	// transaction not yet complete (a keepalive's or a heartbeat's position received
	// outside a transaction), or 0. It may be acknowledged once every transaction
	// emitted before it is resolved.
	Idle uint64
	// Beat is the position of the last heartbeat message in the batch, or 0.
	Beat uint64
}

// StreamTxn is one committed transaction that inserted into the outbox.
type StreamTxn struct {
	End uint64 // the transaction's end position (its commit record's end)
	// Xid is the transaction's ID (its Begin's): its commit can reach the stream before
	// snapshots see it committed, so a fetch covers it only if the fetch's snapshot
	// shows it done.
	Xid  uint32
	Seqs []int64 // the seqs it inserted, in the order inserted; nil when Bulk
	// Bulk transactions inserted more seqs than a Streamer keeps (it says how many it
	// keeps); it reports only their range [Lo, Hi].
	Bulk   bool
	Lo, Hi int64
	// Rows, when the request asked for them, are the messages of Seqs, one for each, as
	// a fetch would return them, with DeliverAt set on a row that waits (a delayed
	// message, or a retry inserted again by a move): only a row never attempted
	// (Attempts 0) and not waiting is the writer's insert as the relay would fetch it.
	// An entry is nil for a row the Streamer could not read. Rows is nil when the
	// transaction's rows were over the Streamer's memory budget (it says what that is)
	// or Bulk: the relay fetches those.
	Rows []*outboxtype.Message
	// KeysOnly says that Rows hold only each message's Seq and Key (StreamRequest.Rows
	// returned false when the transaction began).
	KeysOnly bool
}

// StreamError says why Stream stopped. Reason is one of the StreamReason constants.
type StreamError struct {
	Reason StreamReason
	Err    error
}

func (e *StreamError) Error() string {
	return "outbox stream: " + string(e.Reason) + ": " + e.Err.Error()
}
func (e *StreamError) Unwrap() error { return e.Err }

// StreamReason classifies a StreamError: every reason but StreamTransient means the
// relay falls back to polling until an operator or a retry fixes the cause.
type StreamReason string

const (
	StreamWALLevel    StreamReason = "wal_level"    // the database does not decode its log (wal_level is not logical)
	StreamPrivilege   StreamReason = "privilege"    // the role may not replicate
	StreamVersion     StreamReason = "version"      // the database is too old
	StreamSlotMissing StreamReason = "slot_missing" // the slot does not exist
	StreamSlotLost    StreamReason = "slot_lost"    // the slot was invalidated: the log it needed is gone
	StreamSlotActive  StreamReason = "slot_active"  // another connection reads the slot
	StreamPublication StreamReason = "publication"  // the publication is missing
	StreamTransient   StreamReason = "transient"    // a connection failure or a restart: try again
)

// StreamReasonOf returns the reason of err's StreamError, or StreamTransient.
func StreamReasonOf(err error) StreamReason {
	var se *StreamError
	if errors.As(err, &se) {
		return se.Reason
	}
	return StreamTransient
}

// SnapshotFetcher is implemented by stores whose fetch can also say which transactions
// its snapshot saw as finished (PostgreSQL). WAL mode counts a full fetch as having read
// a streamed transaction's rows only if that fetch's snapshot shows the transaction
// finished: a commit can reach the stream before other sessions see it committed.
type SnapshotFetcher interface {
	// FetchSnapshot is Fetch, in one snapshot that it also returns.
	FetchSnapshot(ctx context.Context, req FetchRequest) ([]*outboxtype.Message, Snapshot, error)
}

// Snapshot is what a database snapshot knew of transactions, in 64-bit transaction IDs
// (PostgreSQL's pg_current_snapshot()): every transaction below Xmin had finished; every
// one at or above Xmax counts as running (Xmax is one past the latest that had finished,
// so a transaction at or above it may have started); of those in between, the ones in
// Xip were running.
type Snapshot struct {
	Xmin, Xmax uint64
	Xip        []uint64
}

// Finished reports whether the transaction with the 32-bit ID xid (a replication
// stream's, which drops the epoch) had finished when the snapshot was taken. xid is read
// as the 64-bit ID nearest to Xmax with those low 32 bits: PostgreSQL keeps every live
// transaction within 2^31 of the newest.
func (s Snapshot) Finished(xid uint32) bool {
	full := int64(s.Xmax) + int64(int32(xid-uint32(s.Xmax)))
	switch {
	case full >= int64(s.Xmax):
		return false
	case full < int64(s.Xmin):
		return true
	}
	return !slices.Contains(s.Xip, uint64(full))
}
