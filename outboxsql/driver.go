package outboxsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Config names where the outbox lives. The zero value uses the public schema and no
// prefix. Every writer, relay and admin tool of one outbox must name the same tables,
// whichever package it uses (outboxsql or outboxpgx).
type Config struct {
	// Schema holds the outbox tables. Defaults to "public". Must match [a-z_][a-z0-9_]*.
	Schema string
	// Prefix goes before every table name. Defaults to none. Must match [a-z_][a-z0-9_]*.
	Prefix string
	// RotateRows is how many rows a bucket of the pending ring takes before the next
	// bucket becomes current (schema version 4). Defaults to 2,000. While a snapshot is
	// held open elsewhere in the database, a fetch walks at most about twice this many
	// rows it cannot use; fewer means more frequent rotations.
	RotateRows int
	// MigrateCopyLimit is the most pending messages MigrateUp copies when it makes the
	// pending table a ring (migration 4): the outbox is locked meanwhile, so writers and
	// relays wait about 5 µs a message. Above it MigrateUp refuses and changes nothing.
	// 0 means 100,000; -1 means no limit.
	MigrateCopyLimit int
}

// maxParams bounds the parameters of one INSERT statement. The wire protocol counts
// them in 16 bits (65,535 at most); staying well below leaves room for drivers that add
// their own.
const maxParams = 60_000

// maxRows is how many messages one INSERT statement carries; longer calls are split
// into several statements, run in call order.
const maxRows = maxParams / pgsql.InsertValuesColumns

// cachedRows is the largest statement kept ready besides the full one: Write calls are
// mostly small, and caching every size up to maxRows would hold gigabytes of SQL text.
const cachedRows = 64

// Driver writes messages in database/sql transactions on PostgreSQL, whatever the
// driver behind the *sql.DB (pgx's stdlib, lib/pq, ...), and is the relay's store
// (outboxdriver.Store) and the operator's (outboxdriver.Admin) on that *sql.DB. It is safe for
// concurrent use.
//
// Status, the dead-letter calls (DeadList, DeadCount, DeadReplay, DeadPurge,
// DeadPurgeAll), SyncLeases and DeletePublished are outboxpgx's too: both drivers run the
// same code for them (internal/pgsql), which documents them.
//
// It does not implement outboxdriver.Listener: database/sql has no portable LISTEN, so a relay
// on this store polls (see the package documentation).
type Driver struct {
	// *shared is embedded so that its methods are the Driver's; the alias keeps the field
	// unexported, out of the API.
	*shared

	db    *sql.DB
	names *pgsql.Names

	fetchSQL, fetchAfterSQL, fetchPrioSQL, completeSQL, insertFreshSQL string

	// insertCache holds INSERT texts by row count, built on first use, for 1..cachedRows
	// and maxRows rows.
	insertCache sync.Map // int -> string
}

// shared is the logic the Driver shares with outboxpgx, over its *sql.DB.
type shared = pgsql.DB

var (
	_ outboxdriver.WriteDriver[*sql.Tx] = (*Driver)(nil)
	_ outboxdriver.Store                = (*Driver)(nil)
	_ outboxdriver.Admin                = (*Driver)(nil)
)

// Validate checks c as New does: a *outbox.ConfigError names the field at fault.
func (c Config) Validate() error {
	_, err := c.names()
	return err
}

func (c Config) names() (*pgsql.Names, error) {
	return pgsql.NewNames(pgsql.Config{Schema: c.Schema, Prefix: c.Prefix, RotateRows: c.RotateRows, MigrateCopyLimit: c.MigrateCopyLimit})
}

// New returns a driver. db may be nil when the driver is used only to write in the
// caller's transactions; the relay, migrations and admin calls need it.
func New(db *sql.DB, config Config) (*Driver, error) {
	names, err := config.names()
	if err != nil {
		return nil, err
	}
	d := &Driver{
		db: db, names: names,
		fetchSQL:       names.Fetch(),
		fetchAfterSQL:  names.FetchAfter(),
		fetchPrioSQL:   names.FetchPriority(),
		completeSQL:    names.Complete(),
		insertFreshSQL: names.InsertFresh(),
	}
	d.shared = pgsql.NewDB(names, d.needDB, sqlQuerier{db}, d.txWith(nil),
		d.txWith(&sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}))
	return d, nil
}

func (d *Driver) needDB() error {
	if d.db == nil {
		return errors.New("outboxsql: this call needs a database: pass a *sql.DB to outboxsql.New")
	}
	return nil
}

// insertSQL returns the INSERT text for msgs, which have a priority when prio is set
// (those are rare enough to go uncached).
func (d *Driver) insertSQL(msgs []outbox.Message, prio bool) string {
	if prio {
		return d.names.InsertValues(len(msgs), true)
	}
	if len(msgs) == 1 && msgs[0].DedupKey == "" {
		return d.insertFreshSQL // the same parameters as one row of InsertValues
	}
	rows := len(msgs)
	if rows > cachedRows && rows != maxRows {
		return d.names.InsertValues(rows, false)
	}
	if q, ok := d.insertCache.Load(rows); ok {
		return q.(string)
	}
	q := d.names.InsertValues(rows, false)
	if rows == 1 {
		q = d.names.InsertOne() // the same parameters as one row of InsertValues
	}
	d.insertCache.Store(rows, q)
	return q
}

// Insert implements outboxdriver.WriteDriver. Messages go in multi-row INSERT statements of at
// most 6,000 rows each, run one after the other, so their seq order is the call order.
// Every parameter is a string, []byte, time.Time or nil, which any database/sql driver
// for PostgreSQL can bind.
func (d *Driver) Insert(ctx context.Context, tx *sql.Tx, msgs []outbox.Message) ([]string, error) {
	if tx == nil {
		return nil, errors.New("outboxsql: nil transaction: Write must run inside the caller's transaction (db.BeginTx)")
	}
	var written []string
	prio, per, cols := pgsql.HasPriority(msgs), maxRows, pgsql.InsertValuesColumns
	if prio {
		cols++
		per = maxParams / cols
	}
	args := make([]any, 0, min(len(msgs), per)*cols)
	for start := 0; start < len(msgs); start += per {
		chunk := msgs[start:min(start+per, len(msgs))]
		args = args[:0]
		for i := range chunk {
			m := &chunk[i]
			payload := m.Payload
			if payload == nil {
				payload = []byte{} // payload is NOT NULL; some drivers send a nil slice as NULL
			}
			headers, err := pgsql.EncodeHeaders(m.Headers)
			if err != nil {
				return nil, fmt.Errorf("outbox insert: message %d: headers: %w", start+i, err)
			}
			var deliverAt any
			if !m.DeliverAt.IsZero() {
				deliverAt = m.DeliverAt
			}
			// Column order of pgsql.InsertValues.
			args = append(args, m.ID.String(), m.Topic, m.Key, m.AggregateType, m.EventType, m.ContentType,
				payload, headers, m.DedupKey, deliverAt)
			if prio {
				args = append(args, m.Priority)
			}
		}
		var err error
		if written, err = d.insertChunk(ctx, tx, d.insertSQL(chunk, prio), args, written); err != nil {
			return nil, pgsql.InsertError(err, prio)
		}
	}
	return pgsql.SkippedKeys(msgs, written), nil
}

// insertChunk runs one INSERT and appends the dedup keys it wrote to written.
func (d *Driver) insertChunk(ctx context.Context, tx *sql.Tx, query string, args []any, written []string) ([]string, error) {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return written, err
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return written, err
		}
		written = append(written, k)
	}
	if err := rows.Err(); err != nil {
		return written, err
	}
	return written, rows.Close()
}
