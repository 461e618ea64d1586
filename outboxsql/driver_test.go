package outboxsql_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // driver "pgx"
	_ "github.com/lib/pq"              // driver "postgres"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxsql"
	"github.com/outboxkit/outbox/outboxtest"
)

// sqlDrivers are the database/sql drivers every test runs with.
var sqlDrivers = []string{"pgx", "postgres"}

type testBundle struct {
	pool   *pgxpool.Pool // reads rows back through another client than the one that wrote them
	db     *sql.DB
	drv    *outboxsql.Driver
	schema string
	w      *outbox.Writer[*sql.Tx]
}

// forEachDriver runs fn, in parallel, once per database/sql driver, each on a fresh
// migrated schema.
func forEachDriver(t *testing.T, fn func(t *testing.T, b *testBundle)) {
	t.Helper()
	t.Parallel()
	for _, name := range sqlDrivers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupUnmigrated(t, name)
			if _, err := b.drv.MigrateUp(testenv.Context(t), 0); err != nil {
				t.Fatalf("migrate: %v", err)
			}
			fn(t, b)
		})
	}
}

// setupUnmigrated returns a bundle on a fresh, empty schema.
func setupUnmigrated(t *testing.T, driverName string) *testBundle {
	t.Helper()
	pool := testdb.Pool(t)
	schema := testdb.NewSchema(t, pool)
	db, err := sql.Open(driverName, testdb.URL())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(12)
	t.Cleanup(func() { _ = db.Close() })
	drv, err := outboxsql.New(db, outboxsql.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter(drv, outbox.WriterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{pool: pool, db: db, drv: drv, schema: schema, w: w}
}

// write commits msgs in one transaction and returns Write's error.
func (b *testBundle) write(t *testing.T, msgs ...outbox.Message) error {
	t.Helper()
	tx, err := b.db.BeginTx(testenv.Context(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	werr := b.w.Write(testenv.Context(t), tx, msgs...)
	if werr != nil && !errors.Is(werr, outbox.ErrDuplicate) {
		return werr
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return werr
}

type row struct {
	Seq                                               int64
	ID                                                string
	Topic, Key, AggregateType, EventType, ContentType string
	Payload                                           []byte
	Headers                                           map[string]string
	DedupKey                                          string
	CreatedAt, NextAttemptAt                          time.Time
	Attempts                                          int
	Published, Dead                                   bool
}

// rows reads every outbox row in seq order through pgx, not through the writer's driver.
func (b *testBundle) rows(t *testing.T) []row {
	t.Helper()
	rs, err := b.pool.Query(testenv.Context(t), fmt.Sprintf(`SELECT seq, id::text, topic, key, aggregate_type, event_type, content_type,
       payload, headers::text, dedup_key, created_at, next_attempt_at, attempts, false, false
FROM %q.outbox ORDER BY seq`, b.schema))
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (row, error) {
		var x row
		var headers string
		err := r.Scan(&x.Seq, &x.ID, &x.Topic, &x.Key, &x.AggregateType, &x.EventType, &x.ContentType,
			&x.Payload, &headers, &x.DedupKey, &x.CreatedAt, &x.NextAttemptAt, &x.Attempts, &x.Published, &x.Dead)
		if err == nil {
			err = json.Unmarshal([]byte(headers), &x.Headers)
		}
		return x, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func payloads(rs []row) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = string(r.Payload)
	}
	return out
}

func TestCommittedWriteIsVisible(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		binary := make([]byte, 256)
		for i := range binary {
			binary[i] = byte(i)
		}
		id := outbox.NewID()
		msgs := []outbox.Message{
			{ID: id, Topic: "orders", Key: "order 1", AggregateType: "order", EventType: "order.placed",
				Payload: []byte(`{"n": 1, "s": "é\u0000"}`),
				Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x-q": `"quoted" \ é`}},
			{Topic: "blobs", Payload: binary},
			{Topic: "empty", DedupKey: "my-key", ContentType: "text/plain"},
		}
		if err := b.write(t, msgs...); err != nil {
			t.Fatal(err)
		}
		got := b.rows(t)
		if len(got) != 3 {
			t.Fatalf("got %d rows, want 3", len(got))
		}

		r := got[0]
		if r.ID != id.String() || r.DedupKey != id.String() {
			t.Errorf("id %s dedup %s, want both %s", r.ID, r.DedupKey, id)
		}
		if r.Topic != "orders" || r.Key != "order 1" || r.AggregateType != "order" || r.EventType != "order.placed" {
			t.Errorf("names not stored as given: %+v", r)
		}
		if string(r.Payload) != string(msgs[0].Payload) || r.ContentType != outbox.ContentTypeJSON {
			t.Errorf("payload %q content type %q", r.Payload, r.ContentType)
		}
		if !maps(r.Headers, msgs[0].Headers) {
			t.Errorf("headers %v, want %v", r.Headers, msgs[0].Headers)
		}

		r = got[1]
		if string(r.Payload) != string(binary) || r.ContentType != outbox.ContentTypeBinary {
			t.Errorf("binary payload %x content type %q", r.Payload, r.ContentType)
		}
		if r.Key != "" || r.AggregateType != "" || r.EventType != "" || len(r.Headers) != 0 {
			t.Errorf("optional fields not empty: %+v", r)
		}
		if _, err := outbox.ParseID(r.ID); err != nil || r.DedupKey != r.ID {
			t.Errorf("default id %q dedup key %q: %v", r.ID, r.DedupKey, err)
		}

		r = got[2]
		if r.Payload == nil || len(r.Payload) != 0 || r.ContentType != "text/plain" || r.DedupKey != "my-key" {
			t.Errorf("empty payload row: payload %#v content type %q dedup %q", r.Payload, r.ContentType, r.DedupKey)
		}

		for i, r := range got {
			if !r.NextAttemptAt.Equal(r.CreatedAt) || r.Attempts != 0 || r.Published || r.Dead {
				t.Errorf("row %d not a fresh pending row: %+v", i, r)
			}
			if i > 0 && r.Seq <= got[i-1].Seq {
				t.Errorf("seq not increasing: %d after %d", r.Seq, got[i-1].Seq)
			}
		}
	})
}

func maps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestRollbackLeavesNothing(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		c := testenv.Context(t)
		tx, err := b.db.BeginTx(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.w.Write(c, tx, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`"rolled back"`)}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}

		tx, err = b.db.BeginTx(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback() }()
		step := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		exec := func(q string) error { _, err := tx.ExecContext(c, q); return err }
		step(b.w.Write(c, tx, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`"kept-1"`)}))
		step(exec("SAVEPOINT s"))
		step(b.w.Write(c, tx, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`"savepoint rolled back"`)},
			outbox.Message{Topic: "t", Key: "k", DedupKey: "taken-then-released"}))
		step(exec("ROLLBACK TO SAVEPOINT s"))
		// The dedup key written after the savepoint is free again.
		step(b.w.Write(c, tx, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`"kept-2"`), DedupKey: "taken-then-released"}))
		step(tx.Commit())

		got := b.rows(t)
		if ps := payloads(got); !slices.Equal(ps, []string{`"kept-1"`, `"kept-2"`}) {
			t.Fatalf("rows %q, want only kept-1, kept-2", ps)
		}
	})
}

