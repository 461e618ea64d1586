// Package sqlstore is the database/sql engine behind the SQLite and MySQL stores
// (outboxsqlite, outboxmysql): the write path, the relay's Store, the operator's Admin
// and the migration runner, written once in Go over a small Dialect that holds what
// differs between the databases (SQL fragments, time arithmetic, lock clauses, how a
// write transaction begins).
//
// The statements are plain and short, one job each, run in one transaction where they
// must agree (outcomes, leases). PostgreSQL's drivers (internal/pgsql) do the same work
// in single statements with CTEs and arrays; neither SQLite nor MySQL has both, so the
// engine does in Go what those statements do in SQL, and says why at each step.
//
// Lists that select rows to lock or change (seqs, shards, tokens) are written into the
// SQL as integer literals, in chunks: they are int64 values formatted by strconv, so
// there is nothing to inject and no placeholder limit to hit (MySQL allows 65,535 per
// statement, SQLite 32,766), and the optimizer sees constants it looks up by primary
// key. The relay's lists of a fetch (the seqs it holds, the keys it holds, thousands of
// each) travel as one JSON array parameter, expanded in SQL by json_each or JSON_TABLE
// into a set the database materializes once per query.
package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strconv"
	"strings"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/shard"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Shards is the number of lease shards, as in PostgreSQL.
const Shards = shard.Count

// Querier is what the engine needs from a *sql.DB, *sql.Tx or *sql.Conn.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Tx is a transaction the engine began (Dialect.BeginWrite). *sql.Tx is one.
type Tx interface {
	Querier
	Commit() error
	Rollback() error
}

// Dialect is what differs between the databases the engine runs on. Its SQL fragments
// are trusted text: the engine pastes them into statements.
type Dialect struct {
	// Package names the store package in error messages ("outboxsqlite").
	Package string
	// MaxIdentLen is the longest identifier the database keeps without truncating.
	MaxIdentLen int
	// MaxParams is the most placeholders one statement may carry.
	MaxParams int
	// Quote quotes an identifier (already validated as [a-z_][a-z0-9_]*).
	Quote func(ident string) string

	// Time. Times are stored as the database likes them, and cross the driver as
	// integer microseconds since the Unix epoch (UTC), so that no driver setting
	// (parseTime and loc, _time_format) changes what is read or written.

	// Now is the database's current time, as stored.
	Now string
	// AddMicros returns the SQL for time t plus n microseconds (n an integer expression).
	AddMicros func(t, n string) string
	// ToMicros returns the SQL for a stored time t as integer microseconds since the epoch.
	ToMicros func(t string) string
	// FromMicros returns the SQL for the stored time of n microseconds since the epoch.
	FromMicros func(n string) string
	// Greatest is the name of the multi-argument maximum that returns NULL when an
	// argument is NULL ("max" in SQLite, "GREATEST" in MySQL).
	Greatest string

	// WaitingKey is the column that equals the key on pending rows that wait
	// (next_attempt_at > created_at) and is indexed for that use with seq: the key itself
	// where a partial index covers those rows (SQLite), a generated column that is NULL on
	// the others where there are no partial indexes (MySQL).
	WaitingKey string

	// UseIndex returns the hint, after a table name in FROM, that makes the database
	// look rows up through the named index, or "" where the planner needs no telling.
	// MySQL needs telling: InnoDB counts the NULLs of an index as one value, so once most
	// of the waiting index is NULL its statistics say a lookup returns half the table,
	// and MySQL scans the whole table once per fetched row instead.
	UseIndex func(index string) string

	// IntList and StringList return a subquery with one column: the integers, or the
	// strings, of the JSON array passed as the parameter p.
	IntList, StringList func(p string) string
	// KeySeqList, when set, returns a subquery with the columns k and s: the pairs of the
	// JSON array of [key, seq] arrays passed as the parameter p. Nil writes such a list as
	// OR'ed conditions instead (MySQL plans the JSON_TABLE join badly).
	KeySeqList func(p string) string

	// OnConflictIgnore is the clause after INSERT ... VALUES that skips a row whose
	// value in the unique column col is taken. A concurrent uncommitted insert of the
	// same value must make it wait, and insert if that one rolls back.
	OnConflictIgnore func(col string) string
	// OnConflictUpdate is the clause after INSERT ... VALUES that starts the SET list of
	// an upsert on the primary key col.
	OnConflictUpdate func(col string) string

	// Row lock clauses appended to a SELECT in a write transaction; empty where the
	// write transaction already excludes every other writer (SQLite).
	ForUpdate, ForShare, ForUpdateSkipLocked string

	// BeginWrite begins a transaction for the store's own writes (outcomes, leases,
	// cleanup, dead-letter tooling).
	BeginWrite func(ctx context.Context, db *sql.DB) (Tx, error)
	// SnapshotIsolation is the isolation level of Status's read-only transaction: one
	// that reads a single snapshot.
	SnapshotIsolation sql.IsolationLevel
	// Retry reports whether a write transaction failed in a way that running it again
	// may cure (a deadlock victim). Nil means never.
	Retry func(error) bool
	// IsDuplicate reports whether err is a primary-key or unique violation. Such a
	// failed statement leaves the transaction usable in both databases.
	IsDuplicate func(error) bool
	// Undefined reports whether err says a statement named a column or an index the
	// table does not have (a migration not applied yet).
	Undefined func(error) bool

	// PublishedEstimate, when not empty, is a query with one parameter (the published
	// table's unquoted name) returning the database's estimate of its row count. Status
	// counts exactly below PublishedExactBelow estimated rows.
	PublishedEstimate string

	Migrations Migrations
}

