package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testpg"
	"github.com/outboxkit/outbox/internal/testinfra/torture/nemesis"
)

// KindPGRestart is an immediate restart of the run's private PostgreSQL server
// (Config.PrivatePostgres): every session is cut mid-statement, COMMITs in flight get no
// answer, and the server replays its WAL before it accepts connections again.
const KindPGRestart = "pg-restart"

// pgRestart stops the server with pg_ctl stop -m immediate, holds it down for 0.5–3 s,
// and starts it again. The heal returns once the server accepts connections, and resets
// pool (the run's own pool) so that the run's next query does not take a connection
// that died with the server.
func pgRestart(srv *testpg.Server, pool *pgxpool.Pool) nemesis.Fault {
	return nemesis.Fault{Kind: KindPGRestart, MinHold: 500 * time.Millisecond, MaxHold: 3 * time.Second,
		Inject: func(*rand.Rand) (string, func() error, error) {
			srv.Stop(testpg.Immediate)
			return "postgres " + srv.Addr(), func() error {
				srv.Start()
				pool.Reset()
				return nil
			}, nil
		}}
}

// KindPGSnapshot holds a REPEATABLE READ transaction with an xid open in the run's
// database for 1-5 s, as a report or a stuck session would: vacuum can remove nothing
// deleted meanwhile. It reads none of the outbox's tables, as an application's report
// would not.
const KindPGSnapshot = "pg-snapshot"

func pgSnapshot(db *testdb.DB) nemesis.Fault {
	return nemesis.Fault{Kind: KindPGSnapshot, MinHold: time.Second, MaxHold: 5 * time.Second,
		Inject: func(*rand.Rand) (string, func() error, error) {
			ctx := context.Background()
			tx, err := db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
			if err != nil {
				return "", nil, err
			}
			var xid int64
			if err := tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&xid); err != nil {
				_ = tx.Rollback(ctx)
				return "", nil, err
			}
			return fmt.Sprintf("xid %d", xid), func() error { return tx.Rollback(ctx) }, nil
		}}
}

// churnHistory creates, every second until the run ends, a partition of published
// history for a day long expired, which the relays' maintenance drops at its next run:
// partitions are created and dropped all through the run, during every fault. It returns
// a function that stops it and says how many it created.
func churnHistory(tb testenv.TB, db *testdb.DB) (stop func() int) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		created := 0
		tk := time.NewTicker(time.Second)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				done <- created
				return
			case <-tk.C:
			}
			day := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC).AddDate(0, 0, created)
			err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				// Never queue the relays' outcomes behind this DDL: give up instead.
				if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '200ms'`); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, fmt.Sprintf(`SELECT %q.outbox_published_partition($1::date)`, db.Schema), day.Format(time.DateOnly))
				return err
			})
			if err == nil {
				created++
			}
		}
	}()
	var n int
	var stopped bool
	stop = func() int {
		if !stopped {
			stopped = true
			cancel()
			n = <-done
		}
		return n
	}
	tb.Cleanup(func() { stop() })
	return stop
}

// storageChurn logs how often the pending ring moved on and how many of the expired
// history partitions the relays dropped, and fails the run if the ring never moved on:
// then the run did not exercise it.
func storageChurn(tb testenv.TB, db *testdb.DB, created int) {
	var rotations, left int
	err := db.Pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT (SELECT rotations FROM %[1]q.outbox_ring),
    (SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
     WHERE i.inhparent = '%[1]q.outbox_published'::regclass AND c.relname LIKE 'outbox_published_2001%%')`, db.Schema)).Scan(&rotations, &left)
	if err != nil {
		tb.Errorf("storage churn: %v", err)
		return
	}
	tb.Logf("pending ring: %d rotations; expired history partitions: %d created, %d dropped", rotations, created, created-left)
	if rotations == 0 {
		tb.Errorf("the pending ring never moved on: the run did not exercise it")
	}
}
