package outboxpgx_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxtest"
)

func partitionNames(t *testing.T, b *testBundle) []string {
	t.Helper()
	rows, err := b.Pool.Query(testenv.Context(t), `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = to_regclass($1) ORDER BY c.relname`, `"`+b.Schema+`".outbox_published`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

func dayName(d time.Time) string { return "outbox_published_" + d.UTC().Format("20060102") }

// The migration leaves today and 7 days ahead partitioned; Maintain creates what is
// missing and drops whole days once they are older than the retention, and nothing else.
func TestMaintainPartitions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	today := b.Today(t)
	names := partitionNames(t, b)
	if len(names) != pgsql.PartitionDaysAhead+1 || names[0] != dayName(today) {
		t.Fatalf("after the migration the partitions are %v; want %d days from %s", names, pgsql.PartitionDaysAhead+1, dayName(today))
	}

	// An old day with a row in it, and a gap ahead.
	old := today.AddDate(0, 0, -10)
	b.Exec(t, `SELECT %[1]s.outbox_published_partition($1::date)`, old.Format(time.DateOnly))
	b.Exec(t, `INSERT INTO %[1]s.outbox_published SELECT 1, gen_random_uuid(), 't', 'k', '', '', 'x', 'x', '{}', 'd-old', 0, now(), 0, $1`, old.Add(time.Hour))
	b.Exec(t, `INSERT INTO %[1]s.outbox_published SELECT 2, gen_random_uuid(), 't', 'k', '', '', 'x', 'x', '{}', 'd-new', 0, now(), 0, now()`)
	b.Exec(t, `DROP TABLE %[1]s.`+dayName(today.AddDate(0, 0, 3)))

	m, err := b.Driver.Maintain(ctx, outboxdriver.MaintainRequest{Retention: 7 * 24 * time.Hour, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Created) != 1 || !m.Created[0].Equal(today.AddDate(0, 0, 3)) {
		t.Errorf("created %v; want the missing day %s", m.Created, today.AddDate(0, 0, 3).Format(time.DateOnly))
	}
	if len(m.Dropped) != 1 || !m.Dropped[0].Equal(old) {
		t.Errorf("dropped %v; want the expired day %s", m.Dropped, old.Format(time.DateOnly))
	}
	if got := partitionNames(t, b); fmt.Sprint(got) != fmt.Sprint(names) {
		t.Errorf("partitions after Maintain %v; want %v", got, names)
	}
	if n := b.CountIn(t, "outbox_published", "true"); n != 1 {
		t.Errorf("%d published rows left; want the recent one only", n)
	}

	// Keep forever: days are still created, none dropped.
	b.Exec(t, `DROP TABLE %[1]s.`+dayName(today.AddDate(0, 0, 7)))
	m, err = b.Driver.Maintain(ctx, outboxdriver.MaintainRequest{Retention: -1, Limit: 100})
	if err != nil || len(m.Created) != 1 || len(m.Dropped) != 0 {
		t.Fatalf("Maintain keeping forever: %+v, %v; want one day created, none dropped", m, err)
	}
}

// While another process holds the maintenance lock, Maintain does nothing and says so,
// and the operator's commands report ErrBusy; once it is free, the missing days are made.
func TestMaintainBusy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	today := b.Today(t)
	for i := range 3 {
		b.Exec(t, `DROP TABLE %[1]s.`+dayName(today.AddDate(0, 0, 5+i)))
	}
	ctx := context.Background()
	holder, err := b.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('outbox-maintain:' || $1))`, b.Schema+".outbox"); err != nil {
		t.Fatal(err)
	}
	m, err := b.Driver.Maintain(ctx, outboxdriver.MaintainRequest{Retention: time.Hour, Limit: 100})
	if err != nil || !m.Skipped || len(m.Created) != 0 {
		t.Fatalf("Maintain while another holds the lock: %+v, %v; want skipped", m, err)
	}
	if _, err := b.Driver.CreatePartitions(ctx, 7, false); !errors.Is(err, outboxpgx.ErrBusy) {
		t.Fatalf("CreatePartitions while another holds the lock: %v; want ErrBusy", err)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	m, err = maintainUntilRan(t, b.Driver, outboxdriver.MaintainRequest{Retention: time.Hour, Limit: 100})
	if err != nil || len(m.Created) != 3 {
		t.Fatalf("Maintain once the lock is free: %+v, %v; want the 3 missing days created", m, err)
	}
}

// A day is 24 hours of UTC whatever the session's time zone: across a daylight-saving
// change in local time the bounds do not move, and neighbouring days do not overlap.
func TestPartitionBoundsIgnoreSessionTimeZone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for _, day := range []string{"2027-03-27", "2027-03-28", "2027-03-29", "2027-10-30", "2027-10-31", "2027-11-01"} {
		err := pgx.BeginFunc(ctx, b.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL TimeZone = 'Europe/Berlin'; SET LOCAL DateStyle = 'SQL, DMY'`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, fmt.Sprintf(`SELECT "%s".outbox_published_partition($1::date)`, b.Schema), day)
			return err
		})
		if err != nil {
			t.Fatalf("create the partition of %s in a session on Europe/Berlin time: %v", day, err)
		}
	}
	var bound string
	err := pgx.BeginFunc(ctx, b.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL TimeZone = 'UTC'`); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_class c WHERE c.oid = to_regclass($1)`,
			`"`+b.Schema+`".outbox_published_20271031`).Scan(&bound)
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := "FOR VALUES FROM ('2027-10-31 00:00:00+00') TO ('2027-11-01 00:00:00+00')"; bound != want {
		t.Fatalf("bounds of 2027-10-31: %s; want %s", bound, want)
	}
}

