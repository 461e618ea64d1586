package outboxpgx_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// TestLeaseRenewBelow: a renewal with RenewBelow rewrites only the leases with less than
// that left (a rewrite is a row version that a long transaction elsewhere keeps from
// vacuum), and Left reports the time left on the lease that expires first.
func TestLeaseRenewBelow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const ttl = time.Minute
	versions := func() string { // the lease rows' versions: xmin changes with each rewrite
		var v string
		q := fmt.Sprintf(`SELECT string_agg(xmin::text, ',' ORDER BY shard) FROM "%s".outbox_leases WHERE owner = 'r'`, b.Schema)
		if err := b.Pool.QueryRow(ctx, q).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	sync := func(held []outboxdriver.Lease, below time.Duration) outboxdriver.LeaseState {
		t.Helper()
		st, err := b.Driver.SyncLeases(ctx, outboxdriver.LeaseRequest{RelayID: "r", TTL: ttl, Held: held, RenewBelow: below})
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Held) == 0 || st.Left <= 0 || st.Left > ttl {
			t.Fatalf("held %d leases, %v left; want some, with at most the TTL (%v) left", len(st.Held), st.Left, ttl)
		}
		return st
	}
	st := sync(nil, 0)
	if st.Left < ttl-10*time.Second {
		t.Fatalf("%v left on leases just taken; want about the TTL, %v", st.Left, ttl)
	}
	before := versions()
	st = sync(st.Held, ttl/2)
	if after := versions(); after != before {
		t.Fatalf("leases with more than RenewBelow left were rewritten:\n%s\n%s", before, after)
	}
	if st.Left >= ttl {
		t.Fatalf("%v left after a renewal that renewed nothing; want less than the TTL", st.Left)
	}
	st = sync(st.Held, ttl+time.Second)
	renewed := versions()
	if renewed == before {
		t.Fatal("leases with less than RenewBelow left were not renewed")
	}
	sync(st.Held, 0) // zero renews every lease
	if versions() == renewed {
		t.Fatal("RenewBelow 0 did not renew the leases")
	}
}
