// Package testdb gives tests a real PostgreSQL database: a pool, and a fresh schema per
// test with the outbox migrated into it. A missing server fails the test, never skips it.
package testdb

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxpgx"
)

// URL returns the test database URL: $OUTBOX_TEST_DATABASE_URL or the local server.
func URL() string {
	return cmp.Or(os.Getenv("OUTBOX_TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
}

// Pool returns a pool on the test database, closed when the test ends.
func Pool(t testenv.TB) *pgxpool.Pool {
	t.Helper()
	return PoolAt(t, URL())
}

// PoolAt returns a pool on the database at url, closed when the test ends.
func PoolAt(t testenv.TB, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("testdb: parse the database URL: %v", err) // the URL may hold a password
	}
	cfg.MaxConns = 16
	ctx, cancel := testenv.CallContext() // bounds a hang, not the machine's speed
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		t.Fatalf("testdb: PostgreSQL is not reachable (run the README's test command, which starts it): %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// NewDatabase creates database name on the server of serverURL (a postgres:// URL),
// dropped with everything in it (WITH (FORCE): its sessions too) when the test ends, and
// returns serverURL naming it.
func NewDatabase(t testenv.TB, serverURL, name string) string {
	t.Helper()
	u, err := url.Parse(serverURL)
	if err != nil {
		t.Fatalf("testdb: the database URL does not parse") // it may hold a password
	}
	exec := func(q string) error {
		ctx, cancel := testenv.CallContext()
		defer cancel()
		conn, err := pgx.Connect(ctx, serverURL)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, q)
		return err
	}
	ident := pgx.Identifier{name}.Sanitize()
	if err := exec("CREATE DATABASE " + ident); err != nil {
		t.Fatalf("testdb: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := exec("DROP DATABASE IF EXISTS " + ident + " WITH (FORCE)"); err != nil {
			t.Logf("testdb: drop database %s: %v", name, err)
		}
	})
	u.Path, u.RawPath = "/"+name, ""
	return u.String()
}

// NewSchema returns a fresh schema name, dropped with everything in it when the test ends.
func NewSchema(t testenv.TB, pool *pgxpool.Pool) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "outbox_test_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := testenv.CallContext()
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`); err != nil {
			t.Logf("testdb: drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// Setup returns a pool and a driver on a fresh, migrated schema.
func Setup(t testenv.TB) (*pgxpool.Pool, *outboxpgx.Driver, string) {
	t.Helper()
	return setup(t, Pool(t))
}

func setup(t testenv.TB, pool *pgxpool.Pool) (*pgxpool.Pool, *outboxpgx.Driver, string) {
	t.Helper()
	schema := NewSchema(t, pool)
	drv, err := outboxpgx.New(pool, outboxpgx.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := testenv.CallContext()
	defer cancel()
	if _, err := drv.MigrateUp(ctx, 0); err != nil {
		t.Fatalf("testdb: migrate: %v", err)
	}
	return pool, drv, schema
}

// DB is one test's database: the shared pool and a fresh schema, and, once migrated, a
// driver and a writer on it. Its helpers fail the test on any error.
type DB struct {
	Pool   *pgxpool.Pool
	Schema string
	Driver *outboxpgx.Driver      // set by Migrated
	Writer *outbox.Writer[pgx.Tx] // set by Migrated
}

// NewDB returns a pool and a fresh, empty schema (not migrated).
func NewDB(t testenv.TB) *DB {
	t.Helper()
	pool := Pool(t)
	return &DB{Pool: pool, Schema: NewSchema(t, pool)}
}

// Migrated returns a DB whose schema holds a migrated outbox, with its driver and writer.
func Migrated(t testenv.TB) *DB {
	t.Helper()
	return migrated(t, Pool(t))
}

// MigratedAt is Migrated on the database at url.
func MigratedAt(t testenv.TB, url string) *DB {
	t.Helper()
	return migrated(t, PoolAt(t, url))
}

func migrated(t testenv.TB, pool *pgxpool.Pool) *DB {
	t.Helper()
	pool, drv, schema := setup(t, pool)
	d := &DB{Pool: pool, Schema: schema, Driver: drv}
	d.writer(t)
	return d
}

// writer returns the DB's writer, making it (and its driver) on first use for a schema
// migrated by other means (the CLI's own `migrate up`).
func (d *DB) writer(t testenv.TB) *outbox.Writer[pgx.Tx] {
	t.Helper()
	if d.Writer != nil {
		return d.Writer
	}
	if d.Driver == nil {
		drv, err := outboxpgx.New(d.Pool, outboxpgx.Config{Schema: d.Schema})
		if err != nil {
			t.Fatal(err)
		}
		d.Driver = drv
	}
	w, err := outbox.NewWriter(d.Driver, outbox.WriterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	d.Writer = w
	return w
}

// Write commits msgs in one transaction. It is not safe for concurrent use before the
// DB has a writer (Migrated makes one up front).
func (d *DB) Write(t testenv.TB, msgs ...outbox.Message) {
	t.Helper()
	w := d.writer(t)
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error { return w.Write(ctx, tx, msgs...) }); err != nil {
		t.Fatal(err)
	}
}

// Exec runs q with %[1]s replaced by the quoted schema.
func (d *DB) Exec(t testenv.TB, q string, args ...any) {
	t.Helper()
	if _, err := d.Pool.Exec(context.Background(), fmt.Sprintf(q, `"`+d.Schema+`"`), args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// Today returns the current UTC day by the database's clock, at midnight: what the
// outbox's daily partitions are named after (the test's own clock may be on another day
// around midnight).
func (d *DB) Today(t testenv.TB) time.Time {
	t.Helper()
	var day time.Time
	if err := d.Pool.QueryRow(context.Background(), `SELECT (now() AT TIME ZONE 'UTC')::date::timestamp`).Scan(&day); err != nil {
		t.Fatal(err)
	}
	return day.UTC()
}

// CountIn counts the rows of one of the schema's tables (e.g. "outbox_dead") that match
// where.
func (d *DB) CountIn(t testenv.TB, table, where string) int {
	t.Helper()
	var n int
	q := fmt.Sprintf(`SELECT count(*) FROM "%s".%s WHERE %s`, d.Schema, table, where)
	if err := d.Pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// CountAll counts the messages that match where in all three message tables: pending,
// published and dead.
func (d *DB) CountAll(t testenv.TB, where string) int {
	t.Helper()
	return d.CountIn(t, "outbox", where) + d.CountIn(t, "outbox_published", where) + d.CountIn(t, "outbox_dead", where)
}

// Kill dead-letters the pending message with id as the relay would: moved to the dead
// table with its seq, the attempts and the last error, deadAgo before the database's now().
func (d *DB) Kill(t testenv.TB, id outbox.ID, attempts int, lastError string, deadAgo time.Duration) {
	t.Helper()
	d.move(t, `WITH d AS (DELETE FROM %[1]s.outbox WHERE id = $1 RETURNING *)
INSERT INTO %[1]s.outbox_dead (seq, id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, shard, created_at, attempts, last_error, dead_at)
SELECT seq, id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, shard, created_at, $2, $3, now() - $4 * interval '1 second' FROM d`,
		id, attempts, lastError, deadAgo.Seconds())
}

// MarkPublished moves the pending message with id to the published table, as the relay
// does once the broker confirmed it.
func (d *DB) MarkPublished(t testenv.TB, id outbox.ID) {
	t.Helper()
	d.move(t, `WITH d AS (DELETE FROM %[1]s.outbox WHERE id = $1 RETURNING *)
INSERT INTO %[1]s.outbox_published (seq, id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, shard, created_at, attempts)
SELECT seq, id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, shard, created_at, attempts FROM d`, id)
}

// move runs q, which moves the message with id ($1) out of the pending table, and fails
// the test unless it moved exactly that one row.
func (d *DB) move(t testenv.TB, q string, id outbox.ID, args ...any) {
	t.Helper()
	tag, err := d.Pool.Exec(context.Background(), fmt.Sprintf(q, `"`+d.Schema+`"`), append([]any{id.String()}, args...)...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	if tag.RowsAffected() != 1 {
		t.Fatalf("moved %d rows for message %s, want 1", tag.RowsAffected(), id)
	}
}

// Logger is the logger tests give relays: silent, or verbose on stderr when
// OUTBOX_TEST_LOG is set.
func Logger() *slog.Logger {
	if os.Getenv("OUTBOX_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
