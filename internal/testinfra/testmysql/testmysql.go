// Package testmysql gives tests a real MySQL or MariaDB server: a fresh database per test,
// dropped when the test ends, so that tests run in parallel. A missing server fails the
// test, never skips it.
package testmysql

import (
	"cmp"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

// EnvDSN names the environment variable that points the tests at a server.
const EnvDSN = "OUTBOX_TEST_MYSQL_DSN"

// DSN returns the server's DSN: $OUTBOX_TEST_MYSQL_DSN or the local server as root
// without a password. Its database name, if any, is ignored: tests make their own.
func DSN() string {
	return cmp.Or(os.Getenv(EnvDSN), "root@tcp(127.0.0.1:3306)/")
}

// config parses DSN.
func config(t testing.TB) *mysql.Config {
	t.Helper()
	cfg, err := mysql.ParseDSN(DSN())
	if err != nil {
		t.Fatalf("testmysql: parse %s: %v", EnvDSN, err)
	}
	return cfg
}

// NewDatabase creates a fresh, empty database, dropped with everything in it when the test
// ends, and returns the DSN of a connection to it.
func NewDatabase(t testing.TB) string {
	t.Helper()
	cfg := config(t)
	cfg.DBName = ""
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := testenv.CallContext() // bounds a hang, not the machine's speed
	defer cancel()
	if err := admin.PingContext(ctx); err != nil {
		admin.Close()
		t.Fatalf("testmysql: MySQL/MariaDB is not reachable at %s (set %s, or start the local server: start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd): %v",
			cfg.Addr, EnvDSN, err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "outbox_test_" + hex.EncodeToString(b[:])
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+name+"` CHARACTER SET utf8mb4"); err != nil {
		admin.Close()
		t.Fatalf("testmysql: create database: %v", err)
	}
	t.Cleanup(func() {
		defer admin.Close()
		ctx, cancel := testenv.CallContext()
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
			t.Logf("testmysql: drop database %s: %v", name, err)
		}
	})
	cfg.DBName = name
	return cfg.FormatDSN()
}

// Open returns a pool on dsn, closed when the test ends.
func Open(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16)
	t.Cleanup(func() { _ = db.Close() })
	return db
}