// Migrations is how a dialect's schema is created and versioned.
type Migrations struct {
	// FS holds NNN_name.up.sql and NNN_name.down.sql files: text/template sources over
	// *Names, statements ending with ";" at the end of a line, comment lines starting
	// with "--".
	FS fs.FS
	// Table is the CREATE TABLE IF NOT EXISTS statement of the migrations table, with
	// %s for its quoted name; columns version, name, applied_at.
	Table string
	// TableExists is a query with one parameter (a table's unquoted name) returning
	// 1 if the table exists, 0 if not.
	TableExists string
	// Locked runs fn holding the migration lock of the outbox named by lockName: in
	// one transaction where DDL is transactional, under a named lock where it is not.
	Locked func(ctx context.Context, db *sql.DB, lockName string, fn func(Querier) error) error
	// Redone, where DDL is not transactional, reports whether a migration's statement
	// failed only because an interrupted run already made its change (a column or an
	// index that exists, one that is gone): running the migration again then finishes
	// it. Nil where a migration applies whole or not at all.
	Redone func(error) bool
	// ScriptBegin and ScriptEnd wrap the script of MigrationSQL.
	ScriptBegin, ScriptEnd string
}

// PublishedExactBelow is the estimated size of the published table below which Status
// counts published rows exactly, where the dialect can estimate it.
const PublishedExactBelow = 100_000

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// longestSuffix is the longest name built from the prefix.
const longestSuffix = "outbox_dedup_created_idx"

// ValidatePrefix rejects a table prefix that is not a plain lower-case identifier short
// enough for every name built from it, rather than quoting its way around it: a prefix
// like "x`; DROP TABLE y; --" is a mistake or an attack, and a name the database
// truncates could make two outboxes share a table.
func ValidatePrefix(prefix string, maxIdentLen int) error {
	if prefix == "" {
		return nil
	}
	if max := maxIdentLen - len(longestSuffix); !identRE.MatchString(prefix) || len(prefix) > max {
		return &outbox.ConfigError{Field: "Prefix", Reason: fmt.Sprintf("%q must match [a-z_][a-z0-9_]* and be at most %d bytes", prefix, max)}
	}
	return nil
}

// Names are the quoted names of the outbox tables. Migration templates use them.
type Names struct {
	Outbox, Published, Dead, Dedup, Leases, Relays, Migrations string
	Inbox, Versions                                            string // the consumer side (migration 2)

	prefix string
	quote  func(string) string
}

// Index returns the quoted name of an index (index names share one namespace per
// database in SQLite, so they carry the prefix too).
func (n *Names) Index(name string) string { return n.quote(n.prefix + "outbox_" + name + "_idx") }

// Raw returns the unquoted name of one of the outbox tables ("outbox_published").
func (n *Names) Raw(table string) string { return n.prefix + table }

// ShardValues is the VALUES list that seeds the leases table: one row per shard.
func (n *Names) ShardValues() string {
	rows := make([]string, Shards)
	for i := range rows {
		rows[i] = "(" + strconv.Itoa(i) + ")"
	}
	return strings.Join(rows, ", ")
}

// Store is the engine: one outbox in one database. outboxsqlite's and outboxmysql's
// Drivers embed it, so its exported methods are theirs and their doc comments here are
// the user documentation; a method that holds for one database only says so. It is safe
// for concurrent use.
type Store struct {
	db    *sql.DB
	d     *Dialect
	names *Names
	r     *strings.Replacer
}

