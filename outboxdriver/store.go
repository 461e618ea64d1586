package outboxdriver

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/outboxkit/outbox/outboxtype"
)

// Store is what a Relay needs from a database: shard leases, reading due messages, and
// recording outcomes. outboxpgx (pgx) and outboxsql (database/sql) implement it for
// PostgreSQL.
//
// Every time that decides correctness (lease expiry, when a retry is due) is the
// database's clock, never the relay's, so relays with skewed clocks cannot overlap.
//
// The seam may grow: implement it inside this module, not outside.
type Store interface {
	// SyncLeases heartbeats the relay, renews the leases it holds, releases the ones
	// listed in req.Release, adopts its earlier leases when req.Adopt is set, and takes
	// free or expired shards up to its fair share (ceil(shards / live relays)). All in
	// database time. The leases it returns are those of req.Held still the relay's, the
	// adopted ones and the ones taken: a lease of the same relay ID under a token not in
	// req.Held (an earlier process's) is not returned without Adopt.
	SyncLeases(ctx context.Context, req LeaseRequest) (LeaseState, error)

	// Fetch returns up to req.Limit due messages of the shards whose leases req lists
	// (and that the relay still holds in the database), in Seq order, skipping
	// req.Exclude and any message whose key has an earlier message that is pending but
	// not yet due (a retry backing off, or a delayed message).
	Fetch(ctx context.Context, req FetchRequest) ([]*outboxtype.Message, error)

	// Complete records publish outcomes in one transaction, fenced: an outcome is
	// applied only if the lease token it carries is still the relay's unexpired lease on
	// the message's shard. The relay passes only outcomes whose token it still holds for
	// the message's shard. It returns the seqs whose outcome was refused.
	Complete(ctx context.Context, req Completion) (refused []int64, err error)

	// DeletePublished deletes up to limit messages published before the database time
	// now() - olderThan, with whatever bookkeeping of that age the store keeps (expired
	// dedup keys), and returns how many rows it deleted; fewer than limit means it is
	// done for now.
	DeletePublished(ctx context.Context, olderThan time.Duration, limit int) (int, error)
}

// PriorityFetcher is implemented by stores that keep Message.Priority: the relay reads
// higher-priority messages ahead of a backlog with FetchPriority.
type PriorityFetcher interface {
	// FetchPriority returns up to req.Limit due messages with a priority above 0 of the
	// shards whose leases req lists (and that the relay still holds), highest priority
	// first and in Seq order within one, skipping req.Exclude. A message is returned
	// only if every earlier pending message of its key that the relay has not handled
	// is due and of the same priority (and so returned ahead of it, limit permitting):
	// of the key Keys[i], the relay has handled the messages up to KeySeqs[i]; of other
	// keys, none (a message in Exclude above them still holds its key back: the store
	// need not look). So a key's order holds whatever the priorities of its messages, a
	// key's message waits behind an earlier one that waits (a retry backing off, or a
	// delayed message), and a key whose messages have one priority is read whole. After
	// is not used.
	//
	// It returns an error wrapping ErrNoPriorities when the store's schema cannot keep
	// priorities yet (a migration to apply): the relay then reads in Seq order alone.
	FetchPriority(ctx context.Context, req FetchRequest) ([]*outboxtype.Message, error)
}

// ErrNoPriorities says a store keeps no priorities: its schema is behind (on PostgreSQL,
// before version 10), or the store has none.
var ErrNoPriorities = errors.New("the outbox keeps no message priorities")

// Maintainer is implemented by stores whose tables need upkeep beyond deleting old rows:
// the PostgreSQL stores keep the published history in daily partitions, created days
// ahead and dropped whole once expired. A relay whose store implements it calls Maintain
// at start and every CleanupInterval instead of DeletePublished, also when Retention is
// -1 (keep forever: nothing is dropped, days are still created). Every relay calls it:
// the store must let one do the work at a time and return promptly in the others. An
// error is logged and the call repeated at the next interval; steps that succeeded stay
// done. A wrapper that embeds a Store hides this method unless it declares it too, and the
// relay then falls back to DeletePublished: forward it.
type Maintainer interface {
	Maintain(ctx context.Context, req MaintainRequest) (Maintenance, error)
}

