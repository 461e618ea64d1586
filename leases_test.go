package outbox

import (
	"slices"
	"testing"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

func held(shards ...int) []outboxdriver.Lease {
	var out []outboxdriver.Lease
	for _, s := range shards {
		out = append(out, outboxdriver.Lease{Shard: s, Token: int64(100 + s)})
	}
	return out
}

func TestLeaseBookApply(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ttl := 15 * time.Second
	b := newLeaseBook(ttl)

	// First round: everything gained; the deadline is the TTL less a fifth.
	c := b.apply(outboxdriver.LeaseState{Held: held(3, 1, 2), Target: 3}, t0)
	if !slices.Equal(c.gained, []int{1, 2, 3}) || c.lost != nil || c.drain != nil {
		t.Fatalf("first round: %+v", c)
	}
	if want := t0.Add(12 * time.Second); !b.until.Equal(want) {
		t.Fatalf("until = %v, want %v", b.until, want)
	}
	// A steady round: the deadline moves to its start plus the TTL less a fifth.
	c = b.apply(outboxdriver.LeaseState{Held: held(1, 2, 3), Target: 3}, t0.Add(time.Second))
	if c.gained != nil || c.lost != nil || c.drain != nil {
		t.Fatalf("steady round changed: %+v", c)
	}
	if want := t0.Add(time.Second + 12*time.Second); !b.until.Equal(want) {
		t.Fatalf("until = %v, want %v", b.until, want)
	}
	// A newcomer: the fair share drops to 2, the highest shard drains, once.
	for i := range 2 {
		c = b.apply(outboxdriver.LeaseState{Held: held(1, 2, 3), Target: 2}, t0.Add(time.Duration(2+i)*time.Second))
		want := []int{3}
		if i == 1 {
			want = nil
		}
		if !slices.Equal(c.drain, want) || !b.draining[3] || len(b.draining) != 1 {
			t.Fatalf("round %d over the fair share: %+v, draining %v", i, c, b.draining)
		}
	}
	// Shard 3 released, shard 2 taken over under a new token: both lost, 2 gained again
	// under its new token; shard 3 no longer draining.
	c = b.apply(outboxdriver.LeaseState{Held: []outboxdriver.Lease{{Shard: 1, Token: 101}, {Shard: 2, Token: 999}}, Target: 2}, t0.Add(4*time.Second))
	if !slices.Equal(c.lost, []int{2, 3}) || !slices.Equal(c.gained, []int{2}) || len(b.draining) != 0 {
		t.Fatalf("takeover: %+v, draining %v", c, b.draining)
	}
	if !b.holds(2, 999) || b.holds(2, 102) || b.holds(3, 103) {
		t.Fatalf("holds: tokens %v", b.tokens)
	}
}

func TestLeaseBookAdopts(t *testing.T) {
	b := newLeaseBook(15 * time.Second)
	base := outboxdriver.LeaseRequest{RelayID: "r", TTL: 15 * time.Second}
	never := func(int) bool { return false }
	if !b.request(base, false, never).Adopt {
		t.Fatal("the first round does not adopt the leases of an earlier process with the same ID")
	}
	b.apply(outboxdriver.LeaseState{Held: held(1, 2), Target: 2}, time.Unix(0, 0))
	if b.request(base, false, never).Adopt {
		t.Fatal("a round after an answer adopts: two processes sharing an ID would take each other's leases")
	}
	b.failed()
	if req := b.request(base, false, never); !req.Adopt || !slices.Equal(req.Held, held(1, 2)) {
		t.Fatalf("after a lost answer: adopt %v, held %v", req.Adopt, req.Held)
	}
	if b.request(base, true, never).Adopt {
		t.Fatal("the final round adopts")
	}
}

func TestLeaseBookRequest(t *testing.T) {
	b := newLeaseBook(15 * time.Second)
	b.apply(outboxdriver.LeaseState{Held: held(1, 2, 3, 4), Target: 2}, time.Unix(0, 0)) // 3 and 4 drain
	base := outboxdriver.LeaseRequest{RelayID: "r", TTL: 15 * time.Second}
	inHand := map[int]int{4: 1}
	idle := func(s int) bool { return inHand[s] == 0 }

	req := b.request(base, false, idle)
	if !slices.Equal(req.Held, held(1, 2, 4)) || !slices.Equal(req.Release, held(3)) || req.TTL != base.TTL {
		t.Fatalf("renewal: held %v, release %v, ttl %v", req.Held, req.Release, req.TTL)
	}
	req = b.request(base, true, idle)
	if req.Held != nil || !slices.Equal(req.Release, held(1, 2, 3, 4)) || req.TTL != 0 {
		t.Fatalf("final: held %v, release %v, ttl %v", req.Held, req.Release, req.TTL)
	}
	if got := b.active(); !slices.Equal(got, held(1, 2)) {
		t.Fatalf("active = %v, want shards 1 and 2", got)
	}
}

func TestLeaseBookSendable(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := newLeaseBook(10 * time.Second)
	b.apply(outboxdriver.LeaseState{Held: held(1, 2), Target: 1}, t0) // 2 drains; sendable until t0+8s
	for _, tc := range []struct {
		shard int
		at    time.Duration
		want  bool
	}{
		{1, 0, true},
		{1, 8*time.Second - 1, true},
		{1, 8 * time.Second, false}, // the deadline itself is too late
		{2, 0, false},               // draining
		{5, 0, false},               // not held
	} {
		if got := b.sendable(tc.shard, t0.Add(tc.at)); got != tc.want {
			t.Errorf("sendable(%d, t0+%v) = %v, want %v", tc.shard, tc.at, got, tc.want)
		}
	}
}
