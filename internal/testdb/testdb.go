// Package testdb gives tests a real PostgreSQL database: a pool, and a fresh schema per
// test with the outbox migrated into it. A missing server fails the test, never skips it.
package testdb

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/outboxpgx"
)

// URL returns the test database URL: $OUTBOX_TEST_DATABASE_URL or the local server.
func URL() string {
	return cmp.Or(os.Getenv("OUTBOX_TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
}

// Pool returns a pool on the test database, closed when the test ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(URL())
	if err != nil {
		t.Fatalf("testdb: parse %s: %v", "OUTBOX_TEST_DATABASE_URL", err)
	}
	cfg.MaxConns = 16
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
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

// NewSchema returns a fresh schema name, dropped with everything in it when the test ends.
func NewSchema(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "outbox_test_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`); err != nil {
			t.Logf("testdb: drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// Setup returns a pool and a driver on a fresh, migrated schema.
func Setup(t testing.TB) (*pgxpool.Pool, *outboxpgx.Driver, string) {
	t.Helper()
	pool := Pool(t)
	schema := NewSchema(t, pool)
	drv, err := outboxpgx.New(pool, outboxpgx.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := drv.MigrateUp(ctx, 0); err != nil {
		t.Fatalf("testdb: migrate: %v", err)
	}
	return pool, drv, schema
}
