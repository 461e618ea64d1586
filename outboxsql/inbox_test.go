package outboxsql_test

import (
	"context"
	"database/sql"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
)

func TestInboxAndVersions(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		ctx := context.Background()
		in, err := outbox.NewInbox[*sql.Tx](b.drv, outbox.InboxConfig{Consumer: "billing"})
		if err != nil {
			t.Fatal(err)
		}
		inTx := outbox.SQLTx(b.db, nil)
		var ran atomic.Int32
		h := outbox.InboxHandler(in, inTx, func(ctx context.Context, tx *sql.Tx, d *outbox.Delivery) error {
			ran.Add(1)
			time.Sleep(30 * time.Millisecond) // hold the claim while the others arrive (pacing; any timing passes)
			return nil
		})
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				if err := h(ctx, &outbox.Delivery{ID: "m-1"}); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if ran.Load() != 1 {
			t.Fatalf("work ran %d times for three deliveries of one id", ran.Load())
		}
		err = inTx(ctx, func(tx *sql.Tx) error {
			fresh, err := in.ClaimBatch(ctx, tx, []string{"m-1", `q"uote,comma`, "m-3"})
			if err == nil && !slices.Equal(fresh, []bool{false, true, true}) {
				t.Errorf("ClaimBatch = %v", fresh)
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
		}{{2, true}, {1, false}, {2, false}, {3, true}} {
			var ok bool
			if err := inTx(ctx, func(tx *sql.Tx) error { ok, err = v.Advance(ctx, tx, "order", "o1", step.version); return err }); err != nil {
				t.Fatal(err)
			}
			if ok != step.want {
				t.Fatalf("advance to %d = %v", step.version, ok)
			}
		}
		if n, err := b.drv.DeleteInbox(ctx, time.Hour, 10); err != nil || n != 0 {
			t.Fatalf("DeleteInbox = %d, %v", n, err)
		}
	})
}
