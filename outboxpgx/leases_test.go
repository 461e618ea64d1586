package outboxpgx_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
)

// TestLeaseRowsUnchangedWhileHeld: a round renews a relay's leases by its heartbeat
// alone; the lease rows are written only when a shard changes hands (a long transaction
// elsewhere keeps every version written, and every fetch and outcome reads the lease
// rows). A relay whose heartbeat expired loses its shards to the next relay's round.
func TestLeaseRowsUnchangedWhileHeld(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	versions := func() string { // the lease rows' versions: xmin changes with each write
		var v string
		q := fmt.Sprintf(`SELECT string_agg(owner || ':' || xmin::text, ',' ORDER BY shard) FROM "%s".outbox_leases`, b.Schema)
		if err := b.Pool.QueryRow(ctx, q).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	sync := func(relay string, ttl time.Duration, held []outboxdriver.Lease) outboxdriver.LeaseState {
		t.Helper()
		st, err := b.Driver.SyncLeases(ctx, outboxdriver.LeaseRequest{RelayID: relay, TTL: ttl, Held: held})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	a := sync("a", time.Minute, nil)
	if len(a.Held) != a.Shards {
		t.Fatalf("a took %d of %d shards", len(a.Held), a.Shards)
	}
	taken := versions()
	for range 3 {
		if a = sync("a", time.Minute, a.Held); len(a.Held) != a.Shards {
			t.Fatalf("a renewed %d of %d leases", len(a.Held), a.Shards)
		}
	}
	if now := versions(); now != taken {
		t.Fatalf("renewals rewrote lease rows:\n%s\n%s", taken, now)
	}
	// b finds a live: nothing to take. Then a's heartbeat runs out.
	if st := sync("b", time.Minute, nil); len(st.Held) != 0 {
		t.Fatalf("b took %d shards of a live relay", len(st.Held))
	}
	if _, err := b.Pool.Exec(ctx, fmt.Sprintf(`UPDATE "%s".outbox_relays SET expires_at = now() - interval '1 second' WHERE id = 'a'`, b.Schema)); err != nil {
		t.Fatal(err)
	}
	st := sync("b", time.Minute, nil)
	if len(st.Held) != st.Shards {
		t.Fatalf("b took %d of %d shards after a's heartbeat expired", len(st.Held), st.Shards)
	}
	if again := sync("a", time.Minute, a.Held); len(again.Held) != 0 {
		t.Fatalf("a kept %d leases b took", len(again.Held))
	}
}

// TestLeaseReleaseWakesListeners: a lease round that gives shards back notifies the
// listening relays (WakeLeases), so that they take the shards at once rather than at
// their next renewal; a write wakes them as WakeWritten.
func TestLeaseReleaseWakesListeners(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	wakes := make(chan outboxdriver.Wake, 16)
	done := make(chan error, 1)
	go func() {
		done <- b.Driver.Listen(ctx, func(w outboxdriver.Wake, _ int64) { wakes <- w }, outboxdriver.Gate{})
	}()
	defer func() { cancel(); <-done }()
	b.holdGate(t) // writers notify
	if w := testenv.AwaitRecv(t, "Listen's first wake-up", wakes); w != outboxdriver.WakeWritten {
		t.Fatalf("first wake-up %v, want WakeWritten", w)
	}

	held := leaseAll(t, b.Driver)
	if _, err := b.Driver.SyncLeases(ctx, outboxdriver.LeaseRequest{RelayID: "r", TTL: time.Minute, Held: held[1:], Release: held[:1]}); err != nil {
		t.Fatal(err)
	}
	if w := testenv.AwaitRecv(t, "a wake-up after the release", wakes); w != outboxdriver.WakeLeases {
		t.Fatalf("wake-up after a release %v, want WakeLeases", w)
	}
	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`1`)})
	if w := testenv.AwaitRecv(t, "a wake-up after a write", wakes); w != outboxdriver.WakeWritten {
		t.Fatalf("wake-up after a write %v, want WakeWritten", w)
	}
}

