package bench

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/internal/pgsql/pgxq"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxsqlite"
)

// database is the store side of a run: a throwaway outbox on one database.
type database interface {
	// write writes msgs in one transaction and commits it.
	write(ctx context.Context, msgs []outbox.Message) error
	// store returns a store for one relay, on a pool of its own as a separate process
	// would have, and the function that closes it.
	store(ctx context.Context) (outboxdriver.Store, func(), error)
	// settle runs after a backlog is written (statistics).
	settle(ctx context.Context) error
	// pin holds a snapshot open on a connection of its own until release is called: the
	// long transaction that keeps the database from cleaning up behind the relay.
	pin(ctx context.Context) (release func(), err error)
	// writers returns the writers phase's pool (Config.Writers), for n writers.
	writers(ctx context.Context, n int) (*writerPool, error)
	// drop deletes the outbox and closes what the database holds.
	drop()
}

// writerPool is the writers phase's connections, one per writer and opened before the
// phase, so that no writer waits for a connection or pays for opening one. Our Writer
// and the naive reference write through the same pool: what differs between their rates
// is the write alone.
type writerPool struct {
	// write commits msgs in one transaction through our Writer.
	write func(ctx context.Context, msgs []outbox.Message) error
	// naive commits e as one plain INSERT into the naive outbox table (naiveTable), in a
	// transaction of its own; nil when the database has no reference (SQLite).
	naive func(ctx context.Context, e naiveEvent) error
	close func()
}

// naiveEvent is one row of the naive outbox table; its dedup key is its id's text, as
// our Writer's default is.
type naiveEvent struct {
	ID                                    outbox.ID
	AggregateType, AggregateID, EventType string
	Payload                               string // JSON
}

// naiveTable is the reference the writers phase compares our Writer with: the outbox
// table an application writes for itself, one row per event, with the indexes its
// poller (unpublished first, oldest first), its per-aggregate reads and its
// deduplication need. It lives in the bench's schema or database and goes with it.
const naiveTable = "outbox_events"

// pgNaiveDDL makes naiveTable; %s is its schema-qualified name.
const pgNaiveDDL = `CREATE TABLE IF NOT EXISTS %[1]s (
	id UUID PRIMARY KEY,
	aggregate_type TEXT NOT NULL,
	aggregate_id TEXT NOT NULL,
	event_type TEXT NOT NULL,
	payload JSONB NOT NULL,
	headers JSONB NOT NULL DEFAULT '{}',
	dedup_key TEXT NOT NULL,
	created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
	published_at TIMESTAMPTZ NULL,
	attempt SMALLINT NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS outbox_events_unpublished ON %[1]s (published_at NULLS FIRST, created_at);
CREATE INDEX IF NOT EXISTS outbox_events_aggregate ON %[1]s (aggregate_type, aggregate_id);
CREATE UNIQUE INDEX IF NOT EXISTS outbox_events_dedup_key ON %[1]s (dedup_key)`

// mysqlNaiveDDL is pgNaiveDDL for MySQL and MariaDB: the id in 16 bytes, as our outbox
// keeps it, VARCHAR where an index needs a bounded key, and a plain index on
// published_at, whose NULLs sort first in ascending order here.
const mysqlNaiveDDL = "CREATE TABLE IF NOT EXISTS " + naiveTable + ` (
	id BINARY(16) NOT NULL PRIMARY KEY,
	aggregate_type VARCHAR(255) NOT NULL,
	aggregate_id VARCHAR(255) NOT NULL,
	event_type VARCHAR(255) NOT NULL,
	payload JSON NOT NULL,
	headers JSON NOT NULL DEFAULT ('{}'),
	dedup_key VARCHAR(255) NOT NULL,
	created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	published_at DATETIME(6) NULL,
	attempt SMALLINT NOT NULL DEFAULT 0,
	KEY outbox_events_unpublished (published_at, created_at),
	KEY outbox_events_aggregate (aggregate_type, aggregate_id),
	UNIQUE KEY outbox_events_dedup_key (dedup_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4`

// localPostgres is the database a PostgreSQL run uses without Config.DatabaseURL.
const localPostgres = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// Databases a run can use (Config.DB).
const (
	DBPostgres = "postgres"
	DBSQLite   = "sqlite"
	DBMySQL    = "mysql"
)

func openDatabase(ctx context.Context, cfg Config, tag string) (database, error) {
	switch cfg.DB {
	case DBPostgres:
		return openPostgres(ctx, cmp.Or(cfg.DatabaseURL, localPostgres), tag, cfg.SchemaVersion, cfg.RotateRows)
	case DBSQLite:
		return openSQLite(ctx, tag, cfg.SchemaVersion)
	case DBMySQL:
		return openMySQL(ctx, cmp.Or(cfg.DatabaseURL, "root@tcp(127.0.0.1:3306)/"), tag, cfg.SchemaVersion)
	}
	return nil, fmt.Errorf("bench: unknown database %q: want %s, %s or %s", cfg.DB, DBPostgres, DBSQLite, DBMySQL)
}

