package outboxpgx_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
)

// TestFingerprintBeforeVersion8: on an outbox without the relays' fingerprint column,
// lease rounds that state a fingerprint succeed and compare nothing (the relays share
// the shards as before), and Status shows no fingerprint.
func TestFingerprintBeforeVersion8(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.Driver.MigrateDown(context.Background(), 7); err != nil {
		t.Fatal(err)
	}
	round := func(relay, fp string, held []outboxdriver.Lease) outboxdriver.LeaseState {
		t.Helper()
		ctx, cancel := testenv.CallContext()
		defer cancel()
		st, err := b.Driver.SyncLeases(ctx, outboxdriver.LeaseRequest{RelayID: relay, Hostname: "h", PID: 1, TTL: time.Minute, Held: held, Fingerprint: fp})
		if err != nil {
			t.Fatalf("SyncLeases(%s) before version 8: %v", relay, err)
		}
		return st
	}
	a := round("a", "fp-1", nil)
	if len(a.Held) != a.Shards {
		t.Fatalf("a holds %d of %d shards", len(a.Held), a.Shards)
	}
	if b2 := round("b", "fp-2", nil); b2.Live != 2 || len(b2.GiveWay) != 0 || b2.Target != (b2.Shards+1)/2 {
		t.Fatalf("b got %+v, want a fair share beside a: nothing compared", b2)
	}
	ctx, cancel := testenv.CallContext()
	defer cancel()
	st, err := b.Driver.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range st.Relays {
		if r.Fingerprint != "" {
			t.Fatalf("relay %s shows fingerprint %q without the column", r.ID, r.Fingerprint)
		}
	}
}