// TestLargeBatchInCallOrder writes 5,000 messages in one Write: one statement, rows in
// call order.
func TestLargeBatchInCallOrder(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		msgs := make([]outbox.Message, 5000)
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: "t", Key: "k" + strconv.Itoa(i%7), Payload: []byte(strconv.Itoa(i))}
		}
		if err := b.write(t, msgs...); err != nil {
			t.Fatal(err)
		}
		checkCallOrder(t, b.rows(t), msgs)
	})
}

// TestBatchOverStatementLimit writes more messages than one statement can carry: they
// are split into several statements that keep call order, and a dedup key repeated in a
// later statement is skipped like one repeated in the same statement.
func TestBatchOverStatementLimit(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		if err := b.write(t, outbox.Message{Topic: "t", DedupKey: "old", Payload: []byte(`"old"`)}); err != nil {
			t.Fatal(err)
		}
		msgs := make([]outbox.Message, 13_001)
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: "t", Key: "k" + strconv.Itoa(i%3), Payload: []byte(strconv.Itoa(i))}
		}
		msgs[10].DedupKey = "across"
		msgs[12_500].DedupKey = "across" // third statement
		msgs[5].DedupKey = "within"
		msgs[6].DedupKey = "within"
		msgs[7000].DedupKey = "old"
		err := b.write(t, msgs...)
		var de *outbox.DuplicateError
		if !errors.As(err, &de) || !slices.Equal(de.DedupKeys, []string{"within", "old", "across"}) {
			t.Fatalf("got %v, want duplicates within, old, across", err)
		}
		got := b.rows(t)[1:]
		want := slices.Concat(msgs[:6], msgs[7:7000], msgs[7001:12_500], msgs[12_501:])
		checkCallOrder(t, got, want)
	})
}