// postgres is an outbox in a schema of its own, written through pgx.
type postgres struct {
	url, schema string
	rotateRows  int
	pool        *pgxpool.Pool
	w           *outbox.Writer[pgx.Tx]
	wal         bool // walSetup made a slot and a publication, which drop removes
}

func openPostgres(ctx context.Context, url, tag string, version, rotateRows int) (*postgres, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	p := &postgres{url: url, schema: "outbox_bench_" + tag, rotateRows: rotateRows, pool: pool}
	drv, err := outboxpgx.New(pool, p.config())
	if err == nil {
		_, err = drv.MigrateUp(ctx, version)
	}
	if err == nil {
		p.w, err = outbox.NewWriter(drv, outbox.WriterConfig{})
	}
	if err != nil {
		p.drop()
		return nil, fmt.Errorf("PostgreSQL outbox: %w", err)
	}
	return p, nil
}

func (p *postgres) config() outboxpgx.Config {
	return outboxpgx.Config{Schema: p.schema, RotateRows: p.rotateRows}
}

func (p *postgres) write(ctx context.Context, msgs []outbox.Message) error {
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error { return p.w.Write(ctx, tx, msgs...) })
}

func (p *postgres) store(ctx context.Context) (outboxdriver.Store, func(), error) {
	pc, err := pgxpool.ParseConfig(p.url)
	if err != nil {
		return nil, nil, err
	}
	pc.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, nil, err
	}
	drv, err := outboxpgx.New(pool, p.config())
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return drv, pool.Close, nil
}

// writers opens a pool of max(n, pgxpool's default) connections, as many as there are
// writers: the default (max(4, CPUs)) would have them queue for a connection, and the
// queue, not the database, would set their rate.
func (p *postgres) writers(ctx context.Context, n int) (*writerPool, error) {
	pc, err := pgxpool.ParseConfig(p.url)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = max(pc.MaxConns, int32(n))
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	fail := func(err error) (*writerPool, error) {
		pool.Close()
		return nil, fmt.Errorf("pool: %w", err)
	}
	drv, err := outboxpgx.New(pool, p.config())
	if err != nil {
		return fail(err)
	}
	w, err := outbox.NewWriter(drv, outbox.WriterConfig{})
	if err != nil {
		return fail(err)
	}
	table := pgx.Identifier{p.schema, naiveTable}.Sanitize()
	if _, err := pool.Exec(ctx, fmt.Sprintf(pgNaiveDDL, table)); err != nil {
		return fail(fmt.Errorf("create the naive table: %w", err))
	}
	if err := openAll(n, func() (*pgxpool.Conn, error) { return pool.Acquire(ctx) }, (*pgxpool.Conn).Release); err != nil {
		return fail(err)
	}
	insert := `INSERT INTO ` + table + ` (id, aggregate_type, aggregate_id, event_type, payload, dedup_key) VALUES ($1, $2, $3, $4, $5, $6)`
	return &writerPool{
		write: func(ctx context.Context, msgs []outbox.Message) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.Write(ctx, tx, msgs...) })
		},
		naive: func(ctx context.Context, e naiveEvent) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, insert, [16]byte(e.ID), e.AggregateType, e.AggregateID, e.EventType, e.Payload, e.ID.String())
				return err
			})
		},
		close: pool.Close,
	}, nil
}

func (p *postgres) settle(ctx context.Context) error {
	_, err := p.pool.Exec(ctx, `ANALYZE "`+p.schema+`".outbox`)
	return err
}

