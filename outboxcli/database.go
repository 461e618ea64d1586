package outboxcli

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxsqlite"
)

// databaseURLDefault is a local server, as psql would reach it without settings.
const databaseURLDefault = "postgres://localhost:5432/postgres?sslmode=disable"

// dbKind is the database a --database-url names, chosen by its scheme.
type dbKind int

const (
	dbPostgres dbKind = iota // postgres://, postgresql:// or libpq's key=value form
	dbMySQL                  // mysql:// (MySQL or MariaDB)
	dbSQLite                 // sqlite:///absolute/path or sqlite:relative/path
)

func (k dbKind) String() string {
	return [...]string{"PostgreSQL", "MySQL", "SQLite"}[k]
}

// storeDriver is what the commands need of an outbox, whatever the database: the
// relay's store, the operator's Admin, and the migrations. outboxpgx, outboxmysql and
// outboxsqlite implement it.
type storeDriver interface {
	outboxdriver.Store
	outboxdriver.Admin
	MigrateUp(ctx context.Context, target int) ([]int, error)
	MigrateDown(ctx context.Context, target int) ([]int, error)
	MigrationStatus(ctx context.Context) ([]outboxpgx.MigrationStatus, error)
	MigrationSQL() (string, error)
}

// dbFlags are the flags naming an outbox: where the database is and which schema and
// table prefix hold it.
type dbFlags struct {
	url            string
	schema, prefix string
	maxCopy        int    // migrate up --max-copy
	rotateRows     int    // relay --rotate-rows
	create         bool   // a missing SQLite file is created (migrate up); otherwise an error
	outbox         string // --outbox: selectOutbox has set the other fields from the config file
}

// addDBFlags defines --database-url (unless withURL is false: `migrate sql` needs no
// database), --schema and --prefix.
func addDBFlags(fs *flag.FlagSet, withURL bool) *dbFlags {
	o := &dbFlags{}
	if withURL {
		fs.StringVar(&o.url, "database-url", databaseURLDefault,
			"the outbox's database; its scheme picks the store: postgres://user:password@host:port/db?sslmode=...\n"+
				"(or libpq's key=value form), mysql://user:password@host:port/db (MySQL, MariaDB), or\n"+
				"sqlite:///absolute/path.db. The default is a local PostgreSQL. Passwords never appear in output.")
	} else {
		fs.StringVar(&o.url, "database-url", databaseURLDefault,
			"only its scheme is read, to pick the SQL dialect: postgres://, mysql:// or sqlite:")
	}
	fs.StringVar(&o.schema, "schema", "public", "PostgreSQL `schema` holding the outbox tables (MySQL and SQLite have none here:\nthe outbox lives in the database the URL names)")
	fs.StringVar(&o.prefix, "prefix", "", "`prefix` of the outbox table names (billing_ gives billing_outbox)")
	fs.StringVar(&o.outbox, "outbox", "", "with a config file's outboxes list: the outbox of that `name` (its database, schema and prefix,\nand for the relay its other settings)")
	return o
}

// dbConfigFlags maps the drivers' Config fields to their flags, for error messages.
var dbConfigFlags = map[string]string{"Schema": "schema", "Prefix": "prefix", "RotateRows": "rotate-rows", "MigrateCopyLimit": "max-copy"}

// dbTarget is a checked --database-url: the database kind and what its driver connects
// with. Nothing is connected yet.
type dbTarget struct {
	kind  dbKind
	pg    *pgxpool.Config // PostgreSQL
	mysql *mysql.Config   // MySQL
	path  string          // SQLite: the database file
}

// kind reads the database kind from --database-url's scheme.
func (o *dbFlags) kind() (dbKind, error) {
	scheme, _, found := strings.Cut(o.url, ":")
	if !found || strings.ContainsAny(scheme, " =") { // key=value form
		return dbPostgres, nil
	}
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		return dbPostgres, nil
	case "mysql":
		return dbMySQL, nil
	case "sqlite", "sqlite3":
		return dbSQLite, nil
	}
	return 0, usageErrorf("--database-url: unknown scheme %q: want postgres://, mysql:// or sqlite:", scheme)
}