func checkCallOrder(t *testing.T, got []row, want []outbox.Message) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d rows, want %d", len(got), len(want))
	}
	for i := range got {
		if string(got[i].Payload) != string(want[i].Payload) || got[i].ID != want[i].ID.String() && !want[i].ID.IsZero() {
			t.Fatalf("row %d (seq %d) holds payload %q, want %q: seq order is not call order",
				i, got[i].Seq, got[i].Payload, want[i].Payload)
		}
		if i > 0 && got[i].Seq <= got[i-1].Seq {
			t.Fatalf("seq %d after %d", got[i].Seq, got[i-1].Seq)
		}
	}
}

func TestDuplicateSkippedTxUsable(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		if err := b.write(t, outbox.Message{Topic: "t", DedupKey: "taken", Payload: []byte(`"first"`)}); err != nil {
			t.Fatal(err)
		}
		c := testenv.Context(t)
		tx, err := b.db.BeginTx(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback() }()
		err = b.w.Write(c, tx,
			outbox.Message{Topic: "t", DedupKey: "a", Payload: []byte(`"a"`)},
			outbox.Message{Topic: "t", DedupKey: "taken", Payload: []byte(`"second"`)},
			outbox.Message{Topic: "t", DedupKey: "b", Payload: []byte(`"b"`)},
			outbox.Message{Topic: "t", DedupKey: "a", Payload: []byte(`"a again"`)},
		)
		var de *outbox.DuplicateError
		if !errors.As(err, &de) || !errors.Is(err, outbox.ErrDuplicate) || !slices.Equal(de.DedupKeys, []string{"taken", "a"}) {
			t.Fatalf("got %v, want *DuplicateError for taken, a", err)
		}
		// The transaction is not aborted: it runs more statements and commits.
		if err := b.w.Write(c, tx, outbox.Message{Topic: "t", DedupKey: "c", Payload: []byte(`"c"`)}); err != nil {
			t.Fatalf("write after duplicate: %v", err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatalf("commit after duplicate: %v", err)
		}
		if ps := payloads(b.rows(t)); !slices.Equal(ps, []string{`"first"`, `"a"`, `"b"`, `"c"`}) {
			t.Fatalf("rows %q", ps)
		}
	})
}

// TestConcurrentDuplicate has 8 transactions write the same dedup key at once: one row,
// and every other Write reports the duplicate once the first transaction commits.
func TestConcurrentDuplicate(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		const n = 8
		c := testenv.Context(t)
		// Open every transaction first so that the writes really race.
		txs := make([]*sql.Tx, n)
		for i := range txs {
			tx, err := b.db.BeginTx(c, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }()
			txs[i] = tx
		}
		errs := make([]error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, tx := range txs {
			wg.Go(func() {
				<-start
				errs[i] = b.w.Write(c, tx, outbox.Message{Topic: "t", DedupKey: "once", Payload: []byte(strconv.Itoa(i))})
				if err := tx.Commit(); err != nil && errs[i] == nil {
					errs[i] = fmt.Errorf("commit: %w", err)
				}
			})
		}
		close(start)
		wg.Wait()
		ok := 0
		for i, err := range errs {
			switch {
			case err == nil:
				ok++
			case !errors.Is(err, outbox.ErrDuplicate):
				t.Errorf("writer %d: %v, want nil or ErrDuplicate", i, err)
			}
		}
		if ok != 1 {
			t.Errorf("%d writers succeeded, want 1", ok)
		}
		if got := b.rows(t); len(got) != 1 {
			t.Errorf("%d rows, want 1", len(got))
		}
	})
}

