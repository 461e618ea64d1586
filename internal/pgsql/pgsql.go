// Package pgsql holds what the PostgreSQL drivers (outboxpgx, outboxsql) share: table
// names built from validated identifiers, the embedded migrations, the SQL text of every
// statement (sql.go for writes and the relay, admin.go for the operator's), and the Go
// that must behave the same in both (array literals, outcome bookkeeping, row scanning,
// and the operator's, lease and retention calls, written once over a Querier: DB). A
// driver adapts its pool and transactions to Querier and runs itself only what its
// client does its own way: the inserts, the fetch and outcome round trips (one pgx batch,
// or a database/sql transaction), LISTEN.
package pgsql

import (
	"bytes"
	"cmp"
	"embed"
	"fmt"
	"hash/fnv"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/shard"
)

// Shards is the number of lease shards. Keys hash to a shard in SQL (see the migration),
// so changing it means a migration.
const Shards = shard.Count

// Config names where the outbox lives.
type Config struct {
	// Schema holds the outbox tables. Defaults to "public".
	Schema string
	// Prefix is put before every table name ("billing_" gives billing_outbox, ...).
	// Defaults to none.
	Prefix string
	// RotateRows is how many rows a bucket of the pending ring takes before the next one
	// becomes current (migration 4); 0 means RotateRowsDefault.
	RotateRows int
	// MigrateCopyLimit is the most pending rows migration 4 copies while it holds the
	// outbox's lock; 0 means MigrateCopyLimitDefault, -1 no limit.
	MigrateCopyLimit int
}

// MigrateCopyLimitDefault: at about 5 µs a row, writers and relays wait half a second.
const MigrateCopyLimitDefault = 100_000

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// longestSuffix is the longest name built from Prefix (the other tables, the days'
// partitions and the index names stay below it).
const longestSuffix = "outbox_published_partition"

// Validate rejects names that are not plain lower-case SQL identifiers, rather than
// quoting its way around them: a name like `x"; DROP TABLE y; --` is a mistake or an
// attack, and PostgreSQL silently truncates names over 63 bytes, which can make two
// configured names collide.
func (c Config) Validate() error {
	schema := cmp.Or(c.Schema, "public")
	if !identRE.MatchString(schema) || len(schema) > 63 {
		return &outbox.ConfigError{Field: "Schema", Reason: fmt.Sprintf("%q must match [a-z_][a-z0-9_]* and be at most 63 bytes", schema)}
	}
	if c.Prefix != "" && (!identRE.MatchString(c.Prefix) || len(c.Prefix)+len(longestSuffix) > 63) {
		return &outbox.ConfigError{Field: "Prefix", Reason: fmt.Sprintf("%q must match [a-z_][a-z0-9_]* and be at most %d bytes", c.Prefix, 63-len(longestSuffix))}
	}
	if c.MigrateCopyLimit < -1 {
		return &outbox.ConfigError{Field: "MigrateCopyLimit", Reason: fmt.Sprintf("%d: want -1 (no limit) or more", c.MigrateCopyLimit)}
	}
	if c.RotateRows < 0 {
		return &outbox.ConfigError{Field: "RotateRows", Reason: fmt.Sprintf("%d is negative", c.RotateRows)}
	}
	if len(channel(schema, c.Prefix)) > 63 {
		return &outbox.ConfigError{Field: "Schema", Reason: "schema and prefix together are too long for a NOTIFY channel name (63 bytes)"}
	}
	return nil
}

func channel(schema, prefix string) string { return schema + "." + prefix + "outbox" }

// wakeKey derives the outbox's gate lock from its channel: 64 bits of FNV-1a, so that
// two outboxes of a database (and, all but certainly, other applications' advisory
// locks) never share it.
func wakeKey(channel string) int64 {
	h := fnv.New64a()
	h.Write([]byte("outbox-wake:" + channel))
	return int64(h.Sum64())
}

// Names are the quoted, schema-qualified names of the outbox objects.
type Names struct {
	Schema, Outbox, Published, Dead, Dedup, Leases, Relays, TokenSeq, Migrations, NotifyFunc string
	Inbox, Versions                                                                          string // the consumer side (migration 2)
	// Published history in daily partitions (migration 3): the function that creates a
	// day's partition, and the table that keeps the history from before the migration.
	PartitionFunc, PublishedLegacy string
	// The pending ring (migration 4): the table naming the current bucket, and the
	// function that reads it (the bucket column's default).
	Ring, BucketFunc string
	Replays          string // replay jobs (migration 9)
	SchemaLiteral    string // the schema as an SQL string literal
	Trigger          string // not schema-qualified
	Channel          string // NOTIFY channel, raw text
	ChannelLiteral   string // Channel as an SQL string literal
	ChannelIdent     string // Channel as a quoted identifier, for LISTEN
	// WakeKey is the advisory lock a waiting relay holds and writers test (migration
	// 7): a writer notifies only while a relay holds it.
	WakeKey        int64
	ShardMask      int
	prefix, schema string
	rotateRows     int
	copyLimit      int
}

