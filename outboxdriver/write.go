package outboxdriver

import (
	"context"
	"time"

	"github.com/outboxkit/outbox/outboxtype"
)

// WriteDriver inserts messages in the caller's transaction. TTx is the transaction type
// of the database library (pgx.Tx, *sql.Tx). Drivers live in their own packages
// (outboxpgx, outboxsql); this interface is the seam between them and Writer.
//
// The seam may grow: implement it inside this module, not outside.
type WriteDriver[TTx any] interface {
	// Insert writes msgs, already validated and with defaults filled, in tx. It returns
	// the dedup keys of the messages it skipped because the dedup key was taken, in call
	// order, and no error for them. A message with an empty DedupKey has an id generated
	// for it: its dedup key is the id's string form (DedupID), which no other message
	// holds, so it is stored without being claimed and never skipped.
	Insert(ctx context.Context, tx TTx, msgs []outboxtype.Message) (skipped []string, err error)
}

// InboxDriver records which messages a consumer has processed, in the consumer's own
// transaction. TTx is the transaction type of the database library. Drivers live in the
// store packages (outboxpgx, ...); this interface is the seam between them and Inbox.
//
// The seam may grow: implement it inside this module, not outside.
type InboxDriver[TTx any] interface {
	// Claim records (consumer, id) for every id in tx unless already recorded, and
	// reports, per id, whether this call recorded it. ids are distinct. When another
	// open transaction recorded the same pair, Claim waits for it to end: the pair is
	// then taken if that transaction commits and recorded here if it rolls back.
	Claim(ctx context.Context, tx TTx, consumer string, ids []string) (fresh []bool, err error)
}

// VersionDriver records the newest version of each aggregate a consumer applied, in the
// consumer's transaction. Drivers live in the store packages.
//
// The seam may grow: implement it inside this module, not outside.
type VersionDriver[TTx any] interface {
	// AdvanceVersion stores version for (consumer, aggregateType, aggregateID) in tx if
	// it is newer than the stored one, or none is stored, and reports whether it did.
	// A concurrent transaction advancing the same aggregate makes it wait for that one.
	AdvanceVersion(ctx context.Context, tx TTx, consumer, aggregateType, aggregateID string, version int64) (bool, error)
}

// InboxCleaner deletes old inbox rows: the store drivers' DeleteInbox.
type InboxCleaner interface {
	DeleteInbox(ctx context.Context, olderThan time.Duration, limit int) (int, error)
}