// quiesce vacuums the outbox's tables and checkpoints: what one mode's phases left
// behind (dead rows, a history to vacuum, WAL to checkpoint) is then not cleaned up
// during the next mode's, which would charge it to that mode.
func (p *postgres) quiesce(ctx context.Context) error {
	if err := p.vacuum(ctx); err != nil {
		return err
	}
	if _, err := p.pool.Exec(ctx, `CHECKPOINT`); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// vacuum vacuums the outbox's tables: the dead rows of a drain are then not walked by
// the next drain's fetches.
func (p *postgres) vacuum(ctx context.Context) error {
	s := pgx.Identifier{p.schema}.Sanitize()
	if _, err := p.pool.Exec(ctx, `VACUUM (ANALYZE) `+s+`.outbox, `+s+`.outbox_published`); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	return nil
}

// pin opens a REPEATABLE READ transaction and takes its snapshot: until it ends, the xmin
// horizon of the bench's database stays where it is and vacuum removes no row deleted
// after it.
func (p *postgres) pin(ctx context.Context) (func(), error) {
	conn, err := pgx.Connect(ctx, p.url)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1`); err != nil {
		_ = conn.Close(ctx)
		return nil, err
	}
	return func() { _ = conn.Close(context.Background()) }, nil
}

func (p *postgres) drop() {
	ctx := context.Background()
	if p.wal {
		if names, err := p.names(); err == nil {
			slot, pub := names.WALDefaults()
			_, _ = names.WALDrop(ctx, p.inTx, pgsql.WALDropOptions{Slot: slot, Publication: pub, Force: true})
		}
	}
	_, _ = p.pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+p.schema+`" CASCADE`)
	p.pool.Close()
}

func (p *postgres) names() (*pgsql.Names, error) {
	return pgsql.NewNames(pgsql.Config{Schema: p.schema, RotateRows: p.rotateRows})
}

func (p *postgres) inTx(ctx context.Context, fn func(pgsql.Querier) error) error {
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error { return fn(pgxq.Querier{DB: tx}) })
}

// walSetup does what 'outbox wal setup' does for the bench's outbox, with the default
// slot and publication names.
func (p *postgres) walSetup(ctx context.Context) error {
	names, err := p.names()
	if err != nil {
		return err
	}
	slot, pub := names.WALDefaults()
	p.wal = true
	if _, err := names.WALSetup(ctx, p.inTx, pgsql.WALSetupOptions{Slot: slot, Publication: pub}); err != nil {
		return fmt.Errorf("WAL setup: %w", err)
	}
	return nil
}

// statementsOn makes pg_stat_statements readable in the bench's database, for the idle
// phase (the private server preloads the library).
func (p *postgres) statementsOn(ctx context.Context) error {
	_, err := p.pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	return err
}

// sqlDatabase is an outbox written through database/sql (SQLite, MySQL).
type sqlDatabase struct {
	db      *sql.DB
	w       *outbox.Writer[*sql.Tx]
	newPool func() (*sql.DB, error)
	newDrv  func(*sql.DB) (sqlDriver, error)
	cleanup func()
	// pinSQL opens a transaction and takes a snapshot (see database.pin).
	pinSQL []string
	// naiveDDL makes naiveTable; empty when the writers phase has no reference (SQLite).
	naiveDDL string
}

// sqlDriver is what the SQLite and MySQL drivers have in common here.
type sqlDriver interface {
	outboxdriver.Store
	outboxdriver.WriteDriver[*sql.Tx]
	MigrateUp(ctx context.Context, target int) ([]int, error)
}

// open opens the first pool, migrates the outbox up to version (0: the latest) and makes
// the writer; on an error it cleans up.
func (s *sqlDatabase) open(ctx context.Context, what string, version int) (*sqlDatabase, error) {
	var err error
	if s.db, err = s.newPool(); err != nil {
		s.cleanup()
		return nil, err
	}
	drv, err := s.newDrv(s.db)
	if err == nil {
		_, err = drv.MigrateUp(ctx, version)
	}
	if err == nil {
		s.w, err = outbox.NewWriter[*sql.Tx](drv, outbox.WriterConfig{})
	}
	if err != nil {
		s.drop()
		return nil, fmt.Errorf("%s outbox: %w", what, err)
	}
	return s, nil
}

func (s *sqlDatabase) write(ctx context.Context, msgs []outbox.Message) error {
	return outbox.SQLTx(s.db, nil)(ctx, func(tx *sql.Tx) error { return s.w.Write(ctx, tx, msgs...) })
}

func (s *sqlDatabase) store(context.Context) (outboxdriver.Store, func(), error) {
	db, err := s.newPool()
	if err != nil {
		return nil, nil, err
	}
	drv, err := s.newDrv(db)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return drv, func() { _ = db.Close() }, nil
}

