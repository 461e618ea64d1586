package outboxmysql

import (
	"context"
	"database/sql"
	"errors"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/sqlstore"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Config names where the outbox lives: tables in the connection's database (the one the
// DSN names). The zero value uses no prefix.
type Config struct {
	// Prefix goes before every table name ("billing_" gives billing_outbox, ...), so
	// that several outboxes can share a database. Defaults to none. Must match
	// [a-z_][a-z0-9_]* and be at most 40 bytes.
	Prefix string
}

// Driver writes messages in database/sql transactions on MySQL or MariaDB and is the
// relay's outboxdriver.Store and the operator's outboxdriver.Admin over a *sql.DB. It is safe for
// concurrent use, and any number of Drivers, on any hosts, may work on one outbox.
//
// Its methods besides Insert (the relay's Fetch, Complete, SyncLeases and DeletePublished;
// Status and the dead-letter calls; the migrations; the inbox's Claim, AdvanceVersion and
// DeleteInbox) are those of the engine it shares with outboxsqlite (internal/sqlstore), which
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

// New returns a driver for the outbox in db, which must use the "mysql" driver
// (github.com/go-sql-driver/mysql) with the utf8mb4 character set (the driver's default).
// No other DSN setting matters: times cross the driver as integers, so parseTime and loc
// may be anything. db may be nil when the driver only writes in the caller's
// transactions or renders MigrationSQL; the relay, migrations and admin calls need it.
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
		return nil, errors.New("outboxmysql: nil transaction: Write must run inside the caller's transaction (db.BeginTx)")
	}
	return d.store.Insert(ctx, tx, msgs)
}

// PublishedExactBelow is the size of the published table, as InnoDB estimates it, under
// which Status counts published rows exactly; above it Published is the estimate.
const PublishedExactBelow = sqlstore.PublishedExactBelow

// MigrationStatus is one schema migration and whether it is applied.
type MigrationStatus = sqlstore.MigrationStatus

var (
	_ outboxdriver.InboxDriver[*sql.Tx]   = (*Driver)(nil)
	_ outboxdriver.VersionDriver[*sql.Tx] = (*Driver)(nil)
)
