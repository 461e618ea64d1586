package outboxpgx_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
)

func TestInboxExactlyOnce(t *testing.T) {
	db := testdb.Migrated(t)
	ctx := context.Background()
	in, err := outbox.NewInbox[pgx.Tx](db.Driver, outbox.InboxConfig{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE "`+db.Schema+`".effects (id text)`); err != nil {
		t.Fatal(err)
	}
	// Three deliveries of one id at once, each in its own transaction that does the
	// work: one effect.
	var wg sync.WaitGroup
	var ran atomic.Int32
	for range 3 {
		wg.Go(func() {
			err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				_, err := in.Process(ctx, tx, "m-1", func(ctx context.Context) error {
					ran.Add(1)
					time.Sleep(50 * time.Millisecond) // hold the row while the others arrive
					_, err := tx.Exec(ctx, `INSERT INTO "`+db.Schema+`".effects VALUES ('m-1')`)
					return err
				})
				return err
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM "`+db.Schema+`".effects`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 || ran.Load() != 1 {
		t.Fatalf("%d effects, work ran %d times; want 1 and 1", n, ran.Load())
	}

	// A delivery whose work fails rolls back its record: the redelivery does the work.
	boom := errors.New("boom")
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := in.Process(ctx, tx, "m-2", func(context.Context) error { return boom })
		return err
	})
	if !errors.Is(err, boom) {
		t.Fatalf("failed work: %v", err)
	}
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		fresh, err := in.ClaimBatch(ctx, tx, []string{"m-1", "m-2", "m-3"})
		if err == nil && !slices.Equal(fresh, []bool{false, true, true}) {
			t.Errorf("ClaimBatch after a rolled-back claim = %v, want [false true true]", fresh)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	// Retention.
	if n, err := db.Driver.DeleteInbox(ctx, time.Hour, 100); err != nil || n != 0 {
		t.Fatalf("DeleteInbox of young rows = %d, %v", n, err)
	}
	time.Sleep(1100 * time.Millisecond) // the rows grow older than the 1 s retention below: time, not work
	if n, err := db.Driver.DeleteInbox(ctx, time.Second, 100); err != nil || n != 3 {
		t.Fatalf("DeleteInbox = %d, %v; want 3", n, err)
	}
}

func TestVersions(t *testing.T) {
	db := testdb.Migrated(t)
	ctx := context.Background()
	v, err := outbox.NewVersions[pgx.Tx](db.Driver, outbox.InboxConfig{Consumer: "read-model"})
	if err != nil {
		t.Fatal(err)
	}
	advance := func(id string, version int64) bool {
		var ok bool
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			var err error
			ok, err = v.Advance(ctx, tx, "order", id, version)
			return err
		})
		if err != nil {
			t.Errorf("advance %s to %d: %v", id, version, err) // not Fatal: goroutines call advance too
		}
		return ok
	}
	for _, step := range []struct {
		id      string
		version int64
		want    bool
	}{
		{"o1", 1, true}, {"o1", 3, true}, {"o1", 2, false}, {"o1", 3, false}, {"o2", 1, true}, {"o1", 4, true},
	} {
		if got := advance(step.id, step.version); got != step.want {
			t.Fatalf("advance %s to %d = %v, want %v", step.id, step.version, got, step.want)
		}
	}
	// Concurrent deliveries of one version: one applies.
	var wg sync.WaitGroup
	var applied atomic.Int32
	for range 4 {
		wg.Go(func() {
			if advance("o3", 7) {
				applied.Add(1)
			}
		})
	}
	wg.Wait()
	if applied.Load() != 1 {
		t.Fatalf("%d of 4 concurrent deliveries applied version 7", applied.Load())
	}
}