// driver returns a driver that is not connected, validating --schema and --prefix: for
// `migrate sql`, and for checking flags before connecting.
func (o *dbFlags) driver() (storeDriver, error) {
	kind, err := o.kind()
	if err != nil {
		return nil, err
	}
	return o.newDriver(kind, nil, nil)
}

// newDriver makes the driver of kind on pool (PostgreSQL) or db (the others); both may
// be nil for a driver that is not connected.
func (o *dbFlags) newDriver(kind dbKind, pool *pgxpool.Pool, db *sql.DB) (storeDriver, error) {
	if kind != dbPostgres && o.schema != "public" {
		return nil, usageErrorf("--schema: %s has no schemas here: the outbox lives in the database the URL names (use --prefix to keep outboxes apart)", kind)
	}
	var drv storeDriver
	var err error
	switch kind {
	case dbPostgres:
		drv, err = outboxpgx.New(pool, outboxpgx.Config{Schema: o.schema, Prefix: o.prefix, MigrateCopyLimit: o.maxCopy, RotateRows: o.rotateRows})
	case dbMySQL:
		drv, err = outboxmysql.New(db, outboxmysql.Config{Prefix: o.prefix})
	case dbSQLite:
		drv, err = outboxsqlite.New(db, outboxsqlite.Config{Prefix: o.prefix})
	}
	if err != nil {
		return nil, flagError(err, dbConfigFlags)
	}
	return drv, nil
}

// target checks --database-url and the naming flags without connecting. Its errors
// never quote the URL: drivers' parse errors may, with only best-effort masking of the
// password.
func (o *dbFlags) target(appName string) (*dbTarget, error) {
	if _, err := o.driver(); err != nil {
		return nil, err
	}
	kind, _ := o.kind()
	t := &dbTarget{kind: kind}
	var err error
	switch kind {
	case dbPostgres:
		t.pg, err = o.poolConfig(appName)
	case dbMySQL:
		t.mysql, err = mysqlConfig(o.url)
	case dbSQLite:
		t.path, err = sqlitePath(o.url)
	}
	if err != nil {
		return nil, err
	}
	return t, nil
}

// poolConfig parses a PostgreSQL --database-url.
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

// mysqlConfig turns mysql://user:password@host:port/database?param=value into the
// driver's configuration; the parameters are the driver's DSN parameters (tls,
// timeout, ...). The port defaults to 3306.
func mysqlConfig(s string) (*mysql.Config, error) {
	bad := func(why string) error {
		return usageErrorf("--database-url: not a valid MySQL URL (%s): %s; want mysql://user:password@host:port/database", redactDSN(s), why)
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, bad("it does not parse") // url's error quotes s
	}
	db := strings.TrimPrefix(u.Path, "/")
	if u.Host == "" || db == "" || strings.Contains(db, "/") {
		return nil, bad("it needs a host and a database")
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "3306")
	}
	cfg, err := mysql.ParseDSN("tcp(" + host + ")/" + db + "?" + u.RawQuery)
	if err != nil {
		return nil, bad("its parameters are not the driver's")
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	return cfg, nil
}

// sqlitePath returns the file a sqlite: URL names: sqlite:///var/lib/app.db (absolute)
// or sqlite:app.db (relative to the working directory).
func sqlitePath(s string) (string, error) {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return "", usageErrorf("--database-url: not a valid SQLite URL: want sqlite:///absolute/path.db or sqlite:relative/path.db")
	case u.Opaque != "":
		return u.Opaque, nil
	case u.Host != "":
		return "", usageErrorf("--database-url: a SQLite URL names a file, not a host (%q): want sqlite:///absolute/path.db or sqlite:relative/path.db", u.Host)
	case u.Path == "":
		return "", usageErrorf("--database-url: the SQLite URL names no file: want sqlite:///absolute/path.db or sqlite:relative/path.db")
	}
	return u.Path, nil
}

