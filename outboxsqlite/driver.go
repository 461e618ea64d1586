package outboxsqlite

import (
	"context"
	"database/sql"
	"errors"

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
//
// Its methods besides Insert (the relay's Fetch, Complete, SyncLeases and DeletePublished;
// Status and the dead-letter calls; the migrations; the inbox's Claim, AdvanceVersion and
// DeleteInbox) are those of the engine it shares with outboxmysql (internal/sqlstore), which
// documents them.
type Driver struct {
	// *store is embedded so that its methods are the Driver's; the alias keeps the field
	// unexported, out of the API.
	*store
}

// store is the engine the Driver shares with the other database/sql stores.
type store = sqlstore.Store

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
	return &Driver{store: s}, nil
}

// Insert implements outboxdriver.WriteDriver: it writes msgs in tx with multi-row INSERT
// statements, in call order. A message whose dedup key is taken is skipped and
// reported, and tx stays usable (see outbox.DuplicateError).
func (d *Driver) Insert(ctx context.Context, tx *sql.Tx, msgs []outbox.Message) ([]string, error) {
	if tx == nil {
		return nil, errors.New("outboxsqlite: nil transaction: Write must run inside the caller's transaction (db.BeginTx)")
	}
	return d.store.Insert(ctx, tx, msgs)
}

// MigrationStatus is one schema migration and whether it is applied.
type MigrationStatus = sqlstore.MigrationStatus

var (
	_ outboxdriver.InboxDriver[*sql.Tx]   = (*Driver)(nil)
	_ outboxdriver.VersionDriver[*sql.Tx] = (*Driver)(nil)
)
