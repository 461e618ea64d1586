package outboxpgx

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testpg"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxtest"
)

// The relay in WAL mode (slice 3 of docs/design-wal.md), on a private server with
// logical decoding.
func TestWALRelay(t *testing.T) {
	t.Parallel()
	srv := testpg.StartServer(t, "wal_level=logical", "wal_sender_timeout=5s", "max_replication_slots=20", "max_wal_senders=20")
	for _, tc := range []struct {
		name string
		test func(*testing.T, *testpg.Server)
	}{
		{"CatchUpThenLive", testWALRelayCatchUpThenLive},
		{"CommitOrderAgreesWithPolling", testWALCommitOrderAgreesWithPolling},
		{"IdleFetchesNothing", testWALRelayIdleFetchesNothing},
		{"SlotDroppedFallsBackToPolling", testWALRelaySlotDropped},
		{"RecordsState", testWALRelayRecordsState},
		{"StandbyTakesOver", testWALRelayStandbyTakesOver},
		{"EndsAStaleReader", testWALRelayEndsAStaleReader},
		{"IdleSlotAdvances", testWALRelayIdleSlotAdvances},
		{"SilentStreamReopens", testWALRelaySilentStreamReopens},
		{"DroppedSlotMadeAnew", testWALRelayDroppedSlotMadeAnew},
		{"LargeAndInterleavedTransactions", testWALRelayLargeAndInterleaved},
		{"WaitingRowsComeDue", testWALRelayWaitingRowsComeDue},
		{"OutOfOrderCommits", testWALRelayOutOfOrderCommits},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.test(t, srv)
		})
	}
}

// fetchCounter counts the relay's fetches, and the messages it took from the log.
type fetchCounter struct {
	outbox.NopObserver
	n, fromLog atomic.Int64
}

func (c *fetchCounter) FetchDone(outbox.FetchEvent) { c.n.Add(1) }

func (c *fetchCounter) WALStream(e outbox.WALStreamEvent) { c.fromLog.Add(int64(e.FromLog)) }

// startWALRelay runs a relay on b's outbox, in WAL mode unless poll, until the test ends.
func startWALRelay(t *testing.T, b *streamBundle, pub outbox.Publisher, poll bool, obs outbox.Observer) {
	t.Helper()
	runWALRelay(t, b, pub, "wal-test", poll, obs)
}

// runWALRelay runs a relay with the ID id on b's outbox, in WAL mode unless poll, until
// the test ends or kill is called: kill ends it as a crash would, without giving its
// leases back.
func runWALRelay(t *testing.T, b *streamBundle, pub outbox.Publisher, id string, poll bool, obs outbox.Observer) (r *outbox.Relay, kill func()) {
	t.Helper()
	var wal *outbox.WALConfig
	if !poll {
		wal = &outbox.WALConfig{SafetyPoll: -1}
	}
	return runWALRelayWith(t, b, pub, id, wal, obs)
}

// runWALRelayWith is runWALRelay with WAL mode's settings: polling when wal is nil.
func runWALRelayWith(t *testing.T, b *streamBundle, pub outbox.Publisher, id string, wal *outbox.WALConfig, obs outbox.Observer) (r *outbox.Relay, kill func()) {
	t.Helper()
	cfg := outbox.RelayConfig{ID: id, PollInterval: 50 * time.Millisecond, LeaseTTL: 3 * time.Second,
		RetryMinDelay: 10 * time.Millisecond, Observer: obs, WAL: wal}
	r, err := outbox.NewRelay(b.drv, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := testenv.CallContext()
		defer cancel()
		if err := r.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return r, func() { cancel(); <-r.Stopped() }
}

func payloads(msgs []outbox.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = string(m.Payload)
	}
	return out
}

func (b *streamBundle) writeKey(t *testing.T, key string, payloads ...string) {
	t.Helper()
	msgs := make([]outbox.Message, len(payloads))
	for i, p := range payloads {
		msgs[i] = outbox.Message{Topic: "t", Key: key, Payload: []byte(fmt.Sprintf("%q", p))}
	}
	b.writeMsgs(t, msgs...)
}