// NewNames validates c and builds its names.
func NewNames(c Config) (*Names, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	schema := cmp.Or(c.Schema, "public")
	q := func(name string) string { return quote(schema) + "." + quote(c.Prefix+name) }
	ch := channel(schema, c.Prefix)
	return &Names{
		Schema:          quote(schema),
		Outbox:          q("outbox"),
		Leases:          q("outbox_leases"),
		Relays:          q("outbox_relays"),
		TokenSeq:        q("outbox_lease_token"),
		Published:       q("outbox_published"),
		Dead:            q("outbox_dead"),
		Dedup:           q("outbox_dedup"),
		Inbox:           q("outbox_inbox"),
		PartitionFunc:   q("outbox_published_partition"),
		PublishedLegacy: q("outbox_published_legacy"),
		Ring:            q("outbox_ring"),
		BucketFunc:      q("outbox_current_bucket"),
		Replays:         q("outbox_replays"),
		SchemaLiteral:   literal(schema),
		Versions:        q("outbox_versions"),
		Migrations:      q("outbox_migrations"),
		NotifyFunc:      q("outbox_notify"),
		Trigger:         quote(c.Prefix + "outbox_notify"),
		Channel:         ch,
		ChannelLiteral:  literal(ch),
		ChannelIdent:    quote(ch),
		WakeKey:         wakeKey(ch),
		ShardMask:       Shards - 1,
		prefix:          c.Prefix,
		rotateRows:      cmp.Or(c.RotateRows, RotateRowsDefault),
		copyLimit:       cmp.Or(c.MigrateCopyLimit, MigrateCopyLimitDefault),
		schema:          schema,
	}, nil
}

// Table returns the quoted, schema-qualified name of the outbox object called name
// ("outbox_published"; also an index or a sequence), with the prefix; Bare returns it without the schema (for RENAME
// TO), TableLiteral as an SQL string literal (for to_regclass), NameLiteral the bare name
// as a literal (for building partition names in SQL). Migrations call them.
func (n *Names) Table(name string) string        { return quote(n.schema) + "." + quote(n.prefix+name) }
func (n *Names) Bare(name string) string         { return quote(n.prefix + name) }
func (n *Names) TableLiteral(name string) string { return literal(n.Table(name)) }
func (n *Names) NameLiteral(name string) string  { return literal(n.prefix + name) }

// RingBuckets is the number of buckets of the pending ring (migration 4). Changing it
// means a migration.
const RingBuckets = 2

// Buckets lists the ring's buckets, 0 to RingBuckets-1, for the migrations.
func (n *Names) Buckets() []int {
	b := make([]int, RingBuckets)
	for i := range b {
		b[i] = i
	}
	return b
}

// Bucket returns the quoted, schema-qualified name of bucket i of the pending ring.
func (n *Names) Bucket(i int) string { return n.Table("outbox_b" + strconv.Itoa(i)) }

// Index returns the quoted name of one of the outbox table's indexes.
func (n *Names) Index(name string) string { return quote(n.prefix + "outbox_" + name + "_idx") }

// QualifiedIndex is Index with the schema, for statements that name an existing index.
func (n *Names) QualifiedIndex(name string) string { return n.Schema + "." + n.Index(name) }

// literal makes s an SQL string literal.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// quote double-quotes an identifier. Validate already allows only [a-z0-9_], so this is
// belt and braces.
func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migration is one schema version.
type Migration struct {
	Version int
	Name    string
	Up      string
	Down    string
}

// AllMigrations returns the migrations rendered for n, in version order.
func (n *Names) AllMigrations() ([]Migration, error) { return n.migrations() }

func (n *Names) migrations() ([]Migration, error) {
	files, err := fs.Glob(migrationFS, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	byVersion := map[int]*Migration{}
	for _, f := range files {
		base := strings.TrimPrefix(f, "migrations/")
		num, rest, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("pgsql: bad migration file name %q", base)
		}
		name, dir, _ := strings.Cut(rest, ".")
		raw, err := migrationFS.ReadFile(f)
		if err != nil {
			return nil, err
		}
		tmpl, err := template.New(base).Option("missingkey=error").Parse(string(raw))
		if err != nil {
			return nil, fmt.Errorf("pgsql: migration %s: %w", base, err)
		}
		var buf bytes.Buffer
		if err := tmpl.Execute(&buf, n); err != nil {
			return nil, fmt.Errorf("pgsql: migration %s: %w", base, err)
		}
		m := byVersion[v]
		if m == nil {
			m = &Migration{Version: v, Name: name}
			byVersion[v] = m
		}
		switch dir {
		case "up.sql":
			m.Up = buf.String()
		case "down.sql":
			m.Down = buf.String()
		default:
			return nil, fmt.Errorf("pgsql: bad migration file name %q", base)
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}