// TestDuplicateWaitsForHolder: a writer whose dedup key is held by an open transaction
// waits for it, then inserts if the holder rolled back or skips if it committed.
func TestDuplicateWaitsForHolder(t *testing.T) {
	for _, holderCommits := range []bool{false, true} {
		t.Run(map[bool]string{false: "holder rolls back", true: "holder commits"}[holderCommits], func(t *testing.T) {
			forEachDriver(t, func(t *testing.T, b *testBundle) {
				c := testenv.Context(t)
				holder, err := b.db.BeginTx(c, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = holder.Rollback() }()
				if err := b.w.Write(c, holder, outbox.Message{Topic: "t", DedupKey: "k", Payload: []byte(`"holder"`)}); err != nil {
					t.Fatal(err)
				}

				waiter, err := b.db.BeginTx(c, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = waiter.Rollback() }()
				var waiterPID int
				if err := waiter.QueryRowContext(c, "SELECT pg_backend_pid()").Scan(&waiterPID); err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() {
					done <- b.w.Write(c, waiter, outbox.Message{Topic: "t", DedupKey: "k", Payload: []byte(`"waiter"`)})
				}()
				waitBlocked(t, b.pool, waiterPID, done)

				if holderCommits {
					err = holder.Commit()
				} else {
					err = holder.Rollback()
				}
				if err != nil {
					t.Fatal(err)
				}
				werr := <-done
				if err := waiter.Commit(); err != nil {
					t.Fatal(err)
				}
				want := `"waiter"`
				if holderCommits {
					want = `"holder"`
					var de *outbox.DuplicateError
					if !errors.As(werr, &de) || !slices.Equal(de.DedupKeys, []string{"k"}) {
						t.Fatalf("waiter got %v, want a DuplicateError for k", werr)
					}
				} else if werr != nil {
					t.Fatalf("waiter got %v, want it to insert after the rollback", werr)
				}
				if ps := payloads(b.rows(t)); !slices.Equal(ps, []string{want}) {
					t.Fatalf("rows %q, want %s", ps, want)
				}
			})
		})
	}
}

// waitBlocked waits until backend pid waits for a lock.
func waitBlocked(t *testing.T, pool *pgxpool.Pool, pid int, done <-chan error) {
	t.Helper()
	testenv.AwaitCond(t, "the waiter's Write to block on the holder", func() bool {
		ctx, cancel := testenv.CallContext()
		defer cancel()
		var blocked bool
		err := pool.QueryRow(ctx, `SELECT coalesce(cardinality(pg_blocking_pids($1)) > 0, false)`, pid).Scan(&blocked)
		if err != nil {
			t.Fatal(err)
		}
		if blocked {
			return true
		}
		select {
		case err := <-done:
			t.Fatalf("the waiter's Write returned (%v) while the holder still held the dedup key", err)
		default:
		}
		return false
	})
}

