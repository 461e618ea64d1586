// Package sqlstoretest is the test suite of the database/sql stores (outboxsqlite,
// outboxmysql), beyond the conformance suite every store passes (outboxtest/storetest):
// migrations, table prefixes, big and binary writes, dedup keys under concurrency,
// writers and relays in two processes at once, and a relay end to end. Each store runs
// it against its real database:
//
//	func TestSQLStore(t *testing.T) { sqlstoretest.Run(t, sqlstoretest.Harness{...}) }
package sqlstoretest

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/sqlstore"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxtest"
)

// Driver is what the stores' drivers have in common.
type Driver interface {
	outboxdriver.WriteDriver[*sql.Tx]
	outboxdriver.Store
	outboxdriver.Admin
	outboxdriver.InboxDriver[*sql.Tx]
	outboxdriver.VersionDriver[*sql.Tx]
	DeleteInbox(ctx context.Context, olderThan time.Duration, limit int) (int, error)
	MigrateUp(ctx context.Context, target int) ([]int, error)
	MigrateDown(ctx context.Context, target int) ([]int, error)
	MigrationStatus(ctx context.Context) ([]sqlstore.MigrationStatus, error)
	MigrationSQL() (string, error)
}

// Harness is how the suite reaches one store's database.
type Harness struct {
	// NewDatabase makes a new, empty database for one test and returns a function that
	// opens a pool on it. Each pool stands for a process of its own; pools are closed
	// when the test ends.
	NewDatabase func(t *testing.T) (open func(t *testing.T) *sql.DB)
	// NewDriver is the store's New.
	NewDriver func(db *sql.DB, prefix string) (Driver, error)
	// WaitBlocked, when set, waits until a transaction of db waits for a row lock, so
	// that the suite can check what happens to a writer blocked on a dedup key. Nil for
	// databases whose writers queue before their transaction begins (SQLite).
	WaitBlocked func(t *testing.T, db *sql.DB)
	// HourLater is the SQL of the time column plus one hour, in the store's time type.
	HourLater func(column string) string
}

// Run runs the suite as parallel subtests of t.
func Run(t *testing.T, h Harness) {
	tests := []struct {
		name string
		fn   func(t *testing.T, h Harness)
	}{
		{"Migrations", migrations},
		{"MigrationsConcurrent", migrationsConcurrent},
		{"MigrationSQL", migrationSQL},
		{"PrioritiesDeferred", prioritiesDeferred},
		{"Prefixes", prefixes},
		{"LargeBatch", largeBatch},
		{"BinaryPayloads", binaryPayloads},
		{"DedupConcurrent", dedupConcurrent},
		{"DedupBlockedWriter", dedupBlockedWriter},
		{"BigFetchLists", bigFetchLists},
		{"FreshRowDueWhateverTheClock", freshRowDue},
		{"FencingAcrossProcesses", fencingAcrossProcesses},
		{"WritersAndRelays", writersAndRelays},
		{"RelayEndToEnd", relayEndToEnd},
		{"InboxAndVersions", inboxAndVersions},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, h)
		})
	}
}

// bundle is one pool on a test database with a driver and a writer.
type bundle struct {
	db  *sql.DB
	drv Driver
	w   *outbox.Writer[*sql.Tx]
}

