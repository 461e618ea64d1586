package outboxcli

import (
	"context"
	"regexp"
	"strings"
	"testing"
)

func (b *testBundle) tableExists(t *testing.T, name string) bool {
	t.Helper()
	var ok bool
	err := b.Pool.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`, `"`+b.Schema+`".`+name).Scan(&ok)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func (b *testBundle) columnExists(t *testing.T, table, column string) bool {
	t.Helper()
	var ok bool
	err := b.Pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM information_schema.columns
WHERE table_schema = $1 AND table_name = $2 AND column_name = $3)`, b.Schema, table, column).Scan(&ok)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestMigrateRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)

	r := must(t, 0, b.env, "migrate", "status")
	if !strings.Contains(r.stdout, "001") || !strings.Contains(r.stdout, "init") || !strings.Contains(r.stdout, "no") {
		t.Fatalf("status before up: %s", r)
	}
	if r := must(t, 0, b.env, "migrate", "up"); !strings.Contains(r.stdout, "applied 001_init") {
		t.Fatalf("up: %s", r)
	}
	if !b.tableExists(t, "outbox") {
		t.Fatal("no outbox table after migrate up")
	}
	if r := must(t, 0, b.env, "migrate", "up"); !strings.Contains(r.stdout, "up to date") {
		t.Fatalf("second up: %s", r)
	}
	if r := must(t, 0, b.env, "migrate", "status"); !strings.Contains(r.stdout, "yes") {
		t.Fatalf("status after up: %s", r)
	}

	if !b.tableExists(t, "outbox_wal") || !b.columnExists(t, "outbox_relays", "mode") {
		t.Fatal("no outbox_wal table or outbox_relays.mode column after migrate up")
	}

	// One version back reverts the newest migration only: 010_priority (pending
	// messages' priorities), 009_replays (the replays' progress records),
	// 008_relay_routing, 007_wake_gate and 006_notify_from drop no data.
	if r := must(t, 0, b.env, "migrate", "down"); !strings.Contains(r.stdout, "reverted 010_priority") || strings.Contains(r.stdout, "009") ||
		b.columnExists(t, "outbox", "priority") {
		t.Fatalf("down one version: %s", r)
	}
	if r := must(t, 0, b.env, "migrate", "down"); !strings.Contains(r.stdout, "reverted 009_replays") || strings.Contains(r.stdout, "008") ||
		b.tableExists(t, "outbox_replays") {
		t.Fatalf("down one version: %s", r)
	}
	if r := must(t, 0, b.env, "migrate", "down"); !strings.Contains(r.stdout, "reverted 008_relay_routing") || strings.Contains(r.stdout, "007") ||
		b.columnExists(t, "outbox_relays", "fingerprint") {
		t.Fatalf("down one version: %s", r)
	}
	if r := must(t, 0, b.env, "migrate", "down"); !strings.Contains(r.stdout, "reverted 007_wake_gate") || strings.Contains(r.stdout, "006") {
		t.Fatalf("down one version: %s", r)
	}
	if r := must(t, 0, b.env, "migrate", "down"); !strings.Contains(r.stdout, "reverted 006_notify_from") || strings.Contains(r.stdout, "005") {
		t.Fatalf("down one version: %s", r)
	}
	// 005_wal drops outbox_wal, which names WAL mode's replication slots: it asks first,
	// and changes nothing without --yes.
	r = must(t, 2, b.env, "migrate", "down")
	if line := errorLine(r.stderr); !strings.Contains(line, "--yes") || !strings.Contains(line, "005_wal") ||
		!strings.Contains(line, "outbox_wal") || !b.tableExists(t, "outbox_wal") {
		t.Fatalf("down one version without --yes: %s", r)
	}
	if r := must(t, 0, b.env, "migrate", "down", "--yes"); !strings.Contains(r.stdout, "reverted 005_wal") || strings.Contains(r.stdout, "004") ||
		b.tableExists(t, "outbox_wal") || b.columnExists(t, "outbox_relays", "mode") || !b.tableExists(t, "outbox_ring") {
		t.Fatalf("down one version: %s", r)
	}
	if r := must(t, 0, b.env, "migrate", "down"); !strings.Contains(r.stdout, "reverted 004_pending_ring") || !b.tableExists(t, "outbox") {
		t.Fatalf("down one more version: %s", r)
	}
	must(t, 0, b.env, "migrate", "up")
	// Reverting 002_consumer drops the consumers' dedup state: refused without --yes,
	// naming the tables, and nothing changes (not even the migrations above it).
	r = must(t, 2, b.env, "migrate", "down", "--to", "1")
	if line := errorLine(r.stderr); !strings.Contains(line, "--yes") || !strings.Contains(line, "outbox_inbox") ||
		!strings.Contains(line, "002_consumer") || !b.tableExists(t, "outbox_inbox") || !b.tableExists(t, "outbox_ring") {
		t.Fatalf("down to 1 without --yes: %s", r)
	}
	// Reverting migrations that copy their rows back needs no confirmation.
	must(t, 0, b.env, "migrate", "down", "--to", "4", "--yes")
	if r := must(t, 0, b.env, "migrate", "down", "--to", "2"); !strings.Contains(r.stdout, "reverted 003_partitioned_history") {
		t.Fatalf("down to 2: %s", r)
	}
	if r := must(t, 0, b.env, "migrate", "down", "--to", "1", "--yes"); !strings.Contains(r.stdout, "reverted 002_consumer") || b.tableExists(t, "outbox_inbox") {
		t.Fatalf("down to 1 --yes: %s", r)
	}
	must(t, 0, b.env, "migrate", "up")
	// Down to version 0 drops every message: refused without --yes, and nothing changes.
	r = must(t, 2, b.env, "migrate", "down", "--to", "0")
	if !strings.Contains(errorLine(r.stderr), "--yes") || !b.tableExists(t, "outbox") {
		t.Fatalf("down without --yes: %s", r)
	}
	if r := must(t, 0, b.env, "migrate", "down", "--to", "0", "--yes"); !strings.Contains(r.stdout, "reverted 001_init") {
		t.Fatalf("down --yes: %s", r)
	}
	if b.tableExists(t, "outbox") || b.tableExists(t, "outbox_leases") {
		t.Fatal("tables left after migrate down")
	}
	if r := must(t, 0, b.env, "migrate", "status"); strings.Contains(r.stdout, "yes") {
		t.Fatalf("status after down: %s", r)
	}
	if r := must(t, 0, b.env, "migrate", "down", "--to", "0", "--yes"); !strings.Contains(r.stdout, "nothing to revert") {
		t.Fatalf("down with nothing applied: %s", r)
	}
}