func TestInvalidMessageWritesNothing(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		cases := []struct {
			name  string
			msg   outbox.Message
			field string
		}{
			{"no topic", outbox.Message{Payload: []byte(`{}`)}, "Topic"},
			{"bad json", outbox.Message{Topic: "t", ContentType: "application/json", Payload: []byte(`{"a":`)}, "Payload"},
			{"oversized", outbox.Message{Topic: "t", Payload: make([]byte, outbox.MaxPayloadBytesDefault+1)}, "Payload"},
			{"header CRLF", outbox.Message{Topic: "t", Headers: map[string]string{"x": "a\r\nInjected: 1"}}, `Headers["x"]`},
			{"key NUL", outbox.Message{Topic: "t", Key: "a\x00b"}, "Key"},
			{"dedup key invalid utf8", outbox.Message{Topic: "t", DedupKey: "\xff"}, "DedupKey"},
		}
		for _, tc := range cases {
			err := b.write(t, outbox.Message{Topic: "t", Payload: []byte(`{}`)}, tc.msg)
			var ve *outbox.ValidationError
			if !errors.As(err, &ve) || !errors.Is(err, outbox.ErrInvalidMessage) {
				t.Fatalf("%s: got %v, want *ValidationError", tc.name, err)
			}
			if ve.Index != 1 || ve.Field != tc.field {
				t.Fatalf("%s: got index %d field %q, want 1 %q (%v)", tc.name, ve.Index, ve.Field, tc.field, err)
			}
		}
		if got := b.rows(t); len(got) != 0 {
			t.Fatalf("%d rows written by rejected calls", len(got))
		}
	})
}

func TestDeliverAt(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		future := time.Now().Add(time.Hour).Round(time.Microsecond)
		if err := b.write(t,
			outbox.Message{Topic: "t", Payload: []byte(`"future"`), DeliverAt: future},
			outbox.Message{Topic: "t", Payload: []byte(`"past"`), DeliverAt: time.Now().Add(-time.Hour)},
			outbox.Message{Topic: "t", Payload: []byte(`"future, other zone"`), DeliverAt: future.In(time.FixedZone("x", -7*3600))},
		); err != nil {
			t.Fatal(err)
		}
		got := b.rows(t)
		if len(got) != 3 {
			t.Fatalf("%d rows, want 3", len(got))
		}
		for _, i := range []int{0, 2} {
			if !got[i].NextAttemptAt.Equal(future) {
				t.Errorf("%s: next_attempt_at %v, want %v", got[i].Payload, got[i].NextAttemptAt, future)
			}
		}
		if !got[1].NextAttemptAt.Equal(got[1].CreatedAt) {
			t.Errorf("past: next_attempt_at %v, want now() = created_at %v", got[1].NextAttemptAt, got[1].CreatedAt)
		}
	})
}

func TestNilTransaction(t *testing.T) {
	t.Parallel()
	drv, err := outboxsql.New(nil, outboxsql.Config{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter(drv, outbox.WriterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(context.Background(), nil, outbox.Message{Topic: "t"}); err == nil {
		t.Fatal("Write with a nil *sql.Tx succeeded")
	}
	if _, err := drv.Insert(context.Background(), nil, []outbox.Message{{Topic: "t"}}); err == nil {
		t.Fatal("Insert with a nil *sql.Tx succeeded")
	}
}

func TestMigrationsNeedDB(t *testing.T) {
	t.Parallel()
	drv, err := outboxsql.New(nil, outboxsql.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := drv.MigrateUp(context.Background(), 0); err == nil {
		t.Fatal("MigrateUp without a *sql.DB succeeded")
	}
	if _, err := drv.MigrationStatus(context.Background()); err == nil {
		t.Fatal("MigrationStatus without a *sql.DB succeeded")
	}
	if s, err := drv.MigrationSQL(); err != nil || s == "" {
		t.Fatalf("MigrationSQL without a *sql.DB: %q, %v", s, err)
	}
}

func TestBadIdentifiersRejected(t *testing.T) {
	t.Parallel()
	for _, cfg := range []outboxsql.Config{
		{Schema: `x"; DROP TABLE y; --`},
		{Schema: "Upper"},
		{Prefix: "a b"},
		{Prefix: "p\x00"},
		{Schema: "s" + string(make([]byte, 70))},
		{Prefix: "a_very_long_prefix_that_would_be_truncated_by_pg_"},
	} {
		_, err := outboxsql.New(nil, cfg)
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Fatalf("%+v: got %v, want *ConfigError", cfg, err)
		}
	}
}

func TestMigrations(t *testing.T) {
	t.Parallel()
	for _, name := range sqlDrivers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupUnmigrated(t, name)
			c := testenv.Context(t)
			status := func(want bool) {
				t.Helper()
				st, err := b.drv.MigrationStatus(c)
				if err != nil {
					t.Fatal(err)
				}
				if len(st) == 0 {
					t.Fatal("no migrations listed")
				}
				for _, s := range st {
					if s.Applied != want {
						t.Fatalf("migration %d %s applied=%v, want %v", s.Version, s.Name, s.Applied, want)
					}
				}
			}
			exists := func(want bool) {
				t.Helper()
				for _, table := range []string{"outbox", "outbox_leases", "outbox_relays"} {
					var ok bool
					q := `SELECT to_regclass($1) IS NOT NULL`
					if err := b.pool.QueryRow(c, q, fmt.Sprintf("%q.%q", b.schema, table)).Scan(&ok); err != nil {
						t.Fatal(err)
					}
					if ok != want {
						t.Fatalf("table %s exists=%v, want %v", table, ok, want)
					}
				}
			}

			status(false)
			applied, err := b.drv.MigrateUp(c, 0)
			if err != nil || len(applied) == 0 || applied[0] != 1 {
				t.Fatalf("first up: %v, %v", applied, err)
			}
			applied2, err := b.drv.MigrateUp(c, 0)
			if err != nil || len(applied2) != 0 {
				t.Fatalf("second up applied %v, %v; want nothing", applied2, err)
			}
			status(true)
			exists(true)

			reverted, err := b.drv.MigrateDown(c, 0)
			newestFirst := slices.Clone(applied)
			slices.Reverse(newestFirst)
			if err != nil || !slices.Equal(reverted, newestFirst) {
				t.Fatalf("down reverted %v, %v; want %v newest first", reverted, err, applied)
			}
			exists(false)
			status(false)
		})
	}
}

