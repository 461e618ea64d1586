package outboxsql_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxtest"
)

// TestRelayStatementsLeaveSessionAlone: the relay's statements turn JIT off only for
// their own transaction, so the connection goes back to the caller's pool as it was.
func TestRelayStatementsLeaveSessionAlone(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		c := testenv.Context(t)
		b.db.SetMaxOpenConns(1) // every call below runs on the same session
		if _, err := b.db.ExecContext(c, `SET jit = on`); err != nil {
			t.Fatal(err)
		}
		b.mustWrite(t, msg("t", "k"))
		st, err := b.drv.SyncLeases(c, outboxdriver.LeaseRequest{RelayID: "r", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		got, err := b.drv.Fetch(c, outboxdriver.FetchRequest{RelayID: "r", Leases: st.Held, Limit: 10})
		if err != nil || len(got) != 1 {
			t.Fatalf("fetch: %d, %v", len(got), err)
		}
		var jit string
		if err := b.db.QueryRowContext(c, `SELECT current_setting('jit')`).Scan(&jit); err != nil || jit != "on" {
			t.Fatalf("after Fetch the session has jit = %s (%v), want on as it was", jit, err)
		}
		c2 := outboxdriver.Completion{RelayID: "r", Published: []outboxdriver.Outcome{{Seq: got[0].Seq, Token: st.Held[0].Token}}}
		for _, l := range st.Held {
			if l.Shard == got[0].Shard {
				c2.Published[0].Token = l.Token
			}
		}
		if refused, err := b.drv.Complete(c, c2); err != nil || len(refused) != 0 {
			t.Fatalf("complete: refused %v, %v", refused, err)
		}
		if err := b.db.QueryRowContext(c, `SELECT current_setting('jit')`).Scan(&jit); err != nil || jit != "on" {
			t.Fatalf("after Complete the session has jit = %s (%v), want on", jit, err)
		}
	})
}

// TestFetchContinuationOddKeys: the keys of a continuation travel as an array literal;
// keys with the literal's syntax in them must match exactly.
func TestFetchContinuationOddKeys(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		c := testenv.Context(t)
		keys := []string{`a,b`, `"q"`, `NULL`, `{x}`, `back\slash`, `sp ace`, `é`}
		var first, second []outbox.Message
		for _, k := range keys {
			first = append(first, msg("t", k))
			second = append(second, msg("t", k))
		}
		b.mustWrite(t, first...)
		b.mustWrite(t, second...)
		st, err := b.drv.SyncLeases(c, outboxdriver.LeaseRequest{RelayID: "r", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		all, err := b.drv.Fetch(c, outboxdriver.FetchRequest{RelayID: "r", Leases: st.Held, Limit: 100})
		if err != nil || len(all) != 2*len(keys) {
			t.Fatalf("fetch: %d, %v", len(all), err)
		}
		after := all[len(keys)-1].Seq // the relay holds every key's first message
		none, err := b.drv.Fetch(c, outboxdriver.FetchRequest{RelayID: "r", Leases: st.Held, After: after, Limit: 100})
		if err != nil || len(none) != 0 {
			t.Fatalf("continuation without keys: %d, %v; want none", len(none), err)
		}
		held := []int64{all[0].Seq, all[1].Seq, all[2].Seq, all[3].Seq} // each key's first message
		got, err := b.drv.Fetch(c, outboxdriver.FetchRequest{RelayID: "r", Leases: st.Held, After: after, Keys: keys[:4], KeySeqs: held, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		var gotKeys []string
		for _, m := range got {
			gotKeys = append(gotKeys, m.Key)
		}
		if !slices.Equal(gotKeys, keys[:4]) {
			t.Fatalf("continuation with keys %q returned %q", keys[:4], gotKeys)
		}
	})
}

// TestRelaysOnBothDriversShareOutbox: a relay on this store and one on outboxpgx split
// the shards of one outbox between them and publish it whole, once, in key order.
func TestRelaysOnBothDriversShareOutbox(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		const keys, perKey = 20, 10
		batch := func(round int) []outbox.Message {
			var out []outbox.Message
			for i := range perKey {
				for k := range keys {
					out = append(out, outbox.Message{Topic: "t", Key: fmt.Sprintf("k%d", k),
						Payload: fmt.Appendf(nil, `{"n":%d}`, round*perKey+i)})
				}
			}
			return out
		}
		b.mustWrite(t, batch(0)...)
		pgxStore, err := outboxpgx.New(b.pool, outboxpgx.Config{Schema: b.schema})
		if err != nil {
			t.Fatal(err)
		}
		pub := &outboxtest.Publisher{}
		// A lease lost to a stall of the machine may duplicate messages by design, and
		// this test fails on a duplicate: the TTL is far above any stall.
		cfg := outbox.RelayConfig{PollInterval: 20 * time.Millisecond, LeaseTTL: time.Minute}
		cfg.ID = "on-sql"
		startRelay(t, b.drv, pub, cfg)
		cfg.ID = "on-pgx"
		startRelay(t, pgxStore, pub, cfg)

		testenv.Await(t, "the shards to split between the two relays", func() (any, bool) {
			ctx, cancel := testenv.CallContext()
			defer cancel()
			st, err := b.drv.Status(ctx)
			if err != nil {
				t.Fatalf("status: %v", err)
			}
			var seen []string
			for _, r := range st.Relays {
				seen = append(seen, fmt.Sprintf("%s live=%v shards=%d", r.ID, r.Live, r.Shards))
			}
			return seen, len(st.Relays) == 2 && st.Relays[0].Live && st.Relays[1].Live &&
				st.Relays[0].Shards == st.Shards/2 && st.Relays[1].Shards == st.Shards/2
		})
		b.mustWrite(t, batch(1)...)
		got := pub.Await(t, 2*keys*perKey)
		last := map[string]int{}
		seen := map[outbox.ID]bool{}
		for _, m := range got {
			if seen[m.ID] {
				t.Fatalf("published twice: %s", m.ID)
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
	})
}
