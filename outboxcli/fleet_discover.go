package outboxcli

import (
	"context"
	"fmt"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// An entry of the outboxes list is a rule when it has schemas: (a pattern over the
// schemas of its database) or databases: (a pattern over the databases of its server,
// each searched for the entry's schema, or for its schemas: pattern). A rule finds the
// outboxes that exist: the schemas that hold the outbox's migrations table with the
// entry's prefix.

// rule is what an entry of the outboxes list looks for; the zero value is no rule.
type rule struct {
	schemas   string // pattern over schema names; "" for the entry's schema
	databases string // pattern over database names; "" for the entry's database
}

func (r rule) isRule() bool { return r.schemas != "" || r.databases != "" }

// ruleOf reads an entry's rule keys.
func ruleOf(item outboxItem) rule {
	var r rule
	if v, ok := item.values["schemas"]; ok {
		r.schemas = v.values[0]
	}
	if v, ok := item.values["databases"]; ok {
		r.databases = v.values[0]
	}
	return r
}

// String describes the rule for logs and errors.
func (r rule) String() string {
	var parts []string
	if r.databases != "" {
		parts = append(parts, "databases: "+r.databases)
	}
	if r.schemas != "" {
		parts = append(parts, "schemas: "+r.schemas)
	}
	return strings.Join(parts, ", ")
}

// ruleFound is what one database gave a rule: the outboxes found there, or why it could
// not be searched.
type ruleFound struct {
	db  *dbFlags   // the database searched (its URL names it)
	in  []*dbFlags // the outboxes found, one per schema
	err error
}

// querier runs a query: a *pgxpool.Pool or a *pgx.Conn.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// find applies r to d (the entry's settings) and returns, per database searched, what
// it found. open gives a connection to a database, and the function that lets go of it.
// An error is returned when the databases themselves cannot be listed; a database that
// cannot be searched is reported in its ruleFound, and the others are searched.
func (r rule) find(ctx context.Context, d *dbFlags, open func(*dbFlags) (querier, func(), error)) ([]ruleFound, error) {
	dbs := []*dbFlags{d}
	if r.databases != "" {
		var err error
		if dbs, err = matchingDatabases(ctx, d, r.databases); err != nil {
			return nil, fmt.Errorf("list the databases: %w", err)
		}
	}
	pattern := r.schemas
	if pattern == "" {
		pattern = literalPattern(d.schema)
	}
	out := make([]ruleFound, 0, len(dbs))
	for _, db := range dbs {
		found := ruleFound{db: db}
		q, done, err := open(db)
		var schemas []string
		if err == nil {
			schemas, err = matchingSchemas(ctx, q, pattern, db.prefix)
			done()
		}
		found.err = err
		for _, s := range schemas {
			one := *db
			one.schema = s
			found.in = append(found.in, &one)
		}
		out = append(out, found)
	}
	return out, nil
}

// connectOnce opens a connection of its own to d's database for one search, and
// returns it with the function that closes it.
func connectOnce(ctx context.Context, d *dbFlags) (querier, func(), error) {
	t, err := d.target("outbox")
	if err != nil {
		return nil, nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, t.pg.ConnConfig)
	if err != nil {
		return nil, nil, err
	}
	return conn, func() { _ = conn.Close(context.WithoutCancel(ctx)) }, nil
}

// literalPattern is a shell pattern that matches s alone.
func literalPattern(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// matchingSchemas returns the schemas of q's database that match pattern and hold an
// outbox with prefix (its migrations table).
func matchingSchemas(ctx context.Context, q querier, pattern, prefix string) ([]string, error) {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rows, err := q.Query(qctx, `SELECT n.nspname FROM pg_namespace n JOIN pg_class c ON c.relnamespace = n.oid
		WHERE c.relname = $1 AND c.relkind IN ('r', 'p') ORDER BY 1`, prefix+"outbox_migrations")
	if err != nil {
		return nil, err
	}
	var schemas []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		if ok, _ := path.Match(pattern, s); ok {
			schemas = append(schemas, s)
		}
	}
	return schemas, rows.Err()
}

// matchingDatabases returns the databases of d's server whose names match pattern (a
// shell pattern), each as d naming that database: the ones that take connections, not
// the templates. It asks over a connection of its own to d's database (a PostgreSQL
// one: the callers check).
func matchingDatabases(ctx context.Context, d *dbFlags, pattern string) ([]*dbFlags, error) {
	conn, done, err := connectOnce(ctx, d)
	if err != nil {
		return nil, err
	}
	defer done()
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rows, err := conn.Query(qctx, `SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate ORDER BY 1`)
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	var out []*dbFlags
	for _, name := range names {
		if ok, _ := path.Match(pattern, name); !ok {
			continue
		}
		one := *d
		if one.url, err = withDatabase(d.url, name); err != nil {
			return nil, err
		}
		out = append(out, &one)
	}
	return out, nil
}

// withDatabase returns the PostgreSQL connection string dsn naming database name
// instead of its own: a postgres:// URL with that path, or key=value pairs with dbname
// set last (the last of a key wins).
func withDatabase(dsn, name string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", usageErrorf("databases: the database URL does not parse as a URL (%s)", redactDSN(dsn))
		}
		u.Path, u.RawPath = "/"+name, ""
		return u.String(), nil
	}
	quoted := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(name)
	return dsn + " dbname='" + quoted + "'", nil
}
