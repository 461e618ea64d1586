package outboxpgx_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
)

// TestFetchSnapshotSameAsFetch: FetchSnapshot returns what Fetch returns, for a full
// fetch (with an exclusion list) and for a continuation, and a snapshot that makes sense.
func TestFetchSnapshotSameAsFetch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`1`)}, outbox.Message{Topic: "t", Key: "other", Payload: []byte(`2`)})
	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`3`)}, outbox.Message{Topic: "t", Key: "fresh", Payload: []byte(`4`)},
		outbox.Message{Topic: "t", Payload: []byte(`5`), Headers: map[string]string{"h": "v"}})
	held := leaseAll(t, b.Driver)
	for _, tc := range []struct {
		name string
		req  outboxdriver.FetchRequest
		want int
	}{
		{"full", outboxdriver.FetchRequest{Limit: 10}, 5},
		{"full, limited", outboxdriver.FetchRequest{Limit: 2}, 2},
		{"full, excluding", outboxdriver.FetchRequest{Exclude: []int64{2}, Limit: 10}, 4},
		{"continuation", outboxdriver.FetchRequest{After: 2, Limit: 10}, 2},
		{"continuation, k held", outboxdriver.FetchRequest{After: 2, Keys: []string{"k"}, KeySeqs: []int64{1}, Limit: 10}, 3},
	} {
		tc.req.RelayID, tc.req.Leases = "r", held
		want, err := b.Driver.Fetch(ctx, tc.req)
		if err != nil {
			t.Fatal(err)
		}
		got, snap, err := b.Driver.FetchSnapshot(ctx, tc.req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if len(want) != tc.want {
			t.Fatalf("%s: Fetch returned %d messages, want %d: the test's premise is wrong", tc.name, len(want), tc.want)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: FetchSnapshot returned %s, Fetch %s", tc.name, seqs(got), seqs(want))
		}
		if snap.Xmax == 0 || snap.Xmin > snap.Xmax {
			t.Errorf("%s: snapshot %+v", tc.name, snap)
		}
	}
}

// TestFetchSnapshotSeesRunningTransaction: a transaction that has written a message but
// not committed is running in the snapshot, and its message is not returned; once it has
// committed, the next FetchSnapshot's snapshot has it finished, and returns its message.
func TestFetchSnapshotSeesRunningTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.Write(t, outbox.Message{Topic: "t", Key: "before", Payload: []byte(`1`)})
	held := leaseAll(t, b.Driver)
	req := outboxdriver.FetchRequest{RelayID: "r", Leases: held, Limit: 10}

	tx, err := b.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := b.Writer.Write(ctx, tx, outbox.Message{Topic: "t", Key: "running", Payload: []byte(`2`)}); err != nil {
		t.Fatal(err)
	}
	var xid int64
	if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&xid); err != nil {
		t.Fatal(err)
	}

	msgs, snap, err := b.Driver.FetchSnapshot(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Finished(uint32(xid)) {
		t.Errorf("running transaction %d: Finished says true in snapshot %+v", xid, snap)
	}
	// (It is in Xip, or at or above Xmax when no transaction finished after it began.)
	if len(msgs) != 1 || msgs[0].Key != "before" {
		t.Errorf("while the writer runs: fetched %s, want only the committed message", seqs(msgs))
	}

	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	msgs, snap, err = b.Driver.FetchSnapshot(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !snap.Finished(uint32(xid)) {
		t.Errorf("committed transaction %d: Finished says false in snapshot %+v", xid, snap)
	}
	if len(msgs) != 2 || msgs[1].Key != "running" {
		t.Errorf("after the commit: fetched %s, want both messages", seqs(msgs))
	}
}

// TestFetchSnapshotIsTheFetchsSnapshot: the fetch reads in a snapshot taken once the
// outbox's locks are held. The writer holds the outbox locked (as the ring's reclaim
// does while it moves rows and truncates a bucket), so the fetch waits for the lock; the
// writer then commits. A fetch that read in a snapshot taken before the wait would miss
// the writer's rows (a reclaim's moved rows, and TRUNCATE is not MVCC-safe: the emptied
// bucket's too), and the key gate would let later rows overtake them.
func TestFetchSnapshotIsTheFetchsSnapshot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, drv, app := taggedDriver(t, b, 1, nil)
	held := leaseAll(t, drv)
	req := outboxdriver.FetchRequest{RelayID: "r", Leases: held, Limit: 10}
	// Once, so that the connection has the statements prepared: the fetch then waits for
	// the lock when it runs, not while pgx prepares it before the batch.
	if _, _, err := drv.FetchSnapshot(ctx, req); err != nil {
		t.Fatal(err)
	}

	tx, err := b.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := b.Writer.Write(ctx, tx, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`1`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(`LOCK TABLE %q.outbox IN ACCESS EXCLUSIVE MODE`, b.Schema)); err != nil {
		t.Fatal(err)
	}

	type result struct {
		msgs []*outbox.Message
		snap outboxdriver.Snapshot
		err  error
	}
	done := make(chan result, 1)
	go func() {
		msgs, snap, err := drv.FetchSnapshot(ctx, req)
		done <- result{msgs, snap, err}
	}()
	testenv.AwaitCond(t, "the fetch to wait for the outbox's lock", func() bool {
		var n int
		if err := b.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := testenv.AwaitRecv(t, "FetchSnapshot", done)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if len(r.msgs) != 1 {
		t.Fatalf("the fetch returned %s; want the writer's message: it read in a snapshot taken before it waited for the lock", seqs(r.msgs))
	}
}

// TestFetchSnapshotSeesCommittedTransaction: a transaction that committed before the
// fetch is finished in its snapshot, as is one that rolled back.
func TestFetchSnapshotSeesCommittedTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	held := leaseAll(t, b.Driver)
	xidOf := func(commit bool) int64 {
		t.Helper()
		tx, err := b.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if err := b.Writer.Write(ctx, tx, outbox.Message{Topic: "t", Key: fmt.Sprint(commit), Payload: []byte(`1`)}); err != nil {
			t.Fatal(err)
		}
		var xid int64
		if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&xid); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return xid
	}
	committed, rolledBack := xidOf(true), xidOf(false)
	msgs, snap, err := b.Driver.FetchSnapshot(ctx, outboxdriver.FetchRequest{RelayID: "r", Leases: held, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if !snap.Finished(uint32(committed)) || !snap.Finished(uint32(rolledBack)) {
		t.Errorf("committed %d, rolled back %d: want both finished in snapshot %+v", committed, rolledBack, snap)
	}
	if uint64(committed) >= snap.Xmax {
		t.Errorf("committed transaction %d at or above the snapshot's xmax: %+v", committed, snap)
	}
	if len(msgs) != 1 || msgs[0].Key != "true" {
		t.Errorf("fetched %s, want the committed message only", seqs(msgs))
	}
}

// TestFetchSnapshotErrorLeavesNoTransaction: a FetchSnapshot that fails after its
// snapshot was taken (here the fetch cannot lock the outbox) returns the error, and its
// connection is lent again idle, outside any transaction: the batch ran in an implicit
// transaction, which ended with the error.
func TestFetchSnapshotErrorLeavesNoTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pool, drv, _ := taggedDriver(t, b, 1, func(cfg *pgxpool.Config) { cfg.ConnConfig.RuntimeParams["lock_timeout"] = "200ms" })
	held := leaseAll(t, drv)
	req := outboxdriver.FetchRequest{RelayID: "r", Leases: held, Limit: 10}
	// Once, so that the connection has the statements prepared: the fetch then fails
	// when it runs, after the snapshot, not while pgx prepares it.
	if _, _, err := drv.FetchSnapshot(ctx, req); err != nil {
		t.Fatal(err)
	}
	lock, err := b.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx)
	if _, err := lock.Exec(ctx, fmt.Sprintf(`LOCK TABLE %q.outbox IN ACCESS EXCLUSIVE MODE`, b.Schema)); err != nil {
		t.Fatal(err)
	}
	_, _, err = drv.FetchSnapshot(ctx, req)
	if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("FetchSnapshot with the outbox locked: %v, want lock_not_available (55P03)", err)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	status := c.Conn().PgConn().TxStatus()
	c.Release()
	if status != 'I' {
		t.Fatalf("the pool lent a session in transaction status %q, want idle ('I')", status)
	}
	if _, _, err := drv.FetchSnapshot(ctx, req); err != nil {
		t.Fatalf("FetchSnapshot after the failed one: %v", err)
	}
}

