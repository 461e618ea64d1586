package outboxmysql_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testmysql"
	"github.com/outboxkit/outbox/internal/testinfra/testsql"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/storetest"
)

// TestShardMatchesServerMD5 checks the shard the writer computes in Go against the one
// the server computes from MD5, for keyed messages and for messages without a key (the
// id's text), so that rows hash as PostgreSQL's generated column hashes them.
func TestShardMatchesServerMD5(t *testing.T) {
	b := setup(t)
	t.Parallel()
	var msgs []outbox.Message
	for _, k := range []string{"a", "order-42", "k0", "Ünïcødé key", "inner space", "", ""} {
		msgs = append(msgs, outbox.Message{Topic: "t", Key: k, Payload: []byte(`{}`)})
	}
	b.write(t, msgs...)
	rows, err := b.db.QueryContext(testenv.Context(t), "SELECT `key`, shard, CAST(CONV(LEFT(MD5(CASE WHEN `key` = '' THEN "+
		"LOWER(CONCAT_WS('-', HEX(SUBSTR(id, 1, 4)), HEX(SUBSTR(id, 5, 2)), HEX(SUBSTR(id, 7, 2)), HEX(SUBSTR(id, 9, 2)), HEX(SUBSTR(id, 11, 6)))) "+
		"ELSE `key` END), 8), 16, 10) AS UNSIGNED) & 63 FROM outbox ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var key string
		var stored, server int
		if err := rows.Scan(&key, &stored, &server); err != nil {
			t.Fatal(err)
		}
		if stored != server {
			t.Errorf("key %q: stored shard %d, the server's MD5 says %d", key, stored, server)
		}
		n++
	}
	if n != len(msgs) {
		t.Fatalf("read %d rows, want %d", n, len(msgs))
	}
}

// TestStoreConformanceAnyDSN runs the conformance suite through a connection whose
// settings would break a store that let the driver handle times or trusted affected-row
// counts: times parsed into a far-away location, a session time zone that is not UTC,
// client-side interpolation, and found-rows counting.
func TestStoreConformanceAnyDSN(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Outbox {
		t.Parallel()
		cfg, err := mysql.ParseDSN(testmysql.NewDatabase(t))
		if err != nil {
			t.Fatal(err)
		}
		cfg.ParseTime = true
		cfg.Loc, _ = time.LoadLocation("Asia/Tokyo")
		cfg.InterpolateParams = true
		cfg.ClientFoundRows = true
		cfg.Params = map[string]string{"time_zone": "'-07:00'"}
		b := open(t, cfg.FormatDSN())
		if _, err := b.drv.MigrateUp(testenv.Context(t), 0); err != nil {
			t.Fatal(err)
		}
		var tz string
		if err := b.db.QueryRowContext(testenv.Context(t), "SELECT @@session.time_zone").Scan(&tz); err != nil || tz != "-07:00" {
			t.Fatalf("session time zone %q, %v", tz, err)
		}
		return testsql.Outbox(b.drv, b.db, b.w)
	})
}