// writers opens a pool of n connections (MaxOpenConns and MaxIdleConns both n), as many
// as there are writers: database/sql keeps two idle by default, so the others would be
// closed and opened again between transactions. SQLite keeps its store's pool, sized by
// outboxsqlite.Open, and has no reference: it takes one writer at a time whatever the
// pool, which is its own case.
func (s *sqlDatabase) writers(ctx context.Context, n int) (*writerPool, error) {
	if s.naiveDDL == "" {
		return &writerPool{write: s.write, close: func() {}}, nil
	}
	db, err := s.newPool()
	if err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n)
	fail := func(err error) (*writerPool, error) {
		_ = db.Close()
		return nil, fmt.Errorf("pool: %w", err)
	}
	drv, err := s.newDrv(db)
	if err != nil {
		return fail(err)
	}
	w, err := outbox.NewWriter[*sql.Tx](drv, outbox.WriterConfig{})
	if err != nil {
		return fail(err)
	}
	if _, err := db.ExecContext(ctx, s.naiveDDL); err != nil {
		return fail(fmt.Errorf("create the naive table: %w", err))
	}
	if err := openAll(n, func() (*sql.Conn, error) { return db.Conn(ctx) }, func(c *sql.Conn) { _ = c.Close() }); err != nil {
		return fail(err)
	}
	inTx := outbox.SQLTx(db, nil)
	insert := "INSERT INTO " + naiveTable + " (id, aggregate_type, aggregate_id, event_type, payload, dedup_key) VALUES (?, ?, ?, ?, ?, ?)"
	return &writerPool{
		write: func(ctx context.Context, msgs []outbox.Message) error {
			return inTx(ctx, func(tx *sql.Tx) error { return w.Write(ctx, tx, msgs...) })
		},
		naive: func(ctx context.Context, e naiveEvent) error {
			return inTx(ctx, func(tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, insert, e.ID[:], e.AggregateType, e.AggregateID, e.EventType, e.Payload, e.ID.String())
				return err
			})
		},
		close: func() { _ = db.Close() },
	}, nil
}

func (s *sqlDatabase) settle(context.Context) error { return nil }

// pin runs pinSQL on a connection of its own and keeps the connection, with the snapshot
// it opened, until release.
func (s *sqlDatabase) pin(ctx context.Context) (func(), error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	for _, q := range s.pinSQL {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			_ = conn.Close()
			return nil, err
		}
	}
	return func() {
		_, _ = conn.ExecContext(context.Background(), "ROLLBACK")
		_ = conn.Close()
	}, nil
}

func (s *sqlDatabase) drop() {
	_ = s.db.Close()
	s.cleanup()
}

// openSQLite makes an outbox in a SQLite file in a temporary directory.
func openSQLite(ctx context.Context, tag string, version int) (*sqlDatabase, error) {
	dir, err := os.MkdirTemp("", "outbox-bench-"+tag)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "outbox.db")
	s := &sqlDatabase{
		newPool: func() (*sql.DB, error) { return outboxsqlite.Open(path) },
		newDrv:  func(db *sql.DB) (sqlDriver, error) { return outboxsqlite.New(db, outboxsqlite.Config{}) },
		cleanup: func() { _ = os.RemoveAll(dir) },
		// A read transaction keeps its WAL snapshot: checkpoints cannot move past it, so
		// the WAL file grows for as long as it is open.
		pinSQL: []string{"BEGIN", "SELECT count(*) FROM outbox"},
	}
	return s.open(ctx, "SQLite", version)
}

// openMySQL makes an outbox in a database of its own on a MySQL or MariaDB server; dsn
// names the server (its database part is replaced).
func openMySQL(ctx context.Context, dsn, tag string, version int) (*sqlDatabase, error) {
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("MySQL DSN: %w", err)
	}
	name := "outbox_bench_" + tag
	admin := mc.Clone()
	admin.DBName = ""
	adminDB, err := sql.Open("mysql", admin.FormatDSN())
	if err != nil {
		return nil, err
	}
	if _, err := adminDB.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		adminDB.Close()
		return nil, fmt.Errorf("connect to MySQL: %w", err)
	}
	mc.DBName = name
	target := mc.FormatDSN()
	s := &sqlDatabase{
		newPool: func() (*sql.DB, error) { return sql.Open("mysql", target) },
		newDrv:  func(db *sql.DB) (sqlDriver, error) { return outboxmysql.New(db, outboxmysql.Config{}) },
		// A consistent snapshot keeps its read view: InnoDB's purge cannot remove a
		// delete-marked row newer than it.
		pinSQL:   []string{"START TRANSACTION WITH CONSISTENT SNAPSHOT", "SELECT count(*) FROM outbox"},
		naiveDDL: mysqlNaiveDDL,
		cleanup: func() {
			_, _ = adminDB.ExecContext(context.Background(), "DROP DATABASE IF EXISTS `"+strings.ReplaceAll(name, "`", "")+"`")
			adminDB.Close()
		},
	}
	return s.open(ctx, "MySQL", version)
}

// openAll opens a pool's n connections before the writers phase, so that no writer waits
// for one or pays for opening it: each is held until all are, so each is a new one, then
// given back to stay idle in the pool.
func openAll[C any](n int, acquire func() (C, error), release func(C)) error {
	conns := make([]C, 0, n)
	var err error
	for range n {
		var c C
		if c, err = acquire(); err != nil {
			break
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		release(c)
	}
	if err != nil {
		return fmt.Errorf("open %d connections, one per writer (lower --writers or raise the server's max_connections): %w", n, err)
	}
	return nil
}