// MaintainRequest is the input of Maintainer.Maintain.
type MaintainRequest struct {
	// Retention is how long published messages are kept; -1 keeps them forever.
	Retention time.Duration
	// Limit bounds the rows one statement deletes (expired dedup keys).
	Limit int
}

// Maintenance is what one Maintain call did.
type Maintenance struct {
	Created, Dropped []time.Time // days of published history whose partition was created or dropped
	Deleted          int         // rows deleted: expired dedup keys, and published rows where the history is not partitioned
	Skipped          bool        // another process was maintaining the store: nothing done
}

// Recycler is implemented by stores that give the pending table's storage back instead
// of leaving it to vacuum (PostgreSQL from schema version 4: a ring of buckets rotated and
// emptied with TRUNCATE, so a long-open snapshot elsewhere in the database does not make
// fetches slower). A relay whose store implements it calls Recycle about every second.
// Like Maintain, every relay calls it and the store lets one work at a time; an error is
// logged and the call repeated.
type Recycler interface {
	Recycle(ctx context.Context) (Recycling, error)
}

// Recycling is what one Recycle call did.
type Recycling struct {
	Rotated   bool // the next bucket became current
	Reclaimed int  // buckets emptied
	Moved     int  // pending rows moved out of the buckets emptied, keeping their seq
	// Draining: a retired bucket still holds a backlog. The relay calls again sooner, so
	// that the bucket is emptied as soon as the backlog is published: until then every
	// full fetch walks the rows already published from it.
	Draining bool
}

// Listener is implemented by stores that can wake the relay when messages are written
// or shards are given back (PostgreSQL LISTEN/NOTIFY). Listen calls wake after each
// notification, saying which and, for WakeWritten, the lowest seq the notifying
// transaction wrote (0 when the notification does not say), and returns when ctx is done
// or the listening connection fails; the relay polls meanwhile and calls Listen again.
//
// A seq lets the relay read what was written by a continuation above its cursor, which
// walks none of the rows already published, instead of a fetch from the oldest row.
//
// Writers notify only while a relay waits (Gate): a notifying commit is serialised with
// every other notifying commit of the whole database server, so an outbox whose writers
// notified on every commit cost a busy application most of its commit rate. Listen
// answers the relay's asks on gate.Asks with Gate.Answer, in order with its wake calls
// (a wake that follows an answer happened after it). Asks that arrive together may get
// one answer, and a session that cannot hold the gate may answer none: the relay polls.
type Listener interface {
	Listen(ctx context.Context, wake func(w Wake, from int64), gate Gate) error
}

// Wake says why a Listener woke the relay.
type Wake uint8

const (
	// WakeWritten: messages were written (or may have been: Listen's first call, for
	// what was written before it listened). The relay fetches.
	WakeWritten Wake = iota
	// WakeLeases: a relay gave shards back (it stopped, or handed shards to a relay that
	// joined). The relay syncs its leases at once instead of at its next renewal, so
	// that the shards' keys wait for a round trip rather than a renewal interval.
	WakeLeases
)

// Gate carries a relay's asks to be woken by the next write, and the listener's
// answers. A zero Gate asks nothing: the writers of an outbox that gates its
// notifications then notify no one, and the relay finds their messages by polling.
type Gate struct {
	// Asks receives an ask when the relay has found nothing more to fetch and would wait.
	Asks <-chan struct{}
	// Answer is called with the listener's answer to each ask.
	Answer func(GateState)
}

// GateState is a Listener's answer to an ask (Gate).
type GateState uint8

const (
	// GateAlways: writers notify on every commit (an outbox whose schema predates the
	// gate, PostgreSQL before schema version 7). Nothing to ask for until Listen is
	// called again.
	GateAlways GateState = iota
	// GateArmed: this listener holds the gate, and every writer from now on notifies
	// until the next notification, when the listener lets go of it (the relay is busy
	// again). Every writer that had not notified has ended: a fetch from now on sees
	// what it wrote.
	GateArmed
	// GateCovered: another relay's listener holds the gate, with the same meaning: the
	// notifications reach every listener.
	GateCovered
	// GateBusy: writers that did not notify are between their insert and their commit.
	// The relay fetches again shortly and asks again.
	GateBusy
	// GateUnavailable: the listening session cannot hold the gate (it is not kept from
	// one statement to the next: PgBouncer in transaction pooling mode). Nothing to ask
	// for until Listen is called again; the relay polls.
	GateUnavailable
)

