package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/pgsql"
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

// KindWALSlotDrop drops the relays' replication slot under them, as an operator's
// pg_drop_replication_slot would (its record in outbox_wal stays, unlike 'outbox wal
// drop'): the session reading it is ended, then the slot dropped. The reader must make it
// anew and lose nothing, since every message not yet recorded is still in the outbox
// (WAL runs only). The slot audit learns of each drop, so that it judges a new slot only
// by the commits it covered.
const KindWALSlotDrop = "wal-slot-drop"

func walSlotDrop(db *testdb.DB, slot string, audit *slotAudit) nemesis.Fault {
	return nemesis.Fault{Kind: KindWALSlotDrop,
		Inject: func(*rand.Rand) (string, func() error, error) {
			ctx := context.Background()
			for attempt := 1; ; attempt++ {
				_, err := db.Pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot)
				if err == nil {
					_, err = db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
				}
				switch {
				case err == nil:
					audit.dropped()
					return "slot " + slot, nil, nil
				case pgsql.SQLState(err) == "42704": // gone already; its reader has yet to make it anew
					return "slot " + slot + " (gone already)", nil, nil
				case pgsql.SQLState(err) != "55006" || attempt == 50: // 55006: read again before the drop
					return "", nil, fmt.Errorf("drop slot %s: %w", slot, err)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}}
}

// KindWALSlotLost freezes every relay (SIGSTOP) while the database writes more WAL than
// max_slot_wal_keep_size (walKeepSize in WAL runs) allows the slot to hold, and
// checkpoints, until PostgreSQL invalidates the relays' slot (wal_status lost); the heal
// thaws them (SIGCONT). The reader must drop the lost slot, make it anew and lose
// nothing (WAL runs only).
const KindWALSlotLost = "wal-slot-lost"

// walKeepSize is max_slot_wal_keep_size in WAL runs: small, so that wal-slot-lost needs
// little WAL, and large enough that the other faults' few seconds of lag stay within it,
// and the audit slot's too: a logical slot's restart position moves only at the server's
// snapshots of running transactions, which it logs every 15 s and at checkpoints.
const walKeepSize = "128MB"

func walSlotLost(tb testenv.TB, rs []*relay, db *testdb.DB, slot string, audit *slotAudit) nemesis.Fault {
	// The WAL is written in a database of its own, which logical decoding in the run's
	// database skips: the audit slot decodes none of it.
	var filler *pgx.Conn
	tb.Cleanup(func() {
		if filler != nil {
			_ = filler.Close(context.Background())
		}
	})
	connect := func(ctx context.Context) error {
		if filler != nil && !filler.IsClosed() {
			return nil
		}
		if _, err := db.Pool.Exec(ctx, `CREATE DATABASE wal_filler`); err != nil && pgsql.SQLState(err) != "42P04" {
			return err
		}
		cc := db.Pool.Config().ConnConfig.Copy()
		cc.Database = "wal_filler"
		conn, err := pgx.ConnectConfig(ctx, cc)
		if err != nil {
			return err
		}
		filler = conn
		return nil
	}
	fill := func(ctx context.Context) error {
		// About 16 MB a round, then a checkpoint (which logs a snapshot of running
		// transactions and invalidates the slots too far behind); the audit slot is
		// consumed after each, so that its restart position follows and only the frozen
		// relays' slot falls behind by more than walKeepSize. A connection that an earlier
		// fault ended (pg-restart) is made again once.
		var err error
		for attempt := 0; attempt < 2; attempt++ {
			if err = connect(ctx); err != nil {
				return err
			}
			if _, err = filler.Exec(ctx, `CREATE TABLE IF NOT EXISTS filler (pad text);
TRUNCATE filler;
INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 13000);
CHECKPOINT`); err == nil || !filler.IsClosed() {
				break
			}
		}
		if err != nil {
			return err
		}
		_ = audit.consume(ctx) // a failure costs the audit some commits (remake), not the fault
		return nil
	}
	return nemesis.Fault{Kind: KindWALSlotLost, MinHold: 100 * time.Millisecond, MaxHold: 500 * time.Millisecond,
		Inject: func(*rand.Rand) (string, func() error, error) {
			var ids []string
			thaw := func() error {
				var errs []error
				for _, r := range rs {
					if _, err := r.signal(syscall.SIGCONT); err != nil {
						errs = append(errs, err)
					}
				}
				return errors.Join(errs...)
			}
			for _, r := range rs {
				id, err := r.signal(syscall.SIGSTOP)
				if err != nil {
					_ = thaw()
					return "", nil, err
				}
				ids = append(ids, id)
			}
			ctx := context.Background()
			status := ""
			for round := 1; status != "lost"; round++ {
				if round > 50 {
					_ = thaw()
					return "", nil, fmt.Errorf("slot %s still %q after %d rounds of WAL and checkpoints", slot, status, round-1)
				}
				err := fill(ctx)
				if err == nil {
					err = db.Pool.QueryRow(ctx, `SELECT coalesce(wal_status, 'lost') FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&status)
				}
				if errors.Is(err, pgx.ErrNoRows) {
					status = "lost" // gone (a drop): the reader makes it anew all the same
				} else if err != nil {
					_ = thaw()
					return "", nil, err
				}
			}
			audit.dropped() // the reader drops it and makes it anew
			return fmt.Sprintf("slot %s lost, relays %s frozen", slot, strings.Join(ids, ",")), thaw, nil
		}}
}