func TestMigrateSQLNeedsNoDatabaseAndMatchesUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The database URL points nowhere: sql must not connect.
	r := must(t, 0, with(b.env, "OUTBOX_DATABASE_URL", unreachableDB), "migrate", "sql")
	if !strings.Contains(r.stdout, `CREATE TABLE "`+b.Schema+`"."outbox"`) {
		t.Fatalf("sql does not create the outbox in the configured schema: %s", r)
	}
	// Applying the script by hand leaves the schema exactly as migrate up would: the relay
	// and migrate status agree.
	if _, err := b.Pool.Exec(context.Background(), r.stdout); err != nil {
		t.Fatalf("apply migrate sql output: %v", err)
	}
	if r := must(t, 0, b.env, "migrate", "status"); regexp.MustCompile(`(?m)\sno$`).MatchString(r.stdout) {
		t.Fatalf("status after applying the SQL by hand: %s", r)
	}
	if r := must(t, 0, b.env, "migrate", "up"); !strings.Contains(r.stdout, "up to date") {
		t.Fatalf("up after applying the SQL by hand: %s", r)
	}
	if r := must(t, 0, b.env, "status"); !strings.Contains(r.stdout, "0 of 64") {
		t.Fatalf("status after applying the SQL by hand: %s", r)
	}

	r = must(t, 0, nil, "migrate", "sql", "--schema", "billing", "--prefix", "acme_")
	if !strings.Contains(r.stdout, `"billing"."acme_outbox"`) {
		t.Fatalf("sql with schema and prefix: %s", r)
	}
}

func TestCommandsNeedMigratedSchema(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, args := range [][]string{{"status"}, {"dead", "list"}} {
		r := must(t, 1, b.env, args...)
		if !strings.Contains(r.stderr, "outbox migrate up") {
			t.Errorf("%v on an unmigrated schema: want advice to migrate, got %s", args, r)
		}
	}
}