// currentLSN is the server's WAL insert position.
func (b *streamBundle) currentLSN(t *testing.T) uint64 {
	t.Helper()
	var lsn uint64
	if err := b.pool.QueryRow(testenv.Context(t), `SELECT (pg_current_wal_lsn() - '0/0')::bigint`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

// awaitConfirmedPast waits until the slot's confirmed position reaches at least lsn.
func (b *streamBundle) awaitConfirmedPast(t *testing.T, lsn uint64) {
	t.Helper()
	testenv.Await(t, fmt.Sprintf("the slot confirmed past %d", lsn), func() (any, bool) {
		c := b.confirmed(t)
		return c, c >= lsn
	})
}

// Rows written before the slot existed and while no relay ran are published once, in
// order, then what commits while the stream is live; the slot moves past all of it.
func testWALRelayCatchUpThenLive(t *testing.T, srv *testpg.Server) {
	b := newStreamBundle(t, srv, Config{}, false)
	b.writeKey(t, "k", "1", "2")
	ctx := testenv.Context(t)
	if _, err := b.drv.names.WALSetup(ctx, b.drv.inTx, pgsql.WALSetupOptions{Slot: b.slot, Publication: b.pub, SlotTimeout: testenv.Stall()}); err != nil {
		t.Fatal(err)
	}
	b.writeKey(t, "k", "3")
	pub := &outboxtest.Publisher{}
	startWALRelay(t, b, pub, false, nil)
	pub.Await(t, 3)
	b.writeKey(t, "k", "4", "5")
	b.writeKey(t, "other", "x")
	end := b.currentLSN(t)
	got := payloads(pub.Await(t, 6))
	if want := []string{`"1"`, `"2"`, `"3"`, `"4"`, `"5"`, `"x"`}; !slices.Equal(sortedKeyFirst(got), sortedKeyFirst(want)) || !inOrder(got, `"1"`, `"2"`, `"3"`, `"4"`, `"5"`) {
		t.Fatalf("published %v, want 1-5 in order and x, each once", got)
	}
	b.awaitConfirmedPast(t, end)
}

func sortedKeyFirst(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

// inOrder reports whether want appear in got in that order.
func inOrder(got []string, want ...string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// TestWALCommitOrderAgreesWithPolling, design §3: T_low inserts a and stays open, T_high
// inserts b of the same key and commits, T_low commits. The stream delivers b first; what
// the relay publishes is what polling publishes: [a, b] when the relay starts after both
// commits, [b, a] when b was published before T_low committed.
func testWALCommitOrderAgreesWithPolling(t *testing.T, srv *testpg.Server) {
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode+"/relay after both commits", func(t *testing.T) {
			b := newStreamBundle(t, srv, Config{}, true)
			low := b.begin(t)
			b.writeIn(t, low, "k") // a
			high := b.begin(t)
			b.writeIn(t, high, "k") // b
			b.commit(t, high)
			b.commit(t, low)
			pub := &outboxtest.Publisher{}
			startWALRelay(t, b, pub, mode == "poll", nil)
			got := pub.Await(t, 2)
			if len(got) != 2 || got[0].Seq >= got[1].Seq {
				t.Fatalf("published seqs %d, %d: want a (the lower) first", got[0].Seq, got[1].Seq)
			}
		})
		t.Run(mode+"/b published before T_low commits", func(t *testing.T) {
			b := newStreamBundle(t, srv, Config{}, true)
			pub := &outboxtest.Publisher{}
			startWALRelay(t, b, pub, mode == "poll", nil)
			low := b.begin(t)
			a := b.writeIn(t, low, "k")
			high := b.begin(t)
			bb := b.writeIn(t, high, "k")
			b.commit(t, high)
			pub.Await(t, 1)
			b.commit(t, low)
			end := b.currentLSN(t)
			got := pub.Await(t, 2)
			if got[0].Seq != bb[0] || got[1].Seq != a[0] {
				t.Fatalf("published seqs %d, %d: want b (%d) then a (%d)", got[0].Seq, got[1].Seq, bb[0], a[0])
			}
			if mode == "wal" {
				b.awaitConfirmedPast(t, end)
			}
		})
	}
}

// settledWALRelay runs a relay in WAL mode on a new outbox, publishes one message of key
// k ("1"), and returns once the slot is confirmed past it: the relay has nothing left to
// do, and its log path is on (its catch-up was the first fetch).
func settledWALRelay(t *testing.T, srv *testpg.Server) (*streamBundle, *outboxtest.Publisher, *fetchCounter) {
	t.Helper()
	b := newStreamBundle(t, srv, Config{}, true)
	pub := &outboxtest.Publisher{}
	obs := &fetchCounter{}
	startWALRelay(t, b, pub, false, obs)
	b.writeKey(t, "k", "1")
	pub.Await(t, 1)
	b.awaitConfirmedPast(t, b.currentLSN(t))
	return b, pub, obs
}

// An idle outbox costs no query in WAL mode, where polling fetches at every interval.
func testWALRelayIdleFetchesNothing(t *testing.T, srv *testpg.Server) {
	b, pub, obs := settledWALRelay(t, srv)
	before := obs.n.Load()
	time.Sleep(time.Second) // an absence is checked: a slow machine fetches less, not more
	if n := obs.n.Load() - before; n > 1 {
		t.Fatalf("%d fetches in a second of idleness; want none (polling would make about 20)", n)
	}
	// The next message comes from the stream, with no fetch.
	before = obs.n.Load()
	b.writeKey(t, "k", "2")
	pub.Await(t, 2)
	if n, logged := obs.n.Load()-before, obs.fromLog.Load(); n != 0 || logged != 1 {
		t.Fatalf("the message written after the catch-up took %d fetches and %d came from the log; want none and 1", n, logged)
	}
}

// Writers commit in an order other than their seqs': a message whose seq is below one
// already published, never seen before, comes from the log too, with no fetch.
func testWALRelayOutOfOrderCommits(t *testing.T, srv *testpg.Server) {
	b, pub, obs := settledWALRelay(t, srv)
	ctx := testenv.Context(t)
	early, err := b.pool.Begin(ctx) // takes the lower seq, commits last
	if err != nil {
		t.Fatal(err)
	}
	defer early.Rollback(ctx)
	if err := b.w.Write(ctx, early, outbox.Message{Topic: "t", Key: "a", Payload: []byte(`"early"`)}); err != nil {
		t.Fatal(err)
	}
	before, logged := obs.n.Load(), obs.fromLog.Load()
	b.writeKey(t, "b", "late")
	pub.Await(t, 2)
	if err := early.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := payloads(pub.Await(t, 3))
	if got[1] != `"late"` || got[2] != `"early"` {
		t.Fatalf("published %v; want late, then early", got)
	}
	if n, l := obs.n.Load()-before, obs.fromLog.Load()-logged; n != 0 || l != 2 {
		t.Fatalf("%d fetches and %d messages from the log; want none and 2", n, l)
	}
}

// Rows that wait in the table are published when they come due, with nothing else
// written and no safety poll: a delayed message (the stream announces it, the fetch
// hands it to polling), and one whose destination was unavailable (the relay records
// the failure and lets it go). Only the next-due query finds them, and WAL mode asks
// it only when something may have started waiting.
func testWALRelayWaitingRowsComeDue(t *testing.T, srv *testpg.Server) {
	b := newStreamBundle(t, srv, Config{}, true)
	var failed atomic.Bool
	pub := &outboxtest.Publisher{Fail: func(m *outbox.Message) error {
		if string(m.Payload) == `"unavailable"` && failed.CompareAndSwap(false, true) {
			return &outbox.DestinationOutageError{Destination: m.Topic, Err: errors.New("down for a moment")}
		}
		return nil
	}}
	startWALRelay(t, b, pub, false, nil)
	b.writeKey(t, "k", "1")
	pub.Await(t, 1)
	b.awaitActive(t)

	at := time.Now().Add(1500 * time.Millisecond)
	b.writeMsgs(t, outbox.Message{Topic: "t", Key: "d", Payload: []byte(`"delayed"`), DeliverAt: at})
	got := pub.Await(t, 2)
	if p := string(got[1].Payload); p != `"delayed"` {
		t.Fatalf("published %s second; want the delayed message", p)
	}
	if now := time.Now(); now.Before(at) {
		t.Fatalf("the delayed message was published %v before its time", at.Sub(now))
	}

	b.writeKey(t, "u", "unavailable")
	got = pub.Await(t, 3)
	if p := string(got[2].Payload); p != `"unavailable"` || !failed.Load() {
		t.Fatalf("published %s third (failed once: %v); want the message whose destination was down", p, failed.Load())
	}
}

// A slot dropped under the relay loses nothing: the relay falls back to polling.
func testWALRelaySlotDropped(t *testing.T, srv *testpg.Server) {
	b := newStreamBundle(t, srv, Config{}, true)
	pub := &outboxtest.Publisher{}
	startWALRelay(t, b, pub, false, nil)
	b.writeKey(t, "k", "1")
	pub.Await(t, 1)
	b.awaitActive(t)
	ctx := testenv.Context(t)
	if _, err := b.drv.names.WALDrop(ctx, b.drv.inTx, pgsql.WALDropOptions{Slot: b.slot, Publication: b.pub, Force: true}); err != nil {
		t.Fatal(err)
	}
	b.writeKey(t, "k", "2", "3")
	got := payloads(pub.Await(t, 3))
	if !slices.Equal(got, []string{`"1"`, `"2"`, `"3"`}) {
		t.Fatalf("published %v, want 1, 2, 3", got)
	}
}

// walState reads the slot's state and reason from outbox_wal.
func (b *streamBundle) walState(t *testing.T) string {
	t.Helper()
	var state, reason string
	q := fmt.Sprintf(`SELECT state, state_reason FROM %s.outbox_wal WHERE slot_name = $1`, b.quoted())
	if err := b.pool.QueryRow(testenv.Context(t), q, b.slot).Scan(&state, &reason); err != nil {
		t.Fatal(err)
	}
	if reason != "" {
		return state + ":" + reason
	}
	return state
}

// The relay records in outbox_wal whether it streams or polls, and why, for 'outbox wal
// status': a slot recorded but gone (dropped by hand) makes it poll, loudly, losing
// nothing.
func testWALRelayRecordsState(t *testing.T, srv *testpg.Server) {
	b := newStreamBundle(t, srv, Config{}, true)
	pub := &outboxtest.Publisher{}
	b.writeKey(t, "k", "1")
	startWALRelay(t, b, pub, false, nil)
	pub.Await(t, 1)
	testenv.Await(t, "state streaming", func() (any, bool) { s := b.walState(t); return s, s == "streaming" })
	st, err := b.drv.Status(testenv.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.WAL) != 1 || st.WAL[0].Slot != b.slot || st.WAL[0].State != "streaming" || st.WAL[0].Reader != "wal-test" ||
		!st.WAL[0].Exists || !st.WAL[0].Active || st.WAL[0].WALStatus != "reserved" || st.WAL[0].LagBytes < 0 {
		t.Fatalf("status of a streaming slot: %+v", st.WAL)
	}

	other := newStreamBundle(t, srv, Config{}, true)
	other.exec(t, `SELECT pg_drop_replication_slot('`+other.slot+`')`)
	pub2 := &outboxtest.Publisher{}
	runWALRelayWith(t, other, pub2, "wal-test", &outbox.WALConfig{SafetyPoll: -1, KeepLostSlot: true}, nil)
	other.writeKey(t, "k", "1", "2")
	if got := payloads(pub2.Await(t, 2)); !slices.Equal(got, []string{`"1"`, `"2"`}) {
		t.Fatalf("published %v without the slot, want 1, 2", got)
	}
	testenv.Await(t, "state fallback:slot_missing", func() (any, bool) {
		s := other.walState(t)
		return s, s == "fallback:slot_missing"
	})
	st, err = other.drv.Status(testenv.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.WAL) != 1 || st.WAL[0].Exists || st.WAL[0].State != "fallback" || st.WAL[0].Reason != "slot_missing" {
		t.Fatalf("status of a slot gone: %+v", st.WAL)
	}
}

// awaitRecorded waits until no message is pending.
func (b *streamBundle) awaitRecorded(t *testing.T) {
	t.Helper()
	testenv.Await(t, "every outcome recorded", func() (any, bool) {
		var n int
		if err := b.pool.QueryRow(testenv.Context(t), `SELECT count(*) FROM `+b.quoted()+`.outbox`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("%d pending", n), n == 0
	})
}

// slotReader is the relay that holds the slot reader's lease and says it streams, or "".
func (b *streamBundle) slotReader(t *testing.T) string {
	t.Helper()
	var owner string
	q := fmt.Sprintf(`SELECT coalesce(owner, '') FROM %s.outbox_wal WHERE slot_name = $1 AND state = 'streaming'`, b.quoted())
	err := b.pool.QueryRow(testenv.Context(t), q, b.slot).Scan(&owner)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return owner
}

// awaitReader waits until relay id reads the slot and holds every shard, and the relays
// in standby none.
func (b *streamBundle) awaitReader(t *testing.T, id string, reader *outbox.Relay, standby ...*outbox.Relay) {
	t.Helper()
	testenv.Await(t, id+" reading the slot with every shard", func() (any, bool) {
		seen := fmt.Sprintf("reader %q, %q holds %d shards", b.slotReader(t), id, reader.Stats().Shards)
		ok := b.slotReader(t) == id && reader.Stats().Shards == int64(pgsql.Shards)
		for _, s := range standby {
			seen += fmt.Sprintf(", a standby %d", s.Stats().Shards)
			ok = ok && s.Stats().Shards == 0
		}
		return seen, ok
	})
}

// Relays in WAL mode: one holds the slot reader's lease and every shard and reads the
// slot; the others stand by with no shard (design §4). When the reader stops, a standby
// takes the lease and the shards and reads; when that one is killed (its leases not
// given back), the next takes over once its heartbeat expired. Nothing is lost or
// published twice, and each key keeps its order.
func testWALRelayStandbyTakesOver(t *testing.T, srv *testpg.Server) {
	b := newStreamBundle(t, srv, Config{}, true)
	pub := &outboxtest.Publisher{}
	ra, _ := runWALRelay(t, b, pub, "a", false, nil)
	b.awaitReader(t, "a", ra)
	rb, killB := runWALRelay(t, b, pub, "b", false, nil)
	rc, killC := runWALRelay(t, b, pub, "c", false, nil)
	var want []string
	write := func(round int) {
		for k := range 4 {
			key := fmt.Sprintf("k%d", k)
			p := fmt.Sprintf("%d.%d", k, round)
			b.writeKey(t, key, p)
			want = append(want, fmt.Sprintf("%q", p))
		}
	}
	write(0)
	b.awaitReader(t, "a", ra, rb, rc)
	write(1)
	pub.Await(t, len(want))

	stopCtx, cancel := testenv.CallContext()
	defer cancel()
	if err := ra.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	write(2)
	testenv.Await(t, "b or c reading the slot", func() (any, bool) { r := b.slotReader(t); return r, r == "b" || r == "c" })
	next, killNext, last, lastID := rb, killB, rc, "c"
	if b.slotReader(t) == "c" {
		next, killNext, last, lastID = rc, killC, rb, "b"
	}
	b.awaitReader(t, b.slotReader(t), next, last)
	write(3)
	pub.Await(t, len(want))
	b.awaitRecorded(t) // a kill before the record would publish again, by design

	killNext()
	write(4)
	b.awaitReader(t, lastID, last)
	write(5)
	got := payloads(pub.Await(t, len(want)))
	if !slices.Equal(sortedKeyFirst(got), sortedKeyFirst(want)) {
		t.Fatalf("published %v, want %v, each once", got, want)
	}
	for k := range 4 {
		var order []string
		for round := range 6 {
			order = append(order, fmt.Sprintf("%q", fmt.Sprintf("%d.%d", k, round)))
		}
		if !inOrder(got, order...) {
			t.Fatalf("key k%d out of order in %v", k, got)
		}
	}
}

// A session that still reads the slot (here one the test opened; in production a reader
// whose lease expired while it was paused, which keeps the slot until
// wal_sender_timeout) is ended by the relay that holds the slot's lease, which then reads.
func testWALRelayEndsAStaleReader(t *testing.T, srv *testpg.Server) {
	b := newStreamBundle(t, srv, Config{}, true)
	stale := b.stream(t, outboxdriver.StreamRequest{RelayID: "stale"})
	b.awaitActive(t)
	pub := &outboxtest.Publisher{}
	r, _ := runWALRelay(t, b, pub, "reader", false, nil)
	b.awaitReader(t, "reader", r)
	testenv.AwaitRecv(t, "the stale reader's end", stale.exited)
	b.writeKey(t, "k", "1")
	pub.Await(t, 1)
}

// An idle outbox does not hold WAL back: while another database writes a lot, the slot's
// confirmed position follows the server's (the relay acknowledges the positions the
// walsender reports between transactions), so the slot keeps next to nothing.
func testWALRelayIdleSlotAdvances(t *testing.T, srv *testpg.Server) {
	b := newStreamBundle(t, srv, Config{}, true)
	pub := &outboxtest.Publisher{}
	startWALRelay(t, b, pub, false, nil)
	b.writeKey(t, "k", "1")
	pub.Await(t, 1)
	other := "other_" + b.schema
	b.exec(t, `CREATE DATABASE `+other)
	t.Cleanup(func() { _, _ = b.pool.Exec(context.Background(), `DROP DATABASE IF EXISTS `+other+` WITH (FORCE)`) })
	cfg := b.pool.Config().ConnConfig.Copy()
	cfg.Database = other
	conn, err := pgx.ConnectConfig(testenv.Context(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	// About 20 MB of WAL by default; OUTBOX_TEST_WAL_FILLER_MB asks for more (docs/robustness.md
	// has a run with 1 GB).
	mb := 20
	if v, err := strconv.Atoi(os.Getenv("OUTBOX_TEST_WAL_FILLER_MB")); err == nil && v > 0 {
		mb = v
	}
	start := b.currentLSN(t)
	if _, err := conn.Exec(testenv.Context(t), `CREATE TABLE filler AS SELECT g, repeat('x', 500) AS pad FROM generate_series(1, $1::int) g`, mb*2000); err != nil {
		t.Fatal(err)
	}
	end := b.currentLSN(t)
	written := time.Now()
	b.awaitConfirmedPast(t, end)
	t.Logf("another database wrote %d MB of WAL; the idle outbox's slot confirmed past it %v after the write", (end-start)>>20, time.Since(written).Round(time.Millisecond))
	if got := payloads(pub.Await(t, 1)); len(got) != 1 {
		t.Fatalf("published %v, want the one message", got)
	}
}

// walEvents records a relay's WAL news.
type walEvents struct {
	outbox.NopObserver
	mu     sync.Mutex
	events []outbox.WALStreamEvent
}

func (o *walEvents) WALStream(e outbox.WALStreamEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events = append(o.events, e)
}

// count returns how many events since the first `after` ones match.
func (o *walEvents) count(after int, match func(outbox.WALStreamEvent) bool) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, e := range o.events[min(after, len(o.events)):] {
		if match(e) {
			n++
		}
	}
	return n
}

func (o *walEvents) len() int { o.mu.Lock(); defer o.mu.Unlock(); return len(o.events) }

// A stream that stays silent (here its server process is stopped: to the relay, the same
// as a half-open connection) is found by its missing heartbeats: the relay polls, then
// reads the slot again once it can. With SafetyPoll off, nothing else would fetch the
// message written meanwhile.
func testWALRelaySilentStreamReopens(t *testing.T, srv *testpg.Server) {
	b := newStreamBundle(t, srv, Config{}, true)
	pub := &outboxtest.Publisher{}
	obs := &walEvents{}
	runWALRelayWith(t, b, pub, "beating", &outbox.WALConfig{SafetyPoll: -1, Heartbeat: 100 * time.Millisecond}, obs)
	b.writeKey(t, "k", "1")
	pub.Await(t, 1)
	beat := func(e outbox.WALStreamEvent) bool { return !e.Beat.IsZero() }
	testenv.AwaitCond(t, "a heartbeat back through the stream", func() bool { return obs.count(0, beat) > 0 })

	var pid int
	if err := b.pool.QueryRow(testenv.Context(t), `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, b.slot).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Skipf("cannot stop the walsender (pid %d) from this process: %v", pid, err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	defer resume()
	mark := obs.len()
	b.writeKey(t, "k", "2")
	pub.Await(t, 2)
	if n := obs.count(mark, func(e outbox.WALStreamEvent) bool { return e.Silent }); n == 0 {
		t.Fatal("published while the stream was stuck, but the relay never said the stream was silent")
	}
	mark = obs.len()
	resume() // the relay ended the stopped walsender (fenced terminate): it exits now
	testenv.AwaitCond(t, "the stream live and beating again", func() bool {
		return obs.count(mark, func(e outbox.WALStreamEvent) bool { return e.Reading && !e.Beat.IsZero() }) > 0
	})
	b.writeKey(t, "k", "3")
	if got := payloads(pub.Await(t, 3)); !slices.Equal(got, []string{`"1"`, `"2"`, `"3"`}) {
		t.Fatalf("published %v, want 1, 2, 3", got)
	}
}

// A slot dropped by hand under its reader (its row in outbox_wal kept, unlike 'outbox wal
// drop') is made anew by the reader, which reads it: what was written meanwhile is
// published once, in order, and the new slot moves past it.
func testWALRelayDroppedSlotMadeAnew(t *testing.T, srv *testpg.Server) {
	b := newStreamBundle(t, srv, Config{}, true)
	pub := &outboxtest.Publisher{}
	obs := &walEvents{}
	runWALRelayWith(t, b, pub, "remaker", &outbox.WALConfig{SafetyPoll: -1}, obs)
	b.writeKey(t, "k", "1")
	pub.Await(t, 1)
	b.awaitActive(t)
	b.dropSlotByHand(t)
	b.writeKey(t, "k", "2", "3")
	if got := payloads(pub.Await(t, 3)); !slices.Equal(got, []string{`"1"`, `"2"`, `"3"`}) {
		t.Fatalf("published %v, want 1, 2, 3", got)
	}
	recreated := func(e outbox.WALStreamEvent) bool { return e.Recreated }
	testenv.AwaitCond(t, "the relay to say it made the slot anew", func() bool { return obs.count(0, recreated) == 1 })
	b.awaitActive(t)
	b.writeKey(t, "k", "4")
	end := b.currentLSN(t)
	if got := payloads(pub.Await(t, 4)); got[3] != `"4"` {
		t.Fatalf("published %v, want 1-4", got)
	}
	b.awaitConfirmedPast(t, end)
}

// dropSlotByHand drops the bundle's slot as an operator would with
// pg_drop_replication_slot, ending the session that reads it first.
func (b *streamBundle) dropSlotByHand(t *testing.T) {
	t.Helper()
	testenv.Await(t, "the slot dropped", func() (any, bool) {
		_, err := b.pool.Exec(testenv.Context(t), `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, b.slot)
		if err != nil {
			t.Fatal(err)
		}
		_, err = b.pool.Exec(testenv.Context(t), `SELECT pg_drop_replication_slot($1)`, b.slot)
		return err, err == nil
	})
}

// TestWALRelayLostSlotMadeAnew: a slot PostgreSQL invalidated while no relay read it (it
// held more WAL than max_slot_wal_keep_size) is dropped and made anew by the reader, which
// publishes what was written before and since, once and in order.
func TestWALRelayLostSlotMadeAnew(t *testing.T) {
	t.Parallel()
	srv := testpg.StartServer(t, "wal_level=logical", "max_slot_wal_keep_size=1MB")
	b := newStreamBundle(t, srv, Config{}, true)
	b.writeKey(t, "k", "1")
	b.exec(t, `CREATE TABLE %s.filler (x int)`)
	testenv.Await(t, "the slot to be lost", func() (any, bool) {
		b.exec(t, `INSERT INTO %s.filler SELECT generate_series(1, 1000)`)
		b.exec(t, `SELECT pg_switch_wal()`)
		b.exec(t, `CHECKPOINT`)
		s := b.slotStatus(t)
		return s, s == "lost"
	})
	b.writeKey(t, "k", "2")
	pub := &outboxtest.Publisher{}
	obs := &walEvents{}
	runWALRelayWith(t, b, pub, "remaker", &outbox.WALConfig{SafetyPoll: -1}, obs)
	if got := payloads(pub.Await(t, 2)); !slices.Equal(got, []string{`"1"`, `"2"`}) {
		t.Fatalf("published %v, want 1, 2", got)
	}
	testenv.AwaitCond(t, "the relay to say it made the slot anew", func() bool {
		return obs.count(0, func(e outbox.WALStreamEvent) bool { return e.Recreated }) == 1
	})
	if s := b.slotStatus(t); s != "reserved" {
		t.Fatalf("the new slot's wal_status is %q, want reserved", s)
	}
	b.writeKey(t, "k", "3")
	end := b.currentLSN(t)
	if got := payloads(pub.Await(t, 3)); got[2] != `"3"` {
		t.Fatalf("published %v, want 1-3", got)
	}
	b.awaitConfirmedPast(t, end)
}

// slotStatus is the bundle's slot's wal_status ("lost" when PostgreSQL reports none).
func (b *streamBundle) slotStatus(t *testing.T) string {
	t.Helper()
	var status string
	if err := b.pool.QueryRow(testenv.Context(t), `SELECT coalesce(wal_status, 'lost') FROM pg_replication_slots WHERE slot_name = $1`, b.slot).Scan(&status); err != nil {
		t.Fatal(err)
	}
	return status
}

// A transaction of 100,000 events, with two long transactions interleaved around it (one
// open before it and committed after it, one begun inside it and committed before it),
// while the relay streams: every event is published once, each key in insert order, and
// the slot moves past the last commit.
func testWALRelayLargeAndInterleaved(t *testing.T, srv *testpg.Server) {
	const big, keys = 100_000, 1_000
	b := newStreamBundle(t, srv, Config{}, true)
	pub := &outboxtest.Publisher{}
	startWALRelay(t, b, pub, false, nil)
	b.writeKey(t, "warm", "0")
	pub.Await(t, 1)

	ctx := testenv.Context(t)
	early := b.begin(t) // open before the large one, committed after it
	b.writeIn(t, early, "early")
	large := b.begin(t)
	msgs := make([]outbox.Message, 0, 10_000)
	for i := range big {
		msgs = append(msgs, outbox.Message{Topic: "t", Key: fmt.Sprintf("k%d", i%keys), Payload: []byte(fmt.Sprintf("%d", i))})
		if len(msgs) == cap(msgs) {
			if err := b.w.Write(ctx, large, msgs...); err != nil {
				t.Fatal(err)
			}
			msgs = msgs[:0]
		}
		if i == big/2 {
			inner := b.begin(t) // begun inside the large one, committed before it
			b.writeIn(t, inner, "inner")
			b.commit(t, inner)
		}
	}
	b.commit(t, large)
	b.commit(t, early)
	end := b.currentLSN(t)

	got := pub.Await(t, 1+2+big)
	if len(got) != 1+2+big {
		t.Fatalf("published %d messages, want %d, each once", len(got), 1+2+big)
	}
	last := map[string]int{}
	seen := map[string]bool{}
	for _, m := range got {
		if seen[m.ID.String()] {
			t.Fatalf("message %s published twice", m.ID)
		}
		seen[m.ID.String()] = true
		if !strings.HasPrefix(m.Key, "k") {
			continue
		}
		n, _ := strconv.Atoi(string(m.Payload))
		if prev, ok := last[m.Key]; ok && n < prev {
			t.Fatalf("key %s: %d published after %d", m.Key, n, prev)
		}
		last[m.Key] = n
	}
	b.awaitConfirmedPast(t, end)
}