// Lease is a relay's ownership of one shard. Token grows with every change of owner; the
// store refuses outcomes carrying a token that is no longer current (fencing).
type Lease struct {
	Shard int
	Token int64
}

// LeaseRequest is the input of Store.SyncLeases.
type LeaseRequest struct {
	RelayID  string
	Hostname string
	PID      int
	TTL      time.Duration
	Held     []Lease // leases to renew
	Release  []Lease // leases to give up
	// Adopt asks the store to take over, under new tokens and for TTL, every unexpired
	// lease of RelayID that is not in Held or Release: the leases of an earlier process
	// with the same ID (a relay restarted under a stable ID after a crash), or ones taken
	// in a round whose answer the relay never got. The new tokens fence whoever holds the
	// old ones: their renewals and outcomes are refused, as after an expiry. A relay sets
	// it on its first round and after a round failed.
	Adopt bool
	// Slot, for a relay in WAL mode (a Streamer's store), asks for the lease of the
	// slot's reader: one relay at a time reads a slot, the others stand by.
	Slot *SlotLease
	// Fingerprint identifies where the relay sends messages: its destinations and
	// routing (outbox.RelayConfig.Fingerprint). The store records it with the heartbeat,
	// and relays whose fingerprints differ never hold shards at the same time
	// (LeaseState.Share). Empty: the relay states none, and agrees with every relay.
	Fingerprint string
	// Destinations is the state of each of the relay's destinations (a Router's), which
	// the store records with the heartbeat for Status; empty for a relay of one broker.
	// A store records the first MaxDestinationStates.
	Destinations []DestinationState
}

// DestinationState is the state of one of a relay's destinations at its last heartbeat.
type DestinationState struct {
	Name string `json:"name"`
	// Up is false from an outage of the destination (its publisher reported one) until
	// a message reaches it again or its publisher reports it is connected again.
	Up bool `json:"up"`
	// Since is when Up last changed, by the relay's clock; the relay's start before
	// any change.
	Since time.Time `json:"since"`
}

// MaxDestinationStates is how many destination states a store records per relay.
const MaxDestinationStates = 32

// SlotLease is a WAL-mode relay's part of a lease round (docs/design-wal.md, §4). A
// relay reads the slot only while it holds the lease, under its token; the lease is
// taken as a shard's is: when free, or when its owner's heartbeat expired.
type SlotLease struct {
	Slot    string // the slot's name; empty means the store's default for its outbox
	Token   int64  // the lease the relay holds, 0 if none
	Release bool   // give it back: the relay stops reading (set on its final round)
	// Beat asks the round to write a heartbeat into the log (a message the stream
	// reports as StreamBatch.Beat) if the relay still holds the lease under Token: the
	// reader's check that its stream is alive (docs/design-wal.md, §6).
	Beat bool
}

// LeaseState is the result of Store.SyncLeases.
type LeaseState struct {
	Held   []Lease // every lease the relay holds now, renewed for TTL
	Shards int     // total number of shards
	// Live is the number of relays with an unexpired heartbeat that share the shards with
	// this one, this one included: those whose fingerprint differs are not counted.
	Live   int
	Target int // this relay's fair share of shards
	// GiveWay, when not empty, lists the live relays that hold shards under another
	// fingerprint, to which this relay gives way: its Target is 0, it takes no shard and
	// gives back those it holds. Empty when it agrees with every shard holder.
	GiveWay []Peer
	// SlotToken is the slot reader's lease the relay holds after the round (under
	// LeaseRequest.Slot), 0 if another relay holds it or there is no such slot. While
	// the holder streams and every live relay is in WAL mode, the holder's Target is
	// every shard and the others' 0: one reader publishes everything.
	SlotToken int64
	// SlotHolder is the relay that holds the slot reader's lease after the round, this
	// one included; empty if none does, or the slot is not set up.
	SlotHolder string
	// SlotBeat says the round wrote the heartbeat that LeaseRequest.Slot.Beat asked
	// for; SlotBeatErr, why it could not (the round itself succeeded).
	SlotBeat    bool
	SlotBeatErr error
}