// A missing day never loses a message: recording the outcome fails with ErrNoPartition,
// the message stays pending, and once the day exists it is recorded.
func TestMissingPartitionKeepsPending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`1`)})
	b.Exec(t, `DROP TABLE %[1]s.`+dayName(b.Today(t)))
	held := leaseAll(t, b.Driver)
	got, err := b.Driver.Fetch(ctx, outboxdriver.FetchRequest{RelayID: "r", Leases: held, Limit: 10})
	if err != nil || len(got) != 1 {
		t.Fatalf("fetch: %d messages, %v", len(got), err)
	}
	token := map[int]int64{}
	for _, l := range held {
		token[l.Shard] = l.Token
	}
	c := outboxdriver.Completion{RelayID: "r", Published: []outboxdriver.Outcome{{Seq: got[0].Seq, Token: token[got[0].Shard]}}}
	if _, err := b.Driver.Complete(ctx, c); !errors.Is(err, pgsql.ErrNoPartition) {
		t.Fatalf("Complete without today's partition: %v; want ErrNoPartition", err)
	}
	if n := b.CountIn(t, "outbox", "true"); n != 1 {
		t.Fatalf("%d pending after the failed Complete; want the message still pending", n)
	}
	if _, err := b.Driver.Maintain(ctx, outboxdriver.MaintainRequest{Retention: time.Hour, Limit: 100}); err != nil {
		t.Fatal(err)
	}
	if refused, err := b.Driver.Complete(ctx, c); err != nil || len(refused) != 0 {
		t.Fatalf("Complete once the day exists: refused %v, %v", refused, err)
	}
	if n := b.CountIn(t, "outbox_published", "true"); n != 1 {
		t.Fatalf("%d published rows; want 1", n)
	}
}