// TestLeaseFirstRoundsNeverShareAShard: relays that start together, each in its first
// round, never come out holding the same shard. A take re-checks a row that another
// relay's round took (and committed) while the take ran, on the taker's older snapshot
// of the relays table, where that relay's row, inserted by the same round, is missing:
// the take must not read "owner has no row" as "owner is gone" there.
func TestLeaseFirstRoundsNeverShareAShard(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const relays, rounds = 4, 60
	for round := range rounds {
		if _, err := b.Pool.Exec(ctx, fmt.Sprintf(`DELETE FROM "%[1]s".outbox_relays; UPDATE "%[1]s".outbox_leases SET owner = NULL`, b.Schema)); err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		type answer struct {
			relay int
			st    outboxdriver.LeaseState
			err   error
		}
		answers := make(chan answer, relays)
		for i := range relays {
			go func() {
				<-start
				st, err := b.Driver.SyncLeases(ctx, outboxdriver.LeaseRequest{RelayID: fmt.Sprintf("r%d.%d", round, i), TTL: time.Minute})
				answers <- answer{i, st, err}
			}()
		}
		close(start)
		holder := map[int]int{}
		for range relays {
			a := <-answers
			if a.err != nil {
				t.Fatal(a.err)
			}
			for _, l := range a.st.Held {
				if prev, ok := holder[l.Shard]; ok {
					t.Fatalf("round %d: shard %d held by relays %d and %d", round, l.Shard, prev, a.relay)
				}
				holder[l.Shard] = a.relay
			}
		}
	}
}

// TestSlotLease: the slot reader's lease in the lease round (docs/design-wal.md, §4).
// One relay holds it; while that holder streams and every live relay is in WAL mode it
// is given every shard and the others none, otherwise everyone its fair share; it
// passes on when the holder's heartbeat expires, or at once when given back; an outbox
// without the WAL table leaves the relays polling.
func TestSlotLease(t *testing.T) {
	t.Parallel()
	b, exec, syncAdopt := slotLeaseOutbox(t)
	ctx := context.Background()
	sync := func(relay string, slot *outboxdriver.SlotLease) outboxdriver.LeaseState {
		t.Helper()
		return syncAdopt(relay, slot, false)
	}
	a := sync("a", &outboxdriver.SlotLease{Slot: "s"})
	if a.SlotToken == 0 || a.SlotHolder != "a" || a.Target != a.Shards {
		t.Fatalf("a: token %d, holder %q, target %d; want the lease and every shard", a.SlotToken, a.SlotHolder, a.Target)
	}
	if st := sync("b", &outboxdriver.SlotLease{Slot: "s"}); st.SlotToken != 0 || st.SlotHolder != "a" || st.Target != st.FairShare() {
		t.Fatalf("b beside a starting reader: token %d, holder %q, target %d; want a's lease kept, the fair share", st.SlotToken, st.SlotHolder, st.Target)
	}
	exec(`UPDATE %s.outbox_wal SET state = 'streaming'`)
	if st := sync("b", &outboxdriver.SlotLease{Slot: "s"}); st.Target != 0 {
		t.Fatalf("b beside a streaming reader: target %d, want 0", st.Target)
	}
	if st := sync("a", &outboxdriver.SlotLease{Slot: "s", Token: a.SlotToken}); st.SlotToken != a.SlotToken || st.Target != st.Shards {
		t.Fatalf("a streaming: token %d (had %d), target %d; want its lease and every shard", st.SlotToken, a.SlotToken, st.Target)
	}
	sync("p", nil) // a polling relay: every relay back to its fair share
	if st := sync("b", &outboxdriver.SlotLease{Slot: "s"}); st.Live != 3 || st.Target != st.FairShare() {
		t.Fatalf("b beside a polling relay: target %d of %d live; want the fair share", st.Target, st.Live)
	}
	sync("p", &outboxdriver.SlotLease{Slot: "s"}) // now in WAL mode too
	exec(`UPDATE %s.outbox_relays SET expires_at = now() - interval '1 second' WHERE id = 'a'`)
	bb := sync("b", &outboxdriver.SlotLease{Slot: "s"})
	if bb.SlotToken == 0 || bb.SlotToken == a.SlotToken || bb.SlotHolder != "b" || bb.Target != bb.FairShare() {
		t.Fatalf("b after a's heartbeat expired: token %d, holder %q, target %d; want a new lease, starting, the fair share", bb.SlotToken, bb.SlotHolder, bb.Target)
	}
	if st := sync("a", &outboxdriver.SlotLease{Slot: "s", Token: a.SlotToken}); st.SlotToken != 0 || st.SlotHolder != "b" {
		t.Fatalf("a after b took the lease: token %d, holder %q", st.SlotToken, st.SlotHolder)
	}
	if _, err := b.Driver.SyncLeases(ctx, outboxdriver.LeaseRequest{RelayID: "b", Slot: &outboxdriver.SlotLease{Slot: "s", Token: bb.SlotToken, Release: true}}); err != nil {
		t.Fatal(err)
	}
	if st := sync("p", &outboxdriver.SlotLease{Slot: "s"}); st.SlotToken == 0 || st.SlotHolder != "p" {
		t.Fatalf("p after b gave the lease back: token %d, holder %q", st.SlotToken, st.SlotHolder)
	}
	exec(`DROP TABLE %s.outbox_wal`) // an outbox before schema version 5
	if st := sync("q", &outboxdriver.SlotLease{Slot: "s"}); st.SlotToken != 0 || st.SlotHolder != "" || st.Target != st.FairShare() {
		t.Fatalf("without outbox_wal: token %d, holder %q, target %d; want polling", st.SlotToken, st.SlotHolder, st.Target)
	}
}