// TestFetchSnapshotRoundTrips: FetchSnapshot costs what Fetch costs, one round trip once
// the connection has prepared its statements (pgx prepares a statement the first time a
// connection runs it, which costs a round trip more).
func TestFetchSnapshotRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var trips tripCounter
	_, drv, _ := taggedDriver(t, b, 1, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &tripConn{Conn: c, n: &trips}, nil
		}
	})
	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`1`)})
	held := leaseAll(t, drv)
	req := outboxdriver.FetchRequest{RelayID: "r", Leases: held, Limit: 10}
	measure := func(name string, call func() error) int {
		t.Helper()
		trips.reset()
		if err := call(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		n := trips.get()
		t.Logf("%s: %d round trips", name, n)
		return n
	}
	fetch := func() error { _, err := drv.Fetch(ctx, req); return err }
	fetchSnapshot := func() error { _, _, err := drv.FetchSnapshot(ctx, req); return err }
	measure("Fetch, first on the connection", fetch)
	warmFetch := measure("Fetch, prepared", fetch)
	measure("FetchSnapshot, first on the connection", fetchSnapshot)
	warm := measure("FetchSnapshot, prepared", fetchSnapshot)
	if warmFetch != 1 || warm != 1 {
		t.Errorf("prepared: Fetch took %d round trips, FetchSnapshot %d; want 1 each", warmFetch, warm)
	}
}

// tripCounter counts round trips on the connections it watches: each time a connection
// reads after it wrote, the client has sent something and waits for the answer.
type tripCounter struct {
	mu sync.Mutex
	n  int
}

func (c *tripCounter) reset()   { c.mu.Lock(); c.n = 0; c.mu.Unlock() }
func (c *tripCounter) get() int { c.mu.Lock(); defer c.mu.Unlock(); return c.n }

type tripConn struct {
	net.Conn
	n *tripCounter

	mu    sync.Mutex
	wrote bool // since the last read
}

func (c *tripConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.wrote = true
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *tripConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if c.wrote {
		c.wrote = false
		c.n.mu.Lock()
		c.n.n++
		c.n.mu.Unlock()
	}
	c.mu.Unlock()
	return c.Conn.Read(p)
}

func seqs(msgs []*outbox.Message) string {
	s := make([]string, len(msgs))
	for i, m := range msgs {
		s[i] = fmt.Sprintf("%s@%d", m.Key, m.Seq)
	}
	return fmt.Sprint(s)
}