func newBundle(t *testing.T, h Harness, db *sql.DB, prefix string) *bundle {
	t.Helper()
	drv, err := h.NewDriver(db, prefix)
	if err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter[*sql.Tx](drv, outbox.WriterConfig{Limits: outbox.Limits{MaxPayloadBytes: 4 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{db: db, drv: drv, w: w}
}

// migrated returns a bundle on a new, migrated database, and the function that opens
// more pools on it.
func migrated(t *testing.T, h Harness) (*bundle, func(t *testing.T) *sql.DB) {
	t.Helper()
	open := h.NewDatabase(t)
	b := newBundle(t, h, open(t), "")
	if _, err := b.drv.MigrateUp(testenv.Context(t), 0); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return b, open
}

// write writes msgs in one transaction and commits it, also after a *DuplicateError,
// which it returns.
func (b *bundle) write(ctx context.Context, msgs ...outbox.Message) error {
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	werr := b.w.Write(ctx, tx, msgs...)
	if werr != nil && !errors.Is(werr, outbox.ErrDuplicate) {
		return werr
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	return werr
}

// fetchAll takes every shard (adopting relay's earlier leases) and returns every due
// message.
func (b *bundle) fetchAll(t *testing.T, relay string) ([]*outbox.Message, outboxdriver.LeaseState) {
	t.Helper()
	ctx := testenv.Context(t)
	st, err := b.drv.SyncLeases(ctx, outboxdriver.LeaseRequest{RelayID: relay, TTL: time.Minute, Adopt: true})
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.drv.Fetch(ctx, outboxdriver.FetchRequest{RelayID: relay, Leases: st.Held, Limit: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return got, st
}

// release gives back every lease of relay, so that other relays need not wait for them to
// expire.
func (b *bundle) release(t *testing.T, relay string) {
	t.Helper()
	ctx := testenv.Context(t)
	st, err := b.drv.SyncLeases(ctx, outboxdriver.LeaseRequest{RelayID: relay, TTL: time.Minute, Adopt: true})
	if err == nil {
		_, err = b.drv.SyncLeases(ctx, outboxdriver.LeaseRequest{RelayID: relay, Release: st.Held})
	}
	if err != nil {
		t.Fatal(err)
	}
}

func quietLogger() *slog.Logger {
	if os.Getenv("OUTBOX_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func migrations(t *testing.T, h Harness) {
	ctx := testenv.Context(t)
	open := h.NewDatabase(t)
	b := newBundle(t, h, open(t), "")
	st, err := b.drv.MigrationStatus(ctx)
	if err != nil || len(st) == 0 || st[0].Applied {
		t.Fatalf("status of a fresh database = %+v, %v; want migrations, none applied", st, err)
	}
	if v, err := b.drv.MigrateUp(ctx, 0); err != nil || !slices.Equal(v, []int{1, 2, 3, 4}) {
		t.Fatalf("MigrateUp = %v, %v; want [1 2 3 4]", v, err)
	}
	if v, err := b.drv.MigrateUp(ctx, 0); err != nil || len(v) != 0 {
		t.Fatalf("second MigrateUp = %v, %v; want nothing to do", v, err)
	}
	if st, err := b.drv.MigrationStatus(ctx); err != nil || !st[0].Applied || st[0].Name != "init" {
		t.Fatalf("status after up = %+v, %v", st, err)
	}
	if err := b.write(ctx, outbox.Message{Topic: "t", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if v, err := b.drv.MigrateDown(ctx, 0); err != nil || !slices.Equal(v, []int{4, 3, 2, 1}) {
		t.Fatalf("MigrateDown = %v, %v; want [4 3 2 1]", v, err)
	}
	if v, err := b.drv.MigrateDown(ctx, 0); err != nil || len(v) != 0 {
		t.Fatalf("second MigrateDown = %v, %v; want nothing to do", v, err)
	}
	if st, err := b.drv.MigrationStatus(ctx); err != nil || st[0].Applied {
		t.Fatalf("status after down = %+v, %v", st, err)
	}
	if err := b.write(ctx, outbox.Message{Topic: "t", Payload: []byte(`{}`)}); err == nil {
		t.Fatal("a write succeeded after the outbox was dropped")
	}
	if v, err := b.drv.MigrateUp(ctx, 0); err != nil || !slices.Equal(v, []int{1, 2, 3, 4}) {
		t.Fatalf("MigrateUp after down = %v, %v; want [1 2 3 4]", v, err)
	}
	if got, _ := b.fetchAll(t, "r"); len(got) != 0 {
		t.Fatalf("a re-created outbox holds %d messages", len(got))
	}
}

// prioritiesDeferred: before the priority migration, writes without a priority and the
// relay's seq-order fetches work, a write with one and a priority fetch fail with
// outbox.ErrNoPriorities, the migration is reported deferrable, and status shows no
// priorities; after it, the priority fetch reads the rows written before it too; going
// back down drops the priorities and keeps the messages.
func prioritiesDeferred(t *testing.T, h Harness) {
	ctx := testenv.Context(t)
	open := h.NewDatabase(t)
	b := newBundle(t, h, open(t), "")
	if _, err := b.drv.MigrateUp(ctx, sqlstore.PriorityMigration-1); err != nil {
		t.Fatal(err)
	}
	st, err := b.drv.MigrationStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st {
		if m.Version == sqlstore.PriorityMigration && (m.Applied || !m.Deferrable) {
			t.Fatalf("migration %+v: want deferrable and not applied", m)
		}
	}
	if err := b.write(ctx, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`{"n":1}`)}); err != nil {
		t.Fatalf("a write without a priority before the migration: %v", err)
	}
	if err := b.write(ctx, outbox.Message{Topic: "t", Key: "k", Priority: 5, Payload: []byte(`{"n":2}`)}); !errors.Is(err, outbox.ErrNoPriorities) {
		t.Fatalf("a write with a priority before the migration: %v, want ErrNoPriorities", err)
	}
	pf, ok := b.drv.(outboxdriver.PriorityFetcher)
	if !ok {
		t.Fatal("the driver is no PriorityFetcher")
	}
	got, lease := b.fetchAll(t, "r")
	if len(got) != 1 {
		t.Fatalf("fetch before the migration: %d messages, want 1", len(got))
	}
	if _, err := pf.FetchPriority(ctx, outboxdriver.FetchRequest{RelayID: "r", Leases: lease.Held, Limit: 10}); !errors.Is(err, outbox.ErrNoPriorities) {
		t.Fatalf("a priority fetch before the migration: %v, want ErrNoPriorities", err)
	}
	if s, err := b.drv.Status(ctx); err != nil || s.Pending != 1 || len(s.Priorities) != 0 {
		t.Fatalf("status before the migration: %+v, %v; want 1 pending and no priorities", s, err)
	}
	if v, err := b.drv.MigrateUp(ctx, 0); err != nil || !slices.Equal(v, []int{sqlstore.PriorityMigration}) {
		t.Fatalf("MigrateUp = %v, %v", v, err)
	}
	if err := b.write(ctx, outbox.Message{Topic: "t", Key: "p", Priority: 5, Payload: []byte(`{"n":3}`)}); err != nil {
		t.Fatalf("a write with a priority after the migration: %v", err)
	}
	prio, err := pf.FetchPriority(ctx, outboxdriver.FetchRequest{RelayID: "r", Leases: lease.Held, Limit: 10})
	if err != nil || len(prio) != 1 || prio[0].Priority != 5 || string(prio[0].Payload) != `{"n":3}` {
		t.Fatalf("priority fetch after the migration: %v, %v; want the message of priority 5", prio, err)
	}
	if s, err := b.drv.Status(ctx); err != nil || len(s.Priorities) != 2 || s.Priorities[0].Priority != 5 || s.Priorities[0].Pending != 1 {
		t.Fatalf("status after the migration: %+v, %v; want priorities 5 and 0, one message of 5", s.Priorities, err)
	}
	if v, err := b.drv.MigrateDown(ctx, sqlstore.PriorityMigration-1); err != nil || !slices.Equal(v, []int{sqlstore.PriorityMigration}) {
		t.Fatalf("MigrateDown = %v, %v", v, err)
	}
	if got, _ := b.fetchAll(t, "r"); len(got) != 2 {
		t.Fatalf("fetch after going back down: %d messages, want 2", len(got))
	}
}

func migrationsConcurrent(t *testing.T, h Harness) {
	ctx := testenv.Context(t)
	open := h.NewDatabase(t)
	var mu sync.Mutex
	var applied []int
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		b := newBundle(t, h, open(t), "")
		wg.Go(func() {
			v, err := b.drv.MigrateUp(ctx, 0)
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			applied = append(applied, v...)
			mu.Unlock()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent MigrateUp: %v", err)
	}
	slices.Sort(applied)
	if !slices.Equal(applied, []int{1, 2, 3, 4}) {
		t.Fatalf("concurrent migrators applied %v, want each version once", applied)
	}
}

func migrationSQL(t *testing.T, h Harness) {
	ctx := testenv.Context(t)
	open := h.NewDatabase(t)
	db := open(t)
	offline, err := h.NewDriver(nil, "")
	if err != nil {
		t.Fatal(err)
	}
	script, err := offline.MigrationSQL()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, stmt := range strings.Split(script, ";\n") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := conn.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("script statement %q: %v", stmt, err)
		}
	}
	b := newBundle(t, h, db, "")
	if st, err := b.drv.MigrationStatus(ctx); err != nil || !st[0].Applied {
		t.Fatalf("status after running the script = %+v, %v", st, err)
	}
	if v, err := b.drv.MigrateUp(ctx, 0); err != nil || len(v) != 0 {
		t.Fatalf("MigrateUp after the script = %v, %v; want nothing to do", v, err)
	}
	if err := b.write(ctx, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.fetchAll(t, "r"); len(got) != 1 {
		t.Fatalf("fetched %d, want 1", len(got))
	}
}

func prefixes(t *testing.T, h Harness) {
	for _, bad := range []string{"Billing", "bill-ing", "1x", "x`;drop", `x";drop`, "x y", strings.Repeat("a", 41)} {
		_, err := h.NewDriver(nil, bad)
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != "Prefix" || !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("prefix %q: %v, want a ConfigError on Prefix", bad, err)
		}
	}
	if _, err := h.NewDriver(nil, strings.Repeat("a", 40)); err != nil {
		t.Errorf("a 40-byte prefix: %v", err)
	}
	ctx := testenv.Context(t)
	open := h.NewDatabase(t)
	db := open(t)
	plain, billing := newBundle(t, h, db, ""), newBundle(t, h, db, "billing_")
	for _, b := range []*bundle{plain, billing} {
		if _, err := b.drv.MigrateUp(ctx, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := billing.write(ctx, outbox.Message{Topic: "invoices", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if got, _ := plain.fetchAll(t, "r"); len(got) != 0 {
		t.Fatalf("the unprefixed outbox sees %d messages of billing_", len(got))
	}
	if got, _ := billing.fetchAll(t, "r"); len(got) != 1 || got[0].Topic != "invoices" {
		t.Fatalf("billing_ outbox fetched %v", got)
	}
	if _, err := plain.drv.MigrateDown(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if st, err := billing.drv.MigrationStatus(ctx); err != nil || !st[0].Applied {
		t.Fatalf("dropping one outbox touched the other: %+v, %v", st, err)
	}
}

// largeBatch writes 10,000 messages of 1 KiB in one Write: several INSERT statements,
// bounded by placeholders and bytes, in call order.
func largeBatch(t *testing.T, h Harness) {
	b, _ := migrated(t, h)
	ctx := testenv.Context(t)
	const n = 10_000
	body := bytes.Repeat([]byte("x"), 1000)
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "big", Key: "k" + strconv.Itoa(i%100), ContentType: "text/plain",
			Payload: append(strconv.AppendInt(nil, int64(i), 10), body...)}
	}
	msgs[7000].DedupKey = "twice"
	msgs[10].DedupKey = "twice" // the first use wins; the later one, in another statement, is skipped
	err := b.write(ctx, msgs...)
	var de *outbox.DuplicateError
	if !errors.As(err, &de) || !slices.Equal(de.DedupKeys, []string{"twice"}) {
		t.Fatalf("Write = %v, want a DuplicateError for the repeated key", err)
	}
	got, _ := b.fetchAll(t, "r")
	if len(got) != n-1 {
		t.Fatalf("fetched %d, want %d", len(got), n-1)
	}
	want := 0
	for _, m := range got {
		if want == 7000 {
			want++
		}
		if !bytes.Equal(m.Payload, msgs[want].Payload) {
			t.Fatalf("message %d out of call order: payload starts %q", want, m.Payload[:8])
		}
		want++
	}
	// Small messages: the statements are bounded by the placeholder limit instead.
	small := make([]outbox.Message, n)
	for i := range small {
		small[i] = outbox.Message{Topic: "small", Key: "s" + strconv.Itoa(i%7), Payload: strconv.AppendInt(nil, int64(i), 10)}
	}
	if err := b.write(testenv.Context(t), small...); err != nil {
		t.Fatal(err)
	}
	got, _ = b.fetchAll(t, "r")
	got = got[n-1:]
	if len(got) != n {
		t.Fatalf("fetched %d small messages, want %d", len(got), n)
	}
	for i, m := range got {
		if string(m.Payload) != strconv.Itoa(i) {
			t.Fatalf("small message %d out of call order: %q", i, m.Payload)
		}
	}
}

func binaryPayloads(t *testing.T, h Harness) {
	b, _ := migrated(t, h)
	ctx := testenv.Context(t)
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	big := make([]byte, 3<<20)
	_, _ = rand.Read(big)
	payloads := [][]byte{all, {0}, []byte("\xff\xfe\xfd"), {}, nil, big, []byte("  trailing spaces  ")}
	var msgs []outbox.Message
	for i, p := range payloads {
		msgs = append(msgs, outbox.Message{Topic: "bin", Key: "k" + strconv.Itoa(i), ContentType: outbox.ContentTypeBinary,
			Payload: p, Headers: map[string]string{"x-name": "Ünïcødé ✓", "x-quote": `"'\`}})
	}
	if err := b.write(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	got, _ := b.fetchAll(t, "r")
	if len(got) != len(payloads) {
		t.Fatalf("fetched %d, want %d", len(got), len(payloads))
	}
	for i, m := range got {
		if !bytes.Equal(m.Payload, payloads[i]) || m.Payload == nil {
			t.Errorf("payload %d did not round-trip: %d bytes, want %d", i, len(m.Payload), len(payloads[i]))
		}
		if m.Headers["x-name"] != "Ünïcødé ✓" || m.Headers["x-quote"] != `"'\` {
			t.Errorf("headers %d did not round-trip: %v", i, m.Headers)
		}
	}
	b.release(t, "r")
	pub := &outboxtest.Publisher{}
	r := startRelay(t, b.drv, pub, "bin")
	sent := pub.Await(t, len(payloads))
	stopRelay(t, r)
	for _, m := range sent {
		i, _ := strconv.Atoi(m.Key[1:])
		if !bytes.Equal(m.Payload, payloads[i]) {
			t.Errorf("published payload %d differs", i)
		}
	}
}

// dedupConcurrent has many transactions write one dedup key at once: exactly one wins.
func dedupConcurrent(t *testing.T, h Harness) {
	b, open := migrated(t, h)
	other := newBundle(t, h, open(t), "")
	ctx := testenv.Context(t)
	const writers = 12
	results := make(chan error, writers)
	var wg sync.WaitGroup
	for i := range writers {
		w := b
		if i%2 == 1 {
			w = other
		}
		wg.Go(func() {
			results <- w.write(ctx,
				outbox.Message{Topic: "t", Key: "order-1", DedupKey: "order-1-placed", Payload: fmt.Appendf(nil, `{"writer":%d}`, i)},
				outbox.Message{Topic: "t", Key: "w" + strconv.Itoa(i), Payload: []byte(`{}`)})
		})
	}
	wg.Wait()
	close(results)
	won, lost := 0, 0
	for err := range results {
		var de *outbox.DuplicateError
		switch {
		case err == nil:
			won++
		case errors.As(err, &de) && slices.Equal(de.DedupKeys, []string{"order-1-placed"}):
			lost++
		default:
			t.Errorf("concurrent write: %v", err)
		}
	}
	if won != 1 || lost != writers-1 {
		t.Fatalf("%d writers won the dedup key and %d lost, want 1 and %d", won, lost, writers-1)
	}
	got, _ := b.fetchAll(t, "r")
	n := 0
	for _, m := range got {
		if m.DedupKey == "order-1-placed" {
			n++
		}
	}
	if n != 1 || len(got) != writers+1 {
		t.Fatalf("%d messages with the key (want 1), %d in all (want %d)", n, len(got), writers+1)
	}
}

// dedupBlockedWriter: a writer whose dedup key an uncommitted transaction holds waits
// for it, then inserts if that one rolled back and skips if it committed.
func dedupBlockedWriter(t *testing.T, h Harness) {
	for _, commit := range []bool{false, true} {
		t.Run(map[bool]string{false: "Rollback", true: "Commit"}[commit], func(t *testing.T) {
			b, open := migrated(t, h)
			other := newBundle(t, h, open(t), "")
			ctx := testenv.Context(t)
			first, err := b.db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer first.Rollback()
			if err := b.w.Write(ctx, first, outbox.Message{Topic: "t", DedupKey: "k", Payload: []byte(`{"n":1}`)}); err != nil {
				t.Fatal(err)
			}
			second := make(chan error, 1)
			go func() {
				second <- other.write(ctx, outbox.Message{Topic: "t", DedupKey: "k", Payload: []byte(`{"n":2}`)})
			}()
			if h.WaitBlocked != nil {
				h.WaitBlocked(t, b.db)
			}
			if commit {
				err = first.Commit()
			} else {
				err = first.Rollback()
			}
			if err != nil {
				t.Fatal(err)
			}
			err = <-second
			got, _ := b.fetchAll(t, "r")
			if commit {
				if !errors.Is(err, outbox.ErrDuplicate) || len(got) != 1 || string(got[0].Payload) != `{"n":1}` {
					t.Fatalf("after the first committed: second write %v, fetched %d; want a duplicate and the first message", err, len(got))
				}
			} else if err != nil || len(got) != 1 || string(got[0].Payload) != `{"n":2}` {
				t.Fatalf("after the first rolled back: second write %v, fetched %d; want the second message written", err, len(got))
			}
		})
	}
}

// bigFetchLists passes the store more seqs to exclude and more keys than a statement may
// have placeholders (65,535 in MySQL).
func bigFetchLists(t *testing.T, h Harness) {
	b, _ := migrated(t, h)
	ctx := testenv.Context(t)
	if err := b.write(ctx, outbox.Message{Topic: "t", Key: "a", Payload: []byte(`{}`)},
		outbox.Message{Topic: "t", Key: "a", Payload: []byte(`{}`)},
		outbox.Message{Topic: "t", Key: "b", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	all, st := b.fetchAll(t, "r")
	const n = 70_000
	exclude := make([]int64, n)
	for i := range exclude {
		exclude[i] = int64(i) + all[2].Seq + 1000 // none of them exists
	}
	exclude[n-1] = all[0].Seq
	got, err := b.drv.Fetch(ctx, outboxdriver.FetchRequest{RelayID: "r", Leases: st.Held, Exclude: exclude, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Seq != all[1].Seq || got[1].Seq != all[2].Seq {
		t.Fatalf("excluding %d seqs fetched %v", n, got)
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "key " + strconv.Itoa(i)
	}
	keys[n/2] = "a"
	held := make([]int64, n)
	for i := range held {
		held[i] = all[0].Seq
	}
	got, err = b.drv.Fetch(ctx, outboxdriver.FetchRequest{RelayID: "r", Leases: st.Held, After: all[0].Seq, Keys: keys, KeySeqs: held, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Seq != all[1].Seq {
		t.Fatalf("a continuation with %d keys fetched %v", n, got)
	}
}

// fencingAcrossProcesses: a relay in one process loses its leases to a relay in another
// (through the database alone) and its late outcomes are refused.
func fencingAcrossProcesses(t *testing.T, h Harness) {
	a, open := migrated(t, h)
	b := newBundle(t, h, open(t), "")
	ctx := testenv.Context(t)
	var msgs []outbox.Message
	for i := range 8 {
		msgs = append(msgs, outbox.Message{Topic: "t", Key: "k" + strconv.Itoa(i), Payload: []byte(`{}`)})
	}
	if err := a.write(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	// a's leases last long enough that b surely finds them live, however slow the
	// machine; a then renews them with a short TTL and pauses past it.
	sa, err := a.drv.SyncLeases(ctx, outboxdriver.LeaseRequest{RelayID: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got, err := a.drv.Fetch(ctx, outboxdriver.FetchRequest{RelayID: "a", Leases: sa.Held, Limit: 100})
	if err != nil || len(got) != len(msgs) {
		t.Fatalf("a fetched %d, %v", len(got), err)
	}
	if sb, err := b.drv.SyncLeases(ctx, outboxdriver.LeaseRequest{RelayID: "b", TTL: time.Minute}); err != nil || len(sb.Held) != 0 {
		t.Fatalf("b took %d shards from a live relay: %v", len(sb.Held), err)
	}
	short := 1500 * time.Millisecond
	if sa, err = a.drv.SyncLeases(ctx, outboxdriver.LeaseRequest{RelayID: "a", TTL: short, Held: sa.Held}); err != nil || len(sa.Held) != sa.Shards {
		t.Fatalf("a renewed %d of %d leases: %v", len(sa.Held), sa.Shards, err)
	}
	time.Sleep(short + 500*time.Millisecond) // a pauses past its lease (time, not work)
	sb, err := b.drv.SyncLeases(ctx, outboxdriver.LeaseRequest{RelayID: "b", TTL: time.Minute})
	if err != nil || len(sb.Held) != sb.Shards {
		t.Fatalf("b holds %d of %d shards after a's expired: %v", len(sb.Held), sb.Shards, err)
	}
	tokens := map[int]int64{}
	for _, l := range sa.Held {
		tokens[l.Shard] = l.Token
	}
	var c outboxdriver.Completion
	c.RelayID = "a"
	for _, m := range got[:4] {
		c.Published = append(c.Published, outboxdriver.Outcome{Seq: m.Seq, Token: tokens[m.Shard]})
	}
	for _, m := range got[4:] {
		c.Failed = append(c.Failed, outboxdriver.Failure{Outcome: outboxdriver.Outcome{Seq: m.Seq, Token: tokens[m.Shard]}, Error: "late", Dead: true})
	}
	refused, err := a.drv.Complete(ctx, c)
	if err != nil || len(refused) != len(msgs) {
		t.Fatalf("a's late outcomes: refused %d of %d, %v", len(refused), len(msgs), err)
	}
	again, err := b.drv.Fetch(ctx, outboxdriver.FetchRequest{RelayID: "b", Leases: sb.Held, Limit: 100})
	if err != nil || len(again) != len(msgs) {
		t.Fatalf("b fetched %d after the refusal, %v", len(again), err)
	}
	tokens = map[int]int64{}
	for _, l := range sb.Held {
		tokens[l.Shard] = l.Token
	}
	c = outboxdriver.Completion{RelayID: "b"}
	for _, m := range again {
		c.Published = append(c.Published, outboxdriver.Outcome{Seq: m.Seq, Token: tokens[m.Shard]})
	}
	if refused, err := b.drv.Complete(ctx, c); err != nil || len(refused) != 0 {
		t.Fatalf("b's outcomes: refused %v, %v", refused, err)
	}
	if st, err := a.drv.Status(ctx); err != nil || st.Published != int64(len(msgs)) || st.Dead != 0 || st.Pending != 0 {
		t.Fatalf("status %+v, %v", st, err)
	}
}

// writersAndRelays runs writers and two relays, each pair in a process of its own as far
// as the database can tell, all at once: every committed message is published once, in
// order per key, and no rolled-back one is.
func writersAndRelays(t *testing.T, h Harness) {
	a, open := migrated(t, h)
	b := newBundle(t, h, open(t), "")
	const writers, keys, perKey = 6, 4, 15
	pub := &outboxtest.Publisher{}
	ra := startRelay(t, a.drv, pub, "relay-a")
	rb := startRelay(t, b.drv, pub, "relay-b")
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		proc := a
		if w%2 == 1 {
			proc = b
		}
		// Each step has a context of its own: the writers' whole run may take any time.
		step := func(n int) error {
			ctx, cancel := testenv.CallContext()
			defer cancel()
			var batch []outbox.Message
			for k := range keys {
				key := fmt.Sprintf("w%d-k%d", w, k)
				batch = append(batch, outbox.Message{Topic: "orders", Key: key, Payload: fmt.Appendf(nil, `{"n":%d}`, n)})
			}
			if err := proc.write(ctx, batch...); err != nil {
				return err
			}
			// A rolled-back write in between: never published.
			tx, err := proc.db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			err = proc.w.Write(ctx, tx, outbox.Message{Topic: "phantom", Key: fmt.Sprintf("w%d-k0", w), Payload: []byte(`{}`)})
			_ = tx.Rollback()
			return err
		}
		wg.Go(func() {
			for n := range perKey {
				if err := step(n); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("writer: %v", err)
	}
	total := writers * keys * perKey
	got := pub.Await(t, total)
	stopRelay(t, ra)
	stopRelay(t, rb)
	checkOrder(t, got)
	if len(got) != total {
		t.Errorf("published %d messages, want %d", len(got), total)
	}
	if st, err := a.drv.Status(testenv.Context(t)); err != nil || st.Pending != 0 || st.Published != int64(total) {
		t.Fatalf("status %+v, %v; want nothing pending and %d published", st, err, total)
	}
}

// checkOrder fails on a message published twice, a phantom, or a key out of order.
func checkOrder(t *testing.T, got []outbox.Message) {
	t.Helper()
	seen := map[outbox.ID]bool{}
	last := map[string]int{}
	for _, m := range got {
		if m.Topic == "phantom" {
			t.Fatalf("a rolled-back message was published: %+v", m)
		}
		if seen[m.ID] {
			t.Errorf("published twice: %s", m.ID)
		}
		seen[m.ID] = true
		var body struct{ N int }
		if err := json.Unmarshal(m.Payload, &body); err != nil {
			t.Fatal(err)
		}
		if prev, ok := last[m.Key]; ok && body.N != prev+1 {
			t.Fatalf("key %s: message %d published after %d", m.Key, body.N, prev)
		} else if !ok && body.N != 0 {
			t.Fatalf("key %s: message %d published first", m.Key, body.N)
		}
		last[m.Key] = body.N
	}
}

// relayEndToEnd: a relay publishes, retries and dead-letters a poison message, which an
// operator replays once the consumer is fixed.
func relayEndToEnd(t *testing.T, h Harness) {
	b, _ := migrated(t, h)
	var mu sync.Mutex
	fixed := false
	pub := &outboxtest.Publisher{Fail: func(m *outbox.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if m.EventType == "poison" && !fixed {
			return errors.New("consumer rejects poison")
		}
		return nil
	}}
	msgs := []outbox.Message{
		{Topic: "orders", Key: "o1", EventType: "placed", Payload: []byte(`{"n":0}`)},
		{Topic: "orders", Key: "o2", EventType: "poison", Payload: []byte(`{"n":0}`)},
		{Topic: "orders", Key: "o2", EventType: "paid", Payload: []byte(`{"n":1}`)},
		{Topic: "orders", Key: "o1", EventType: "paid", Payload: []byte(`{"n":1}`)},
	}
	if err := b.write(testenv.Context(t), msgs...); err != nil {
		t.Fatal(err)
	}
	r, err := outbox.NewRelay(b.drv, pub, outbox.RelayConfig{ID: "e2e", PollInterval: 20 * time.Millisecond,
		MaxAttempts: 3, RetryMinDelay: 10 * time.Millisecond, RetryMaxDelay: 20 * time.Millisecond, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer stopRelay(t, r)
	got := pub.Await(t, 3) // o1 twice, then o2's second once its first is dead
	testenv.Await(t, "the poison dead-lettered and 3 outcomes recorded", func() (any, bool) {
		ctx, cancel := testenv.CallContext()
		defer cancel()
		n, err := b.drv.DeadCount(ctx, outboxdriver.DeadFilter{})
		if err != nil {
			t.Fatalf("DeadCount: %v", err)
		}
		p := r.Stats().Published
		return fmt.Sprintf("%d dead, %d published", n, p), n == 1 && p == 3
	})
	if len(got) != 3 || r.Stats().Rejected != 2 || r.Stats().DeadLettered != 1 {
		t.Fatalf("published %d, stats %+v; want 3 published, 2 rejections, 1 dead letter", len(got), r.Stats())
	}
	dead, err := b.drv.DeadList(testenv.Context(t), outboxdriver.DeadFilter{Key: "o2"})
	if err != nil || len(dead) != 1 || dead[0].EventType != "poison" || dead[0].Attempts != 3 || !strings.Contains(dead[0].LastError, "rejects poison") {
		t.Fatalf("DeadList = %+v, %v", dead, err)
	}
	mu.Lock()
	fixed = true
	mu.Unlock()
	if n, err := b.drv.DeadReplay(testenv.Context(t), outboxdriver.DeadFilter{ErrorContains: "REJECTS"}); err != nil || n != 1 {
		t.Fatalf("DeadReplay = %d, %v", n, err)
	}
	got = pub.Await(t, 4)
	if got[3].ID != dead[0].ID {
		t.Fatalf("the replayed message went out as %+v", got[3])
	}
	var st outboxdriver.Status
	testenv.Await(t, "the replayed message recorded as published", func() (any, bool) {
		ctx, cancel := testenv.CallContext()
		defer cancel()
		var err error
		if st, err = b.drv.Status(ctx); err != nil {
			t.Fatalf("Status: %v", err)
		}
		return fmt.Sprintf("%d pending, %d dead, %d published", st.Pending, st.Dead, st.Published), st.Pending == 0 && st.Dead == 0 && st.Published == 4
	})
	if len(st.Relays) != 1 || st.Relays[0].ID != "e2e" || !st.Relays[0].Live || st.Shards != sqlstore.Shards || st.ShardsLeased != sqlstore.Shards {
		t.Fatalf("status relays %+v, shards %d leased %d", st.Relays, st.Shards, st.ShardsLeased)
	}
}

func startRelay(t *testing.T, s outboxdriver.Store, pub outbox.Publisher, id string) *outbox.Relay {
	t.Helper()
	// The suite counts duplicates, which a lease lost to a stall of the machine may cause
	// by design: the TTL is far above any stall.
	r, err := outbox.NewRelay(s, pub, outbox.RelayConfig{ID: id, PollInterval: 20 * time.Millisecond, LeaseTTL: time.Minute,
		BatchSize: 50, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return r
}

func stopRelay(t *testing.T, r *outbox.Relay) {
	t.Helper()
	if err := r.Stop(testenv.Context(t)); err != nil {
		t.Errorf("stop relay %s: %v", r.ID(), err)
	}
}

// inboxAndVersions: three concurrent deliveries of one id do the work once, a failed
// handler leaves no record, batches claim only fresh ids, versions only move forward, and
// retention deletes old rows.
func inboxAndVersions(t *testing.T, h Harness) {
	b, open := migrated(t, h)
	ctx := testenv.Context(t)
	in, err := outbox.NewInbox[*sql.Tx](b.drv, outbox.InboxConfig{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	// Each delivery through a pool of its own, as three consumer processes would.
	var ran atomic.Int32
	var wg sync.WaitGroup
	for range 3 {
		db := open(t)
		h := outbox.InboxHandler(in, outbox.SQLTx(db, nil), func(ctx context.Context, tx *sql.Tx, d *outbox.Delivery) error {
			ran.Add(1)
			time.Sleep(50 * time.Millisecond) // hold the claim while the others arrive (pacing; any timing passes)
			return nil
		})
		wg.Go(func() {
			if err := h(ctx, &outbox.Delivery{ID: "m-1"}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if ran.Load() != 1 {
		t.Fatalf("work ran %d times for three concurrent deliveries of one id", ran.Load())
	}
	inTx := outbox.SQLTx(b.db, nil)
	boom := errors.New("boom")
	failing := outbox.InboxHandler(in, inTx, func(context.Context, *sql.Tx, *outbox.Delivery) error { return boom })
	if err := failing(ctx, &outbox.Delivery{ID: "m-2"}); !errors.Is(err, boom) {
		t.Fatalf("failing handler: %v", err)
	}
	err = inTx(ctx, func(tx *sql.Tx) error {
		fresh, err := in.ClaimBatch(ctx, tx, []string{"m-1", "m-2", "m-3", "m-3"})
		if err == nil && !slices.Equal(fresh, []bool{false, true, true, false}) {
			t.Errorf("ClaimBatch = %v, want [false true true false]", fresh)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	v, err := outbox.NewVersions[*sql.Tx](b.drv, outbox.InboxConfig{Consumer: "model"})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		version int64
		want    bool
	}{{2, true}, {1, false}, {2, false}, {5, true}} {
		var ok bool
		if err := inTx(ctx, func(tx *sql.Tx) error { ok, err = v.Advance(ctx, tx, "order", "o-1", step.version); return err }); err != nil {
			t.Fatal(err)
		}
		if ok != step.want {
			t.Fatalf("advance to %d = %v, want %v", step.version, ok, step.want)
		}
	}
	if n, err := b.drv.DeleteInbox(ctx, time.Hour, 10); err != nil || n != 0 {
		t.Fatalf("DeleteInbox of young rows = %d, %v", n, err)
	}
	time.Sleep(1100 * time.Millisecond) // the rows grow older than the 1 s retention below: time, not work
	if n, err := b.drv.DeleteInbox(ctx, time.Second, 2); err != nil || n != 2 {
		t.Fatalf("DeleteInbox with limit 2 = %d, %v", n, err)
	}
	if n, err := b.drv.DeleteInbox(ctx, time.Second, 10); err != nil || n != 1 {
		t.Fatalf("DeleteInbox of the rest = %d, %v; want 1", n, err)
	}
}

// freshRowDue: a fresh row (never retried, not delayed) is due even when its times are
// later than the fetch's clock, as when its writer began after the fetch's statement and
// committed before the fetch read; otherwise its key's later rows would overtake it. The
// first row's times are moved an hour ahead to stand for that writer.
func freshRowDue(t *testing.T, h Harness) {
	b, _ := migrated(t, h)
	ctx := testenv.Context(t)
	for _, p := range []string{"1", "2"} {
		if err := b.write(ctx, outbox.Message{Topic: "t", Key: "k", Payload: []byte(p)}); err != nil {
			t.Fatal(err)
		}
	}
	var first int64
	if err := b.db.QueryRowContext(ctx, `SELECT min(seq) FROM outbox`).Scan(&first); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.ExecContext(ctx, `UPDATE outbox SET created_at = `+h.HourLater("created_at")+`, next_attempt_at = `+h.HourLater("next_attempt_at")+` WHERE seq = ?`, first); err != nil {
		t.Fatal(err)
	}
	got, _ := b.fetchAll(t, "r")
	var payloads []string
	for _, m := range got {
		payloads = append(payloads, string(m.Payload))
	}
	if !slices.Equal(payloads, []string{"1", "2"}) {
		t.Fatalf("fetched %v, want [1 2]: the fresh row of a later-starting writer is due too", payloads)
	}
}