// TestMigrateToPartitionsWhileRelaying upgrades an outbox at version 2 to the partitioned
// history while a relay publishes and a writer writes: nothing is lost or published
// twice, the old history stays readable and counted, and it is dropped whole once the
// migration is older than the retention.
func TestMigrateToPartitionsWhileRelaying(t *testing.T) {
	t.Parallel()
	db := testdb.NewDB(t)
	drv := driverAt(t, db, outboxpgx.Config{}, 2)
	w, err := outbox.NewWriter(drv, outbox.WriterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	pub := &outboxtest.Publisher{}
	r, err := outbox.NewRelay(drv, pub, outbox.RelayConfig{Logger: testdb.Logger(), PollInterval: 20 * time.Millisecond, CleanupInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(testenv.Context(t)) })

	const n = 400
	written := make(chan error, 1)
	go func() {
		for i := range n {
			ctx, cancel := testenv.CallContext()
			err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				return w.Write(ctx, tx, outbox.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%7), Payload: []byte(strconv.Itoa(i))})
			})
			cancel()
			if err != nil {
				written <- err
				return
			}
		}
		written <- nil
	}()
	pub.Await(t, n/4)
	testenv.Await(t, "outcomes recorded in the history from before the migration", func() (any, bool) {
		k := db.CountIn(t, "outbox_published", "true")
		return k, k > 0
	})
	if _, err := drv.MigrateUp(testenv.Context(t), 0); err != nil {
		t.Fatalf("migrate up to the partitioned history with a relay running: %v", err)
	}
	if err := testenv.AwaitRecv(t, "the writer", written); err != nil {
		t.Fatal(err)
	}
	got := pub.Await(t, n)
	seen := map[string]bool{}
	for _, m := range got {
		if seen[string(m.Payload)] {
			t.Errorf("message %s published twice without a fault", m.Payload)
		}
		seen[string(m.Payload)] = true
	}
	testenv.Await(t, "every outcome recorded", func() (any, bool) {
		k := db.CountIn(t, "outbox", "true")
		return k, k == 0
	})
	old, recent := db.CountIn(t, "outbox_published_legacy", "true"), db.CountIn(t, "outbox_published", "true")
	if old == 0 || old+recent != n {
		t.Fatalf("history: %d rows kept from before the migration + %d after; want some before and %d in all", old, recent, n)
	}
	st, err := drv.Status(testenv.Context(t))
	if err != nil || st.Published != n || st.Partitions == nil || st.Partitions.DaysAhead != pgsql.PartitionDaysAhead {
		t.Fatalf("status: published %d, partitions %+v, %v; want %d and %d days ahead", st.Published, st.Partitions, err, n, pgsql.PartitionDaysAhead)
	}

	// Once the migration is older than the retention, the old history goes whole. The
	// relay is stopped first: its own maintenance would race this call for the lock.
	if err := r.Stop(testenv.Context(t)); err != nil {
		t.Fatal(err)
	}
	db.Exec(t, `UPDATE %[1]s.outbox_migrations SET applied_at = now() - interval '8 days' WHERE version = 3`)
	m, err := maintainUntilRan(t, drv, outboxdriver.MaintainRequest{Retention: 7 * 24 * time.Hour, Limit: 100})
	if err != nil {
		t.Fatalf("maintain: %+v, %v", m, err)
	}
	var exists bool
	if err := db.Pool.QueryRow(testenv.Context(t), `SELECT to_regclass($1) IS NOT NULL`, `"`+db.Schema+`".outbox_published_legacy`).Scan(&exists); err != nil || exists {
		t.Fatalf("the old history still exists after its retention (%+v, %v)", m, err)
	}
	if k := db.CountIn(t, "outbox_published", "true"); k != recent {
		t.Fatalf("%d rows in the partitioned history after dropping the old; want %d", k, recent)
	}
}

