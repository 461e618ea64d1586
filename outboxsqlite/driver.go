package outboxsqlite

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/sqlstore"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Config names where the outbox lives: the tables of the database's main schema. The
// zero value uses no prefix.
type Config struct {
	// Prefix goes before every table name ("billing_" gives billing_outbox, ...), so
	// that several outboxes can share a database. Defaults to none. Must match
	// [a-z_][a-z0-9_]* and be at most 40 bytes.
	Prefix string
}

// Driver writes messages in database/sql transactions on SQLite and is the relay's
// outboxdriver.Store and the operator's outboxdriver.Admin over a *sql.DB. It is safe for concurrent
// use, and several Drivers (in one process or in several processes on the machine that
// holds the file) may work on one outbox at once.
type Driver struct {
	s *sqlstore.Store
}

var (
	_ outboxdriver.WriteDriver[*sql.Tx] = (*Driver)(nil)
	_ outboxdriver.Store                = (*Driver)(nil)
	_ outboxdriver.Admin                = (*Driver)(nil)
)

// Validate checks c as New does: a *outbox.ConfigError names the field at fault.
func (c Config) Validate() error { return sqlstore.ValidatePrefix(c.Prefix, dialect.MaxIdentLen) }

// New returns a driver for the outbox in db, which must use the "sqlite" driver
// (modernc.org/sqlite; Open returns such a db, set up for an outbox). db may be nil when
// the driver only writes in the caller's transactions or renders MigrationSQL; the
// relay, migrations and admin calls need it.
func New(db *sql.DB, config Config) (*Driver, error) {
	s, err := sqlstore.New(db, dialect, config.Prefix)
	if err != nil {
		return nil, err
	}
	return &Driver{s: s}, nil
}

// Insert implements outboxdriver.WriteDriver: it writes msgs in tx with multi-row INSERT
// statements, in call order. A message whose dedup key is taken is skipped and
// reported, and tx stays usable (see outbox.DuplicateError).
func (d *Driver) Insert(ctx context.Context, tx *sql.Tx, msgs []outbox.Message) ([]string, error) {
	if tx == nil {
		return nil, errors.New("outboxsqlite: nil transaction: Write must run inside the caller's transaction (db.BeginTx)")
	}
	return d.s.Insert(ctx, tx, msgs)
}

// Fetch implements outboxdriver.Store.
func (d *Driver) Fetch(ctx context.Context, req outboxdriver.FetchRequest) ([]*outbox.Message, error) {
	return d.s.Fetch(ctx, req)
}

// Complete implements outboxdriver.Store in one IMMEDIATE transaction, fenced by lease tokens.
func (d *Driver) Complete(ctx context.Context, c outboxdriver.Completion) ([]int64, error) {
	return d.s.Complete(ctx, c)
}

// SyncLeases implements outboxdriver.Store in one IMMEDIATE transaction.
func (d *Driver) SyncLeases(ctx context.Context, req outboxdriver.LeaseRequest) (outboxdriver.LeaseState, error) {
	return d.s.SyncLeases(ctx, req)
}

// DeletePublished implements outboxdriver.Store: it deletes up to limit published messages
// older than olderThan, and up to limit dedup keys of that age whose message is neither
// pending nor dead, and returns how many rows it deleted.
func (d *Driver) DeletePublished(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	return d.s.DeletePublished(ctx, olderThan, limit)
}

// Status implements outboxdriver.Admin, in one read transaction (one snapshot). Every figure is
// exact; counting the published table reads its publication-time index.
func (d *Driver) Status(ctx context.Context) (outboxdriver.Status, error) {
	return d.s.Status(ctx)
}

// DeadList implements outboxdriver.Admin: the dead letters that match f, most recently
// dead-lettered first. ErrorContains ignores the case of ASCII letters only (SQLite's
// lower() knows no other alphabet).
func (d *Driver) DeadList(ctx context.Context, f outboxdriver.DeadFilter) ([]outboxdriver.DeadLetter, error) {
	return d.s.DeadList(ctx, f)
}

// DeadCount implements outboxdriver.Admin.
func (d *Driver) DeadCount(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	return d.s.DeadCount(ctx, f)
}

// DeadReplay implements outboxdriver.Admin: the matching dead letters go back to pending with
// their ID, dedup key and seq, attempts reset, due at once. With f.Limit set it takes the
// ones DeadList shows first.
func (d *Driver) DeadReplay(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	return d.s.DeadReplay(ctx, f)
}

// DeadPurge implements outboxdriver.Admin. A filter that selects nothing in particular is
// refused with outboxdriver.ErrEmptyDeadFilter. A purged message's dedup key is released later
// by the retention cleanup.
func (d *Driver) DeadPurge(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	return d.s.DeadPurge(ctx, f)
}

// DeadPurgeAll implements outboxdriver.Admin: it deletes every dead letter.
func (d *Driver) DeadPurgeAll(ctx context.Context) (int, error) {
	return d.s.DeadPurgeAll(ctx)
}

// MigrationStatus is one schema migration and whether it is applied.
type MigrationStatus = sqlstore.MigrationStatus

// MigrateUp applies the schema migrations up to version target (0 for all) in one
// IMMEDIATE transaction, and returns the versions it applied. Running it again, or from
// several processes at once, is safe.
func (d *Driver) MigrateUp(ctx context.Context, target int) ([]int, error) {
	return d.s.MigrateUp(ctx, target)
}

// MigrateDown reverts migrations above version target (0 reverts all, dropping the
// outbox and everything in it) and returns the versions it reverted.
func (d *Driver) MigrateDown(ctx context.Context, target int) ([]int, error) {
	return d.s.MigrateDown(ctx, target)
}

// MigrationStatus lists the migrations and whether each is applied. It creates nothing.
func (d *Driver) MigrationStatus(ctx context.Context) ([]MigrationStatus, error) {
	return d.s.MigrationStatus(ctx)
}

// MigrationSQL returns the whole schema as one SQL script, for teams that run
// migrations with their own tool. It needs no database.
func (d *Driver) MigrationSQL() (string, error) { return d.s.MigrationSQL() }

var (
	_ outboxdriver.InboxDriver[*sql.Tx]   = (*Driver)(nil)
	_ outboxdriver.VersionDriver[*sql.Tx] = (*Driver)(nil)
)

// Claim implements outboxdriver.InboxDriver in tx.
func (d *Driver) Claim(ctx context.Context, tx *sql.Tx, consumer string, ids []string) ([]bool, error) {
	return d.s.Claim(ctx, tx, consumer, ids)
}

// AdvanceVersion implements outboxdriver.VersionDriver in tx.
func (d *Driver) AdvanceVersion(ctx context.Context, tx *sql.Tx, consumer, aggregateType, aggregateID string, version int64) (bool, error) {
	return d.s.AdvanceVersion(ctx, tx, consumer, aggregateType, aggregateID, version)
}

// DeleteInbox deletes up to limit inbox rows processed more than olderThan ago, in
// database time, and returns how many it deleted; fewer than limit means it is done for
// now. Run it periodically with a retention longer than the longest time a message can
// be redelivered: a message redelivered after its row is gone is processed again.
func (d *Driver) DeleteInbox(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	return d.s.DeleteInbox(ctx, olderThan, limit)
}