// TestTimesAreUTC checks what the store writes and reads back against the Go clock, in a
// session whose time zone is not UTC: the row's time is the server's UTC time.
func TestTimesAreUTC(t *testing.T) {
	t.Parallel()
	cfg, err := mysql.ParseDSN(testmysql.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Params = map[string]string{"time_zone": "'+09:30'"}
	b := open(t, cfg.FormatDSN())
	c := testenv.Context(t)
	if _, err := b.drv.MigrateUp(c, 0); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	b.write(t, outbox.Message{Topic: "t", Payload: []byte(`{}`)})
	st, err := b.drv.SyncLeases(c, outboxdriver.LeaseRequest{RelayID: "r", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.drv.Fetch(c, outboxdriver.FetchRequest{RelayID: "r", Leases: st.Held, Limit: 1})
	if err != nil || len(got) != 1 {
		t.Fatalf("fetched %d, %v", len(got), err)
	}
	// The server runs on this machine: its clock and Go's agree to well within an hour,
	// and a time-zone mix-up is off by hours.
	if d := got[0].CreatedAt.Sub(before); d < -time.Hour || d > time.Hour {
		t.Fatalf("created_at %v is %v away from the write at %v", got[0].CreatedAt, d, before)
	}
	var raw string
	if err := b.db.QueryRowContext(c, "SELECT DATE_FORMAT(created_at, '%Y-%m-%d %H') FROM outbox").Scan(&raw); err != nil {
		t.Fatal(err)
	}
	if utc := got[0].CreatedAt.UTC().Format("2006-01-02 15"); raw != utc {
		t.Fatalf("stored created_at %s, want the UTC time %s", raw, utc)
	}
}

// TestCommitOrderTrap: AUTO_INCREMENT hands out seqs at insert, so a transaction can
// commit after one that got a higher seq. The relay, already past the higher seq, must
// still publish the late one.
func TestCommitOrderTrap(t *testing.T) {
	b := setup(t)
	t.Parallel()
	pub := &outboxtest.Publisher{}
	r, err := outbox.NewRelay(b.drv, pub, outbox.RelayConfig{ID: "trap", PollInterval: 20 * time.Millisecond, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.Stop(testenv.Context(t)); err != nil {
			t.Errorf("stop relay: %v", err)
		}
	}()
	// The late transaction stays open across the wait below, however long that takes:
	// its context must not end on a clock (a transaction's context rolls it back).
	late, err := b.db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Rollback()
	if err := b.w.Write(testenv.Context(t), late, outbox.Message{Topic: "t", Key: "late", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	b.write(t, outbox.Message{Topic: "t", Key: "early", Payload: []byte(`{}`)})
	got := pub.Await(t, 1)
	if got[0].Key != "early" {
		t.Fatalf("first published %v; want the committed message", got)
	}
	if err := late.Commit(); err != nil {
		t.Fatal(err)
	}
	got = pub.Await(t, 2) // a relay that skipped the late commit stalls here
	if got[1].Key != "late" || got[1].Seq >= got[0].Seq {
		t.Fatalf("published %q (seq %d) after %q (seq %d); want the late commit with the lower seq", got[1].Key, got[1].Seq, got[0].Key, got[0].Seq)
	}
}

func testLogger() *slog.Logger {
	if os.Getenv("OUTBOX_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// TestStatusEstimatesLargePublished: past PublishedExactBelow estimated rows, Status
// reports InnoDB's estimate of the published table rather than counting it.
func TestStatusEstimatesLargePublished(t *testing.T) {
	b := setup(t)
	t.Parallel()
	c := testenv.Context(t)
	if _, err := b.db.ExecContext(c, "INSERT INTO outbox_published (seq, id, topic, `key`, aggregate_type, event_type, content_type, payload, headers, dedup_key, shard, created_at, attempts, published_at) "+
		"VALUES (1, UNHEX(REPEAT('00', 16)), 't', '', '', '', 'application/json', '{}', '{}', 'd1', 0, UTC_TIMESTAMP(6), 0, UTC_TIMESTAMP(6))"); err != nil {
		t.Fatal(err)
	}
	for n := 1; n < 2*outboxmysql.PublishedExactBelow; n *= 2 { // double the table until it is large
		if _, err := b.db.ExecContext(c, "INSERT INTO outbox_published (seq, id, topic, `key`, aggregate_type, event_type, content_type, payload, headers, dedup_key, shard, created_at, attempts, published_at) "+
			"SELECT seq + ?, id, topic, `key`, aggregate_type, event_type, content_type, payload, headers, dedup_key, shard, created_at, attempts, published_at FROM outbox_published", n); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.db.ExecContext(c, "ANALYZE TABLE outbox_published"); err != nil {
		t.Fatal(err)
	}
	var exact int64
	if err := b.db.QueryRowContext(c, "SELECT COUNT(*) FROM outbox_published").Scan(&exact); err != nil {
		t.Fatal(err)
	}
	st, err := b.drv.Status(c)
	if err != nil {
		t.Fatal(err)
	}
	var estimate int64
	if err := b.db.QueryRowContext(c, "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_published'").Scan(&estimate); err != nil {
		t.Fatal(err)
	}
	if st.Published != estimate || st.Published < outboxmysql.PublishedExactBelow || st.Published < exact/2 || st.Published > exact*2 {
		t.Fatalf("status published = %d for %d rows; want InnoDB's estimate %d", st.Published, exact, estimate)
	}
}

// TestMigrationFinishedAfterInterruption: MySQL commits DDL statement by statement, so a
// migration can stop halfway (here: migration 4's column added, its index not). Running
// MigrateUp again finishes it, taking the column already there as done; running
// MigrateDown after a down interrupted halfway does the same.
func TestMigrationFinishedAfterInterruption(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	b := open(t, testmysql.NewDatabase(t))
	if _, err := b.drv.MigrateUp(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.ExecContext(ctx, "ALTER TABLE outbox ADD COLUMN priority TINYINT NOT NULL DEFAULT 0"); err != nil {
		t.Fatal(err)
	}
	if v, err := b.drv.MigrateUp(ctx, 0); err != nil || len(v) != 1 || v[0] != 4 {
		t.Fatalf("MigrateUp after an interrupted migration 4 = %v, %v; want [4]", v, err)
	}
	var n int
	if err := b.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox' AND INDEX_NAME = 'outbox_priority_idx'`).Scan(&n); err != nil || n == 0 {
		t.Fatalf("the priority index after finishing migration 4: %d columns, %v", n, err)
	}
	if _, err := b.db.ExecContext(ctx, "DROP INDEX outbox_priority_idx ON outbox"); err != nil {
		t.Fatal(err)
	}
	if v, err := b.drv.MigrateDown(ctx, 3); err != nil || len(v) != 1 || v[0] != 4 {
		t.Fatalf("MigrateDown after an interrupted down of migration 4 = %v, %v; want [4]", v, err)
	}
}
