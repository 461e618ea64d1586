package outboxpgx_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
)

// TestFetchContinuationKeepsKeyOrder: a continuation (After > 0) must not return a
// key's newer message while an older pending one lies at or below After, unless the
// relay says it holds that key.
func TestFetchContinuationKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`1`)}, outbox.Message{Topic: "t", Key: "other", Payload: []byte(`2`)})
	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`3`)}, outbox.Message{Topic: "t", Key: "fresh", Payload: []byte(`4`)})
	held := leaseAll(t, b.Driver)
	got, err := b.Driver.Fetch(ctx, outboxdriver.FetchRequest{RelayID: "r", Leases: held, After: 2, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, m := range got {
		keys = append(keys, fmt.Sprintf("%s@%d", m.Key, m.Seq))
	}
	if len(got) != 1 || got[0].Key != "fresh" {
		t.Fatalf("continuation returned %v, want only fresh@4 (k@3 must wait behind k@1)", keys)
	}
	got, err = b.Driver.Fetch(ctx, outboxdriver.FetchRequest{RelayID: "r", Leases: held, After: 2, Keys: []string{"k"}, KeySeqs: []int64{1}, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("with k held, continuation returned %d messages, want k@3 and fresh@4", len(got))
	}
}

// TestFetchFreshRowDueWhateverTheClock: a fresh row (never retried, not delayed) is due
// even when its writer's transaction began after the fetch's statement did (its
// next_attempt_at, the writer's now(), is then later than the fetch's now()), or the key's
// later rows, from writers that began earlier and committed after it, would overtake it.
// The row's times are moved an hour ahead to stand for that writer.
func TestFetchFreshRowDueWhateverTheClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`1`)})
	b.Write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`2`)})
	if _, err := b.Pool.Exec(ctx, fmt.Sprintf(`UPDATE %q.outbox SET created_at = now() + interval '1 hour', next_attempt_at = now() + interval '1 hour'
WHERE seq = (SELECT min(seq) FROM %[1]q.outbox)`, b.Schema)); err != nil {
		t.Fatal(err)
	}
	held := leaseAll(t, b.Driver)
	got, err := b.Driver.Fetch(ctx, outboxdriver.FetchRequest{RelayID: "r", Leases: held, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || string(got[0].Payload) != "1" {
		var p []string
		for _, m := range got {
			p = append(p, string(m.Payload))
		}
		t.Fatalf("fetched %v, want [1 2]: the fresh row written by a later-starting transaction is due too", p)
	}
}