// Status counts the partitions and the days ahead from today without a gap: a missing
// today reads -1 however many later days exist, and so does having none at all.
func TestStatusPartitions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	today := b.Today(t)
	status := func() *outboxdriver.PartitionStatus {
		t.Helper()
		st, err := b.Driver.Status(testenv.Context(t))
		if err != nil || st.Partitions == nil {
			t.Fatalf("status: %+v, %v", st.Partitions, err)
		}
		return st.Partitions
	}
	if p := status(); p.Count != 8 || p.DaysAhead != 7 || !p.Oldest.Equal(today) || !p.Newest.Equal(today.AddDate(0, 0, 7)) {
		t.Fatalf("after the migration: %+v; want 8 days from today, 7 ahead", p)
	}
	b.Exec(t, `DROP TABLE %[1]s.`+dayName(today.AddDate(0, 0, 3)))
	if p := status(); p.Count != 7 || p.DaysAhead != 2 {
		t.Fatalf("with day 3 missing: %+v; want 7 partitions, 2 days ahead", p)
	}
	b.Exec(t, `DROP TABLE %[1]s.`+dayName(today))
	if p := status(); p.Count != 6 || p.DaysAhead != -1 {
		t.Fatalf("with today missing: %+v; want 6 partitions, -1 days ahead", p)
	}
	for _, d := range []int{1, 2, 4, 5, 6, 7} {
		b.Exec(t, `DROP TABLE %[1]s.`+dayName(today.AddDate(0, 0, d)))
	}
	if p := status(); p.Count != 0 || p.DaysAhead != -1 || !p.Oldest.IsZero() {
		t.Fatalf("with no partition: %+v; want 0 and -1", p)
	}
}

// TestMigrateUpLocksInTheRelaysOrder: recording an outcome locks the pending table, then
// the history. Migrating from version 2 renames the history (migration 3) and locks the
// pending table (migration 4) in one transaction; taken in that order, the two locks
// deadlock against a relay recording an outcome meanwhile, and PostgreSQL ends one of
// them. The migration takes the pending table's lock first.
func TestMigrateUpLocksInTheRelaysOrder(t *testing.T) {
	t.Parallel()
	db := testdb.NewDB(t)
	drv := driverAt(t, db, outboxpgx.Config{}, 2)
	ctx := testenv.Context(t)
	// What Complete does, in two steps: the pending table, then the history.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	s := pgx.Identifier{db.Schema}.Sanitize()
	if _, err := tx.Exec(ctx, `LOCK TABLE `+s+`.outbox IN ROW EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	migrated := make(chan error, 1)
	go func() {
		_, err := drv.MigrateUp(ctx, 0)
		migrated <- err
	}()
	testenv.Await(t, "the migration waiting for a lock", func() (any, bool) {
		var waiting int
		err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
WHERE NOT l.granted AND c.relnamespace = $1::regnamespace`, db.Schema).Scan(&waiting)
		return fmt.Sprint(waiting, err), err == nil && waiting > 0
	})
	if _, err := tx.Exec(ctx, `LOCK TABLE `+s+`.outbox_published IN ROW EXCLUSIVE MODE`); err != nil {
		t.Fatalf("the outcome's second lock, with the migration waiting: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := testenv.AwaitRecv(t, "the migration", migrated); err != nil {
		t.Fatalf("migrate up: %v", err)
	}
}

// maintainUntilRan calls Maintain until a call is not skipped, as the relay's next
// maintenance would. A skip is the documented answer to a busy table as well as to a held
// maintenance lock: autovacuum on a table just written takes a lock that DROP TABLE waits
// for past the 200 ms lock timeout, on a loaded machine more often than not.
func maintainUntilRan(t *testing.T, m outboxdriver.Maintainer, req outboxdriver.MaintainRequest) (outboxdriver.Maintenance, error) {
	t.Helper()
	var (
		got outboxdriver.Maintenance
		err error
	)
	// The last answer is what is seen: calls that keep being skipped show no progress.
	testenv.Await(t, "a maintenance call that is not skipped", func() (any, bool) {
		got, err = m.Maintain(testenv.Context(t), req)
		return fmt.Sprintf("%+v, %v", got, err), err != nil || !got.Skipped
	})
	return got, err
}