// FairShare is the number of shards a relay may hold when Live relays share Shards.
func (s LeaseState) FairShare() int {
	live := max(s.Live, 1)
	return (s.Shards + live - 1) / live
}

// Peer is a live relay whose fingerprint differs from that of the relay in a lease
// round (both are set): what a store reads for Share.
type Peer struct {
	ID          string
	Fingerprint string
	Holds       bool // it holds a shard lease
}

// Share sets Target, and GiveWay, once a store has counted the shards and the live
// relays (Live, every one of them) and read the differing peers of the round's relay,
// whose fingerprint is fingerprint and which holds shards when holding (after renewal
// and adoption):
//
//   - the differing peers do not share the shards: Live counts them out;
//   - the relay gives way (Target 0, GiveWay listing them) to the differing peers that
//     hold shards, when it holds none, or when their fingerprint sorts before its own:
//     two routings that took shards at the same moment settle on the earlier-sorting
//     one at their next rounds;
//   - otherwise Target is the fair share.
//
// So the relays of a new routing wait until every relay of the old one has stopped or
// expired, and never publish beside them.
func (s *LeaseState) Share(fingerprint string, holding bool, differing []Peer) {
	s.Live -= len(differing)
	s.GiveWay = nil
	for _, p := range differing {
		if p.Holds && (!holding || p.Fingerprint < fingerprint) {
			s.GiveWay = append(s.GiveWay, p)
		}
	}
	if len(s.GiveWay) > 0 {
		s.Target = 0
		return
	}
	s.Target = s.FairShare()
}

// GiveWayTo returns the ids of the relays in GiveWay and their fingerprints, each once,
// in order: what a relay's log and readiness say.
func (s LeaseState) GiveWayTo() (ids, fingerprints []string) {
	for _, p := range s.GiveWay {
		ids = append(ids, p.ID)
		if !slices.Contains(fingerprints, p.Fingerprint) {
			fingerprints = append(fingerprints, p.Fingerprint)
		}
	}
	return ids, fingerprints
}

// FetchRequest is the input of Store.Fetch.
type FetchRequest struct {
	RelayID string
	Leases  []Lease
	Exclude []int64 // seqs the relay already has in hand
	// After, when not zero, asks only for messages with Seq > After: a continuation of
	// earlier fetches, which the store can answer with a range scan. Exclude is then
	// empty, and a message is returned only if its key has no pending message at or
	// below After that the relay has not handled. The relay has handled, of the key
	// Keys[i], the messages up to KeySeqs[i] (it holds them, or the store recorded their
	// outcome for it); of other keys, none. A store must check from KeySeqs[i] up, not
	// from the key's first message: that is what keeps the check cheap when the key's
	// published rows are dead but not yet vacuumed.
	After   int64
	Keys    []string
	KeySeqs []int64
	Limit   int
}

// Held returns, for a continuation, the highest seq the relay has handled of each key in
// Keys: KeySeqs by key. A key without a seq (a short KeySeqs) maps to 0: nothing handled,
// the safe reading.
func (r FetchRequest) Held() map[string]int64 {
	held := make(map[string]int64, len(r.Keys))
	for i, k := range r.Keys {
		if i < len(r.KeySeqs) {
			held[k] = r.KeySeqs[i]
		} else {
			held[k] = 0
		}
	}
	return held
}

// Completion is the input of Store.Complete.
type Completion struct {
	RelayID   string
	Published []Outcome
	Failed    []Failure
}

// Outcome identifies a message and the lease under which it was published.
type Outcome struct {
	Seq   int64
	Token int64
}

// Failure records a rejected attempt: the attempt counter grows by one and the message is
// due again after Delay, or, when Dead, moves to the dead-letter state.
type Failure struct {
	Outcome
	Error string
	Delay time.Duration
	Dead  bool
	// Deferred says the message was not attempted: its destination was unavailable
	// (outbox.DestinationOutage). The store records Error and the next attempt time as
	// for a retry, holding the key back as well, but counts no attempt. Never with Dead.
	Deferred bool
}
