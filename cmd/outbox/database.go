package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxpgx"
)

// databaseURLDefault is a local server, as psql would reach it without settings.
const databaseURLDefault = "postgres://localhost:5432/postgres?sslmode=disable"

// dbFlags are the flags naming an outbox: where the database is and which schema and
// table prefix hold it.
type dbFlags struct {
	url            string
	schema, prefix string
	maxCopy        int // migrate up --max-copy
	rotateRows     int // relay --rotate-rows
}

// addDBFlags defines --database-url (unless withURL is false: `migrate sql` needs no
// database), --schema and --prefix.
func addDBFlags(fs *flag.FlagSet, withURL bool) *dbFlags {
	o := &dbFlags{}
	if withURL {
		fs.StringVar(&o.url, "database-url", databaseURLDefault,
			"PostgreSQL connection `URL` (postgres://user:password@host:port/db?sslmode=...) or key=value\n"+
				"string; the default is a local server. Passwords never appear in output.")
	}
	fs.StringVar(&o.schema, "schema", "public", "PostgreSQL `schema` holding the outbox tables")
	fs.StringVar(&o.prefix, "prefix", "", "`prefix` of the outbox table names (billing_ gives billing_outbox)")
	return o
}

// dbConfigFlags maps outboxpgx.Config fields to their flags, for error messages.
var dbConfigFlags = map[string]string{"Schema": "schema", "Prefix": "prefix", "RotateRows": "rotate-rows", "MigrateCopyLimit": "max-copy"}

func (o *dbFlags) config() outboxpgx.Config {
	return outboxpgx.Config{Schema: o.schema, Prefix: o.prefix, MigrateCopyLimit: o.maxCopy, RotateRows: o.rotateRows}
}

// driver returns a driver without a pool, validating --schema and --prefix.
func (o *dbFlags) driver() (*outboxpgx.Driver, error) {
	drv, err := outboxpgx.New(nil, o.config())
	if err != nil {
		return nil, flagError(err, dbConfigFlags)
	}
	return drv, nil
}

// poolConfig parses --database-url. Its error never quotes the URL: pgx's parse errors
// do, with only best-effort masking of the password.
func (o *dbFlags) poolConfig(appName string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(o.url)
	if err != nil {
		return nil, usageErrorf("--database-url: not a valid PostgreSQL connection string (%s): want postgres://user:password@host:port/database?sslmode=... or host=... user=... dbname=... pairs",
			redactDSN(o.url))
	}
	if _, set := cfg.ConnConfig.RuntimeParams["application_name"]; !set {
		cfg.ConnConfig.RuntimeParams["application_name"] = appName
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	// A relay runs a fetch, an outcome write, a lease renewal and the cleaner at once, and
	// its LISTEN connection leaves the pool: pgxpool's default (4 on a 2-core host) would
	// make them queue for each other.
	if !strings.Contains(o.url, "pool_max_conns") {
		cfg.MaxConns = max(cfg.MaxConns, 8)
	}
	return cfg, nil
}

// open validates the flags, connects, and checks the connection. The caller closes the
// pool.
func (o *dbFlags) open(ctx context.Context, appName string) (*pgxpool.Pool, *outboxpgx.Driver, error) {
	if _, err := o.driver(); err != nil {
		return nil, nil, err
	}
	cfg, err := o.poolConfig(appName)
	if err != nil {
		return nil, nil, err
	}
	return o.connect(ctx, cfg)
}

func (o *dbFlags) connect(ctx context.Context, cfg *pgxpool.Config) (*pgxpool.Pool, *outboxpgx.Driver, error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, cfg.ConnConfig.ConnectTimeout+5*time.Second)
		err = pool.Ping(pctx)
		cancel()
		if err != nil {
			pool.Close()
		}
	}
	if err != nil {
		// pgx's connect errors name the user, database and address, not the password;
		// the output scrubber is there should that change.
		return nil, nil, fmt.Errorf("connect to PostgreSQL at %s: %w", redactDSN(o.url), err)
	}
	drv, err := outboxpgx.New(pool, o.config())
	if err != nil {
		pool.Close()
		return nil, nil, flagError(err, dbConfigFlags)
	}
	return pool, drv, nil
}

// openMigrated is open for the commands that need the outbox schema in place: it fails
// with advice when the schema is missing or behind.
func (o *dbFlags) openMigrated(ctx context.Context, appName string) (*pgxpool.Pool, *outboxpgx.Driver, error) {
	pool, drv, err := o.open(ctx, appName)
	if err != nil {
		return nil, nil, err
	}
	if _, err := o.checkMigrated(ctx, drv); err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, drv, nil
}

// checkMigrated fails with advice when the outbox schema is missing or behind. A
// missing migration that this code runs without (Deferrable: relays are upgraded before
// it is applied) is accepted and reported in deferred.
func (o *dbFlags) checkMigrated(ctx context.Context, drv *outboxpgx.Driver) (deferred []int, err error) {
	st, err := drv.MigrationStatus(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the outbox schema version: %w", err)
	}
	var missing []int
	for _, m := range st {
		switch {
		case m.Applied:
		case m.Deferrable:
			deferred = append(deferred, m.Version)
		default:
			missing = append(missing, m.Version)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("the outbox schema in %q (prefix %q) is not migrated (missing versions %v): run 'outbox migrate up' with the same --database-url, --schema and --prefix",
			o.schema, o.prefix, missing)
	}
	return deferred, nil
}

// flagError turns a *outbox.ConfigError into a usage error naming the flag that set the
// field (fields maps config field names to flag names).
func flagError(err error, fields map[string]string) error {
	var ce *outbox.ConfigError
	if errors.As(err, &ce) {
		if name, ok := fields[ce.Field]; ok {
			return usageErrorf("--%s: %s", name, ce.Reason)
		}
		return &usageError{msg: err.Error()}
	}
	return err
}
