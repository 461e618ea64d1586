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
	go func() { done <- b.Driver.Listen(ctx, func(w outboxdriver.Wake) { wakes <- w }) }()
	defer func() { cancel(); <-done }()
	if w := testenv.AwaitRecv(t, "Listen's first wake-up", wakes); w != outboxdriver.WakeWritten {
		t.Fatalf("first wake-up %v, want WakeWritten", w)
	}

	st, err := b.Driver.SyncLeases(ctx, outboxdriver.LeaseRequest{RelayID: "r", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Driver.SyncLeases(ctx, outboxdriver.LeaseRequest{RelayID: "r", TTL: time.Minute, Held: st.Held[1:], Release: st.Held[:1]}); err != nil {
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