// TestSlotLeaseModeAfterRestart: a relay that ran in WAL mode and restarts polling under
// the same ID (after a crash: it never gave its row back) says so in its first round, and
// the slot's reader goes back to its fair share instead of holding every shard. On an
// outbox without WAL mode's column the round still succeeds.
func TestSlotLeaseModeAfterRestart(t *testing.T) {
	t.Parallel()
	_, exec, sync := slotLeaseOutbox(t)
	r := sync("r", &outboxdriver.SlotLease{Slot: "s"}, true)
	sync("a", &outboxdriver.SlotLease{Slot: "s"}, true)
	exec(`UPDATE %s.outbox_wal SET state = 'streaming'`)
	if st := sync("r", &outboxdriver.SlotLease{Slot: "s", Token: r.SlotToken}, false); st.Target != st.Shards {
		t.Fatalf("the reader beside a relay in WAL mode: target %d of %d; want every shard", st.Target, st.Shards)
	}
	sync("a", nil, true) // a restarted, polling
	if st := sync("r", &outboxdriver.SlotLease{Slot: "s", Token: r.SlotToken}, false); st.Live != 2 || st.Target != st.FairShare() {
		t.Fatalf("the reader beside a relay restarted polling: target %d of %d live; want the fair share", st.Target, st.Live)
	}
	exec(`ALTER TABLE %s.outbox_relays DROP COLUMN mode`) // an outbox before schema version 5
	sync("z", nil, true)
}

// slotLeaseOutbox migrates an outbox with the slot 's' recorded, and returns it, exec
// (a statement with %s for the schema) and sync (one lease round of relay, in WAL mode
// when slot is set, with Adopt as on a first round).
func slotLeaseOutbox(t *testing.T) (b *testBundle, exec func(string), sync func(relay string, slot *outboxdriver.SlotLease, adopt bool) outboxdriver.LeaseState) {
	b = setup(t)
	ctx := context.Background()
	exec = func(q string) {
		t.Helper()
		if _, err := b.Pool.Exec(ctx, fmt.Sprintf(q, `"`+b.Schema+`"`)); err != nil {
			t.Fatal(err)
		}
	}
	exec(`INSERT INTO %s.outbox_wal (slot_name, publication, created_lsn) VALUES ('s', 'p', '0/0')`)
	sync = func(relay string, slot *outboxdriver.SlotLease, adopt bool) outboxdriver.LeaseState {
		t.Helper()
		st, err := b.Driver.SyncLeases(ctx, outboxdriver.LeaseRequest{RelayID: relay, TTL: time.Minute, Slot: slot, Adopt: adopt})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	return b, exec, sync
}