// New returns a store for the outbox whose tables carry prefix. db may be nil for a
// store that only writes in callers' transactions and renders migrations.
func New(db *sql.DB, d *Dialect, prefix string) (*Store, error) {
	if err := ValidatePrefix(prefix, d.MaxIdentLen); err != nil {
		return nil, err
	}
	q := func(s string) string { return d.Quote(prefix + s) }
	n := &Names{
		Outbox: q("outbox"), Published: q("outbox_published"), Dead: q("outbox_dead"), Dedup: q("outbox_dedup"),
		Leases: q("outbox_leases"), Relays: q("outbox_relays"), Migrations: q("outbox_migrations"),
		Inbox: q("outbox_inbox"), Versions: q("outbox_versions"),
		prefix: prefix, quote: d.Quote,
	}
	r := strings.NewReplacer(
		"{{outbox}}", n.Outbox, "{{published}}", n.Published, "{{dead}}", n.Dead, "{{dedup}}", n.Dedup,
		"{{leases}}", n.Leases, "{{relays}}", n.Relays, "{{migrations}}", n.Migrations,
		"{{inbox}}", n.Inbox, "{{versions}}", n.Versions,
		"{{key}}", d.Quote("key"), "{{waiting_key}}", d.Quote(d.WaitingKey), "{{now}}", d.Now,
	)
	return &Store{db: db, d: d, names: n, r: r}, nil
}

// sql expands the {{...}} names of a statement.
func (s *Store) sql(q string) string { return s.r.Replace(q) }

func (s *Store) needDB() error {
	if s.db == nil {
		return fmt.Errorf("%s: this call needs a *sql.DB: pass one to %s.New", s.d.Package, s.d.Package)
	}
	return nil
}

// inWriteTx runs fn in a write transaction, committing when it returns nil, and runs it
// again (up to three times in all) when the dialect says the failure is worth a retry.
func (s *Store) inWriteTx(ctx context.Context, fn func(Querier) error) error {
	if err := s.needDB(); err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		err := s.writeTxOnce(ctx, fn)
		if err == nil || attempt == 3 || s.d.Retry == nil || !s.d.Retry(err) || ctx.Err() != nil {
			return err
		}
	}
}

func (s *Store) writeTxOnce(ctx context.Context, fn func(Querier) error) error {
	tx, err := s.d.BeginWrite(ctx, s.db)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// ints renders integers as a comma-separated SQL list. See the package doc for why
// integers are literals.
func ints[T ~int | ~int64](vs []T) string {
	var b strings.Builder
	for i, v := range vs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(int64(v), 10))
	}
	return b.String()
}

// leaseMatch is a condition that holds for the lease rows (columns prefixed by alias,
// such as "l.") whose shard and token are one of ls: the shard list lets the database
// find the rows by primary key.
func leaseMatch(alias string, ls []outboxdriver.Lease) string {
	var shards, cases strings.Builder
	for i, l := range ls {
		if i > 0 {
			shards.WriteByte(',')
		}
		shards.WriteString(strconv.Itoa(l.Shard))
		fmt.Fprintf(&cases, " WHEN %d THEN %d", l.Shard, l.Token)
	}
	a := alias
	return a + "shard IN (" + shards.String() + ") AND " + a + "token = CASE " + a + "shard" + cases.String() + " END"
}

// chunks calls fn with consecutive pieces of vs of at most size elements.
func chunks[T any](vs []T, size int, fn func([]T) error) error {
	for len(vs) > 0 {
		n := min(size, len(vs))
		if err := fn(vs[:n]); err != nil {
			return err
		}
		vs = vs[n:]
	}
	return nil
}

// listChunk bounds the literals of one IN list: well within what either database parses
// quickly, and within MySQL's range optimizer memory.
const listChunk = 5000

// placeholders returns "?, ?, ..." with n marks.
func placeholders(n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat("?, ", n-1) + "?"
}

// collect runs a query and scans every row with scan.
func collect[T any](ctx context.Context, q Querier, scan func(*sql.Rows) (T, error), query string, args ...any) ([]T, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, rows.Close()
}

func scanInt64(r *sql.Rows) (int64, error) {
	var v int64
	err := r.Scan(&v)
	return v, err
}

func scanString(r *sql.Rows) (string, error) {
	var v string
	err := r.Scan(&v)
	return v, err
}

// affected returns the rows a statement changed.
func affected(res sql.Result, err error) (int, error) {
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}

var errNilTx = errors.New("nil transaction: Write must run inside the caller's transaction (db.BeginTx)")
