package outboxpgx_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
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

// driverAt migrates db's schema up to version and returns a driver on it with cfg.
func driverAt(t *testing.T, db *testdb.DB, cfg outboxpgx.Config, version int) *outboxpgx.Driver {
	t.Helper()
	cfg.Schema = db.Schema
	drv, err := outboxpgx.New(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := drv.MigrateUp(testenv.Context(t), version); err != nil {
		t.Fatal(err)
	}
	return drv
}

func recycle(t *testing.T, drv *outboxpgx.Driver) outboxdriver.Recycling {
	t.Helper()
	r, err := drv.Recycle(testenv.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// recycleUntil calls Recycle until done is true of the sum of what the calls did: a
// reclaim that cannot lock its bucket at once (autovacuum may hold it) gives up and is
// tried again.
func recycleUntil(t *testing.T, drv *outboxpgx.Driver, what string, done func(outboxdriver.Recycling) bool) outboxdriver.Recycling {
	t.Helper()
	var sum outboxdriver.Recycling
	testenv.Await(t, what, func() (any, bool) {
		r := recycle(t, drv)
		sum.Rotated, sum.Draining = sum.Rotated || r.Rotated, r.Draining
		sum.Reclaimed += r.Reclaimed
		sum.Moved += r.Moved
		return sum, done(sum)
	})
	return sum
}

// pendingRows renders every pending row, all columns but the bucket, in seq order: what
// a move must keep.
func pendingRows(t *testing.T, db *testdb.DB) []string {
	t.Helper()
	rows, err := db.Pool.Query(testenv.Context(t), fmt.Sprintf(`SELECT concat_ws('|', seq, id, topic, key, aggregate_type,
    event_type, content_type, encode(payload, 'hex'), headers, dedup_key, shard, created_at, next_attempt_at, attempts, last_error)
FROM %q.outbox ORDER BY seq`, db.Schema))
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// bucketCounts returns how many pending rows each bucket holds.
func bucketCounts(t *testing.T, db *testdb.DB) map[int]int {
	t.Helper()
	out := map[int]int{}
	for b := range pgsql.RingBuckets {
		if n := db.CountIn(t, "outbox", "bucket = "+strconv.Itoa(b)); n > 0 {
			out[b] = n
		}
	}
	return out
}

func ringCurrent(t *testing.T, db *testdb.DB) int {
	t.Helper()
	var cur int
	if err := db.Pool.QueryRow(testenv.Context(t), fmt.Sprintf(`SELECT current FROM %q.outbox_ring`, db.Schema)).Scan(&cur); err != nil {
		t.Fatal(err)
	}
	return cur
}

func bucketSize(t *testing.T, db *testdb.DB, b int) int64 {
	t.Helper()
	var size int64
	if err := db.Pool.QueryRow(testenv.Context(t), `SELECT pg_relation_size($1)`, fmt.Sprintf(`%q.outbox_b%d`, db.Schema, b)).Scan(&size); err != nil {
		t.Fatal(err)
	}
	return size
}

func writeN(t *testing.T, db *testdb.DB, from, n int) {
	t.Helper()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "t", Key: fmt.Sprintf("k%d", (from+i)%3), Payload: []byte(strconv.Itoa(from + i))}
	}
	db.Write(t, msgs...)
}

// The ring moves on once the current bucket took its rows, and a retired bucket is
// emptied: its pending rows move to the current bucket with every column unchanged, and
// its storage is given back.
func TestRingRotatesAndReclaims(t *testing.T) {
	t.Parallel()
	db := testdb.Migrated(t)
	drv := driverAt(t, db, outboxpgx.Config{RotateRows: 10}, 0)
	if st, err := drv.Status(testenv.Context(t)); err != nil || st.Ring == nil || *st.Ring != (outboxdriver.RingStatus{}) {
		t.Fatalf("status of a new outbox: ring %+v, %v; want bucket 0, no rotation, no rows", st.Ring, err)
	}
	writeN(t, db, 0, 25)
	// A retry backing off and a message kept for later: the stragglers a bucket keeps.
	db.Exec(t, `UPDATE %[1]s.outbox SET key = 'later', attempts = 2, last_error = 'broker said no', next_attempt_at = now() + interval '1 hour' WHERE seq = 3`)
	if r := recycle(t, drv); !r.Rotated || r.Reclaimed != 0 {
		t.Fatalf("after 25 rows with 10 a bucket: %+v; want a rotation and nothing reclaimed", r)
	}
	if cur := ringCurrent(t, db); cur != 1 {
		t.Fatalf("current bucket %d; want 1", cur)
	}
	writeN(t, db, 25, 5)
	if got := bucketCounts(t, db); got[0] != 25 || got[1] != 5 {
		t.Fatalf("rows by bucket %v; want 25 in 0 and 5 in 1", got)
	}
	st, err := drv.Status(testenv.Context(t))
	if err != nil || st.Ring == nil || *st.Ring != (outboxdriver.RingStatus{Current: 1, Rotations: 1, RowsSinceRotation: 5}) {
		t.Fatalf("status: ring %+v, %v; want bucket 1, 1 rotation, 5 rows since", st.Ring, err)
	}
	before := pendingRows(t, db)
	r := recycleUntil(t, drv, "bucket 0 reclaimed", func(r outboxdriver.Recycling) bool { return r.Reclaimed > 0 })
	if r.Rotated || r.Reclaimed != 1 || r.Moved != 25 {
		t.Fatalf("recycled %+v; want bucket 0 reclaimed with its 25 rows moved, no rotation", r)
	}
	if got := bucketCounts(t, db); got[1] != 30 || len(got) != 1 {
		t.Fatalf("rows by bucket %v; want all 30 in bucket 1", got)
	}
	if after := pendingRows(t, db); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("the move changed rows:\nbefore %v\nafter  %v", before, after)
	}
	if size := bucketSize(t, db, 0); size != 0 {
		t.Fatalf("bucket 0 keeps %d bytes after its reclaim", size)
	}
	// Every row is still fetched, published and recorded from its new bucket.
	pub := &outboxtest.Publisher{}
	startRelay(t, &testBundle{db}, pub, outbox.RelayConfig{})
	got := pub.Await(t, 29)
	for _, m := range got {
		if string(m.Payload) == "2" {
			t.Fatalf("the message kept for later was published")
		}
	}
	testenv.Await(t, "outcomes recorded", func() (any, bool) {
		n := db.CountIn(t, "outbox", "true")
		return n, n == 1
	})
}

// A bucket with more pending rows than a reclaim moves is left to drain (and Recycle says
// so, to be called again sooner), and the ring does not move on into a bucket that still
// has storage: the current one grows instead.
func TestRingLeavesBacklogInPlace(t *testing.T) {
	t.Parallel()
	db := testdb.Migrated(t)
	drv := driverAt(t, db, outboxpgx.Config{RotateRows: 10}, 0)
	writeN(t, db, 0, pgsql.MoveLimit+1)
	if r := recycle(t, drv); !r.Rotated {
		t.Fatalf("first recycle %+v; want a rotation", r)
	}
	if r := recycle(t, drv); r.Reclaimed != 0 || !r.Draining {
		t.Fatalf("a bucket of %d pending rows: %+v; want it left to drain, and said so", pgsql.MoveLimit+1, r)
	}
	writeN(t, db, 0, 20)
	if r := recycle(t, drv); r.Rotated {
		t.Fatalf("the ring moved on into bucket 0, which still holds its backlog: %+v", r)
	}
	if got := bucketCounts(t, db); got[0] != pgsql.MoveLimit+1 || got[1] != 20 {
		t.Fatalf("rows by bucket %v", got)
	}
}

// A bucket that held a backlog (16 MiB or more) is emptied with up to MoveLimitLarge rows
// still pending, not MoveLimit: while the backlog's tail is published rather than after,
// since every full fetch walks the rows published from it until then. When the rows
// moved are due, the ring moves on at once, so that they do not stay in the current
// bucket once published; that bucket, not large, then waits for the usual MoveLimit.
// Rows that wait (retries, delays) do not move the ring on: they would be moved back and
// forth.
func TestRingEmptiesLargeBucketEarly(t *testing.T) {
	t.Parallel()
	for _, waiting := range []bool{false, true} {
		t.Run(fmt.Sprintf("waiting=%v", waiting), func(t *testing.T) {
			t.Parallel()
			db := testdb.Migrated(t)
			drv := driverAt(t, db, outboxpgx.Config{RotateRows: 10}, 0)
			payload := make([]byte, 1500) // stored inline: 11,000 rows take over 16 MiB
			for from := 0; from < 11_000; from += 1_000 {
				msgs := make([]outbox.Message, 1_000)
				for i := range msgs {
					msgs[i] = outbox.Message{Topic: "t", Key: fmt.Sprintf("k%d", (from+i)%7), Payload: payload}
				}
				db.Write(t, msgs...)
			}
			if size := bucketSize(t, db, 0); size < 16<<20 {
				t.Fatalf("bucket 0 holds %d bytes; the test needs 16 MiB", size)
			}
			if r := recycle(t, drv); !r.Rotated {
				t.Fatalf("first recycle %+v; want a rotation", r)
			}
			const left = pgsql.MoveLimit * 5
			db.Exec(t, `DELETE FROM %[1]s.outbox WHERE seq <= (SELECT max(seq) FROM %[1]s.outbox) - `+strconv.Itoa(left))
			if waiting {
				db.Exec(t, `UPDATE %[1]s.outbox SET attempts = 1, next_attempt_at = now() + interval '1 hour'`)
			}
			before := pendingRows(t, db)
			r := recycleUntil(t, drv, "the large bucket emptied", func(r outboxdriver.Recycling) bool { return r.Reclaimed > 0 })
			if r.Moved != left || r.Rotated == waiting {
				t.Fatalf("recycle %+v; want %d rows moved, and the ring moved on: %v", r, left, !waiting)
			}
			if cur, want := ringCurrent(t, db), map[bool]int{false: 0, true: 1}[waiting]; cur != want {
				t.Fatalf("current bucket %d; want %d", cur, want)
			}
			if got := bucketCounts(t, db); len(got) != 1 || got[1] != left {
				t.Fatalf("rows by bucket %v; want the %d in bucket 1", got, left)
			}
			if after := pendingRows(t, db); !slices.Equal(after, before) {
				t.Fatalf("the move changed the pending rows: %d before, %d after", len(before), len(after))
			}
			if waiting {
				return
			}
			if r := recycle(t, drv); r.Reclaimed != 0 || !r.Draining {
				t.Fatalf("bucket 1, not large, with %d pending: %+v; want it left to drain", left, r)
			}
		})
	}
}

// A reclaim does not wait for a writer that holds the bucket: it gives up at once, changes
// nothing, and empties the bucket, writer's row included, once the writer committed.
func TestRingReclaimYieldsToWriters(t *testing.T) {
	t.Parallel()
	db := testdb.Migrated(t)
	drv := driverAt(t, db, outboxpgx.Config{RotateRows: 10}, 0)
	ctx := testenv.Context(t)
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := db.Writer.Write(ctx, tx, outbox.Message{Topic: "t", Key: "open", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	db.Exec(t, `UPDATE %[1]s.outbox_ring SET current = 1`)
	if r := recycle(t, drv); r.Reclaimed != 0 {
		t.Fatalf("reclaimed a bucket an open transaction writes to: %+v", r)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := recycleUntil(t, drv, "bucket 0 reclaimed after the commit", func(r outboxdriver.Recycling) bool { return r.Reclaimed > 0 })
	if r.Reclaimed != 1 || r.Moved != 1 {
		t.Fatalf("after the commit: %+v; want the writer's row moved", r)
	}
	if got := bucketCounts(t, db); got[1] != 1 {
		t.Fatalf("rows by bucket %v; want the writer's row in bucket 1", got)
	}
}

// TestRingUnderLoad rotates and reclaims as fast as it can while writers write and a
// relay publishes, with some messages failing once so that retries wait in retired
// buckets and must be moved: every message is published once, in order per key.
func TestRingUnderLoad(t *testing.T) {
	t.Parallel()
	db := testdb.Migrated(t)
	drv := driverAt(t, db, outboxpgx.Config{RotateRows: 40}, 0)
	const writers, perWriter, keys = 4, 300, 8
	failed := sync.Map{}
	pub := &outboxtest.Publisher{Fail: func(m *outbox.Message) error {
		if n, _ := strconv.Atoi(string(m.Payload[2:])); n%11 == 0 {
			if _, again := failed.LoadOrStore(string(m.Payload), true); !again {
				return errors.New("refused once")
			}
		}
		return nil
	}}
	startRelay(t, &testBundle{db}, pub, outbox.RelayConfig{PollInterval: 10 * time.Millisecond, RetryMinDelay: 200 * time.Millisecond, RetryMaxDelay: 400 * time.Millisecond})

	ctx, cancel := context.WithCancel(context.Background())
	var moved, reclaimed, rotated atomic.Int64
	recycled := make(chan error, 1)
	go func() {
		for ctx.Err() == nil {
			r, err := drv.Recycle(ctx)
			if err != nil && ctx.Err() == nil {
				recycled <- err
				return
			}
			moved.Add(int64(r.Moved))
			reclaimed.Add(int64(r.Reclaimed))
			if r.Rotated {
				rotated.Add(1)
			}
		}
		recycled <- nil
	}()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				// Payload: writer, then the writer's sequence number; each writer has its own keys.
				m := outbox.Message{Topic: "t", Key: fmt.Sprintf("w%d-k%d", w, i%keys), Payload: fmt.Appendf(nil, "%d-%d", w, i)}
				wctx, wcancel := testenv.CallContext()
				err := pgx.BeginFunc(wctx, db.Pool, func(tx pgx.Tx) error { return db.Writer.Write(wctx, tx, m) })
				wcancel()
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	got := pub.Await(t, writers*perWriter)
	cancel()
	if err := <-recycled; err != nil {
		t.Fatalf("recycle: %v", err)
	}
	t.Logf("%d rotations, %d buckets reclaimed, %d rows moved", rotated.Load(), reclaimed.Load(), moved.Load())
	if rotated.Load() < 3 || moved.Load() == 0 {
		t.Fatalf("%d rotations and %d rows moved: the test did not exercise the ring", rotated.Load(), moved.Load())
	}
	onceInKeyOrder(t, got, func(m outbox.Message) int {
		var w, i int
		fmt.Sscanf(string(m.Payload), "%d-%d", &w, &i)
		return i
	})
}

// onceInKeyOrder fails t when a message was published twice (there was no fault), or
// after a later message of its key; place gives a message's place among its key's.
func onceInKeyOrder(t *testing.T, got []outbox.Message, place func(outbox.Message) int) {
	t.Helper()
	last := map[string]int{}
	seen := map[string]bool{}
	for _, m := range got {
		if seen[string(m.Payload)] {
			t.Errorf("message %s published twice without a fault", m.Payload)
		}
		seen[string(m.Payload)] = true
		i := place(m)
		if prev, ok := last[m.Key]; ok && i < prev {
			t.Errorf("key %s: message %d published after %d", m.Key, i, prev)
		}
		last[m.Key] = i
	}
}

// TestMigrateToRingWhileRelaying upgrades an outbox at version 3 to the pending ring while
// a relay publishes and a writer writes, then reverts it with messages pending: nothing
// is lost, published twice or reordered, and seqs keep growing across both changes.
func TestMigrateToRingWhileRelaying(t *testing.T) {
	t.Parallel()
	db := testdb.NewDB(t)
	drv := driverAt(t, db, outboxpgx.Config{RotateRows: 30}, 3)
	w, err := outbox.NewWriter(drv, outbox.WriterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	pub := &outboxtest.Publisher{}
	r, err := outbox.NewRelay(drv, pub, outbox.RelayConfig{Logger: testdb.Logger(), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(testenv.Context(t)) })

	const n = 600
	write := func(from, to int) error {
		for i := from; i < to; i++ {
			ctx, cancel := testenv.CallContext()
			err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				return w.Write(ctx, tx, outbox.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%7), Payload: []byte(strconv.Itoa(i))})
			})
			cancel()
			if err != nil {
				return err
			}
		}
		return nil
	}
	written := make(chan error, 1)
	go func() { written <- write(0, n/2) }()
	pub.Await(t, n/8)
	if _, err := drv.MigrateUp(testenv.Context(t), 4); err != nil {
		t.Fatalf("migrate up to the ring with a relay running: %v", err)
	}
	if err := testenv.AwaitRecv(t, "the writer", written); err != nil {
		t.Fatal(err)
	}
	pub.Await(t, n/2)
	// Back to one table with rows pending: stop the relay so that some are.
	if err := r.Stop(testenv.Context(t)); err != nil {
		t.Fatal(err)
	}
	if err := write(n/2, n*3/4); err != nil {
		t.Fatal(err)
	}
	if _, err := drv.MigrateDown(testenv.Context(t), 3); err != nil {
		t.Fatalf("migrate down from the ring: %v", err)
	}
	if err := write(n*3/4, n); err != nil {
		t.Fatal(err)
	}
	r2, err := outbox.NewRelay(drv, pub, outbox.RelayConfig{Logger: testdb.Logger(), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r2.Stop(testenv.Context(t)) })
	onceInKeyOrder(t, pub.Await(t, n), func(m outbox.Message) int {
		i, _ := strconv.Atoi(string(m.Payload))
		return i
	})
	var ordered bool
	if err := db.Pool.QueryRow(testenv.Context(t), fmt.Sprintf(`SELECT bool_and(ord = seq_ord) FROM (
    SELECT rank() OVER (ORDER BY convert_from(payload, 'UTF8')::int) AS ord, rank() OVER (ORDER BY seq) AS seq_ord
    FROM %q.outbox_published) x`, db.Schema)).Scan(&ordered); err != nil || !ordered {
		t.Fatalf("seqs do not follow the order of writing across the migrations (%v)", err)
	}
}

// Making the pending table a ring copies the backlog under the outbox's lock: above the
// limit the migration refuses and changes nothing.
func TestMigrateToRingRefusesLargeBacklog(t *testing.T) {
	t.Parallel()
	db := testdb.NewDB(t)
	drv := driverAt(t, db, outboxpgx.Config{MigrateCopyLimit: 20}, 3)
	writeN(t, db, 0, 21)
	if _, err := drv.MigrateUp(testenv.Context(t), 0); !errors.Is(err, outboxpgx.ErrCopyLimit) {
		t.Fatalf("migrate up with 21 pending and a limit of 20: %v; want ErrCopyLimit", err)
	}
	var ringed bool
	if err := db.Pool.QueryRow(testenv.Context(t), `SELECT to_regclass($1) IS NOT NULL`, `"`+db.Schema+`".outbox_ring`).Scan(&ringed); err != nil || ringed {
		t.Fatalf("the refused migration left a ring (%v)", err)
	}
	unlimited, err := outboxpgx.New(db.Pool, outboxpgx.Config{Schema: db.Schema, MigrateCopyLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := unlimited.MigrateUp(testenv.Context(t), 4); err != nil || len(v) != 1 || v[0] != 4 {
		t.Fatalf("migrate up without a limit: %v, %v", v, err)
	}
	if n := db.CountIn(t, "outbox", "bucket = 0"); n != 21 {
		t.Fatalf("%d rows in bucket 0 after the migration; want the 21 pending", n)
	}
}