// openedStore is an outbox a command is connected to.
type openedStore struct {
	storeDriver
	kind dbKind
	// pg is the PostgreSQL driver (partitions, LISTEN); nil on the other databases.
	pg    *outboxpgx.Driver
	pool  *pgxpool.Pool // PostgreSQL's connections
	db    *sql.DB       // the other databases'
	ping  func(context.Context) error
	close func()
}

// open validates the flags, connects, and checks the connection. The caller closes the
// store.
func (o *dbFlags) open(ctx context.Context, appName string) (*openedStore, error) {
	t, err := o.target(appName)
	if err != nil {
		return nil, err
	}
	return o.connect(ctx, t)
}

// connect connects to t and checks the connection.
func (o *dbFlags) connect(ctx context.Context, t *dbTarget) (*openedStore, error) {
	s := &openedStore{kind: t.kind}
	var pool *pgxpool.Pool
	var db *sql.DB
	var err error
	switch t.kind {
	case dbPostgres:
		pool, err = pgxpool.NewWithConfig(ctx, t.pg)
		if err == nil {
			s.ping, s.close = pool.Ping, pool.Close
		}
	case dbMySQL:
		var c driver.Connector
		if c, err = mysql.NewConnector(t.mysql); err == nil {
			db = sql.OpenDB(c)
		}
	case dbSQLite:
		if _, statErr := os.Stat(t.path); statErr != nil && !o.create {
			return nil, fmt.Errorf("open the SQLite outbox: %w (run 'outbox migrate up' to create it)", statErr)
		}
		db, err = outboxsqlite.Open(t.path)
	}
	if db != nil {
		s.ping, s.close = db.PingContext, func() { db.Close() }
	}
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err = s.ping(pctx)
		cancel()
		if err != nil {
			s.close()
		}
	}
	if err != nil {
		// The drivers' connect errors name the user, database and address, not the
		// password; the output scrubber is there should that change.
		return nil, fmt.Errorf("connect to %s at %s: %w", t.kind, redactDSN(o.url), err)
	}
	s.pool, s.db = pool, db
	if s.storeDriver, err = o.newDriver(t.kind, pool, db); err != nil {
		s.close()
		return nil, err
	}
	s.pg, _ = s.storeDriver.(*outboxpgx.Driver)
	return s, nil
}

// openMigrated is open for the commands that need the outbox schema in place: it fails
// with advice when the schema is missing or behind.
func (o *dbFlags) openMigrated(ctx context.Context, appName string) (*openedStore, error) {
	s, err := o.open(ctx, appName)
	if err != nil {
		return nil, err
	}
	if _, err := o.checkMigrated(ctx, s); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// where names the outbox for messages: its schema (PostgreSQL), or its database.
func (o *dbFlags) where() string {
	kind, _ := o.kind()
	switch kind {
	case dbMySQL:
		if cfg, err := mysqlConfig(o.url); err == nil {
			return fmt.Sprintf("database %q", cfg.DBName)
		}
		return "the database"
	case dbSQLite:
		path, _ := sqlitePath(o.url)
		return fmt.Sprintf("file %q", path)
	}
	return fmt.Sprintf("schema %q", o.schema)
}

// checkMigrated fails with advice when the outbox schema is missing or behind. A
// missing migration that this code runs without (Deferrable: relays are upgraded before
// it is applied) is accepted and reported in deferred.
func (o *dbFlags) checkMigrated(ctx context.Context, drv storeDriver) (deferred []int, err error) {
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
		return nil, fmt.Errorf("the outbox in %s (prefix %q) is not migrated (missing versions %v): run 'outbox migrate up' with the same --database-url, --schema and --prefix",
			o.where(), o.prefix, missing)
	}
	return deferred, nil
}

// checkRelayable is checkMigrated for a relay: a missing migration it runs without is
// logged as a warning.
func (o *dbFlags) checkRelayable(ctx context.Context, drv storeDriver, log *slog.Logger) error {
	deferred, err := o.checkMigrated(ctx, drv)
	if err != nil {
		return err
	}
	if len(deferred) > 0 {
		log.Warn("the outbox schema lacks migrations this relay can run without: run 'outbox migrate up' once every relay is of this version",
			"missing_versions", fmt.Sprint(deferred))
	}
	return nil
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