func TestMigrationSQLScript(t *testing.T) {
	forEachScript := func(t *testing.T, name string) {
		b := setupUnmigrated(t, name)
		c := testenv.Context(t)
		script, err := b.drv.MigrationSQL()
		if err != nil {
			t.Fatal(err)
		}
		// As psql -f would: the whole script, multiple statements, no parameters.
		if _, err := b.db.ExecContext(c, script); err != nil {
			t.Fatalf("apply script: %v", err)
		}
		st, err := b.drv.MigrationStatus(c)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range st {
			if !s.Applied {
				t.Fatalf("after the script, migration %d %s is not applied", s.Version, s.Name)
			}
		}
		if applied, err := b.drv.MigrateUp(c, 0); err != nil || len(applied) != 0 {
			t.Fatalf("up after the script applied %v, %v; want nothing", applied, err)
		}
		if err := b.write(t, outbox.Message{Topic: "t", Payload: []byte(`1`)}); err != nil {
			t.Fatalf("write on the scripted schema: %v", err)
		}
	}
	t.Parallel()
	for _, name := range sqlDrivers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			forEachScript(t, name)
		})
	}
}

// TestRelayPublishesSQLWrites: rows written through database/sql are published whole,
// in order, by the pgx relay.
func TestRelayPublishesSQLWrites(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		msgs := []outbox.Message{
			{Topic: "orders", Key: "o-1", EventType: "order.placed", Payload: []byte(`{"n":1}`),
				Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}},
			{Topic: "orders", Key: "o-1", EventType: "order.paid", Payload: []byte{0, 1, 2, 0xff}},
		}
		if err := b.write(t, msgs...); err != nil {
			t.Fatal(err)
		}
		store, err := outboxpgx.New(b.pool, outboxpgx.Config{Schema: b.schema})
		if err != nil {
			t.Fatal(err)
		}
		pub := &outboxtest.Publisher{}
		r, err := outbox.NewRelay(store, pub, outbox.RelayConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
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
		got := pub.Await(t, 2)
		for i, m := range got {
			want := msgs[i]
			if m.EventType != want.EventType || string(m.Payload) != string(want.Payload) || !maps(m.Headers, want.Headers) ||
				m.DedupKey != m.ID.String() || m.ID.IsZero() {
				t.Errorf("message %d not carried whole: %+v", i, m)
			}
		}
	})
}
