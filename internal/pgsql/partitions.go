package pgsql

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
)

// This file keeps the published history's daily partitions (migration 3): days created
// ahead, expired days dropped whole, the history from before the migration dropped once
// it has expired. Every step runs in a transaction of its own under a short lock_timeout
// and the maintenance advisory lock, so relays may all call it: one does the work, the
// others find the lock taken and return, and a step that cannot get its table lock
// promptly gives up and is tried again at the next call.

// PartitionDaysAhead is how many days after today have a partition ready.
const PartitionDaysAhead = 7

// maintenanceLockTimeout bounds how long a DDL statement waits for its lock. Dropping a
// day takes ACCESS EXCLUSIVE on the published table, which relays recording outcomes wait
// for while the drop waits: the bound keeps that wait short.
const maintenanceLockTimeout = "200ms"

// dayOf parses the YYYYMMDD an int holds.
func dayOf(v int) time.Time {
	return time.Date(v/10000, time.Month(v/100%100), v%100, 0, 0, 0, 0, time.UTC)
}

func yyyymmdd(t time.Time) int {
	t = t.UTC()
	return t.Year()*10000 + int(t.Month())*100 + t.Day()
}

// partition returns the quoted, qualified name of day's partition.
func (n *Names) partition(day time.Time) string {
	return n.Table("outbox_published_" + strconv.Itoa(yyyymmdd(day)))
}

// maintenanceTx runs fn in a transaction that holds the maintenance lock, with a short
// lock_timeout and UTC dates. ran is false when another process holds the lock, or when a
// statement of fn gave up waiting for a table lock: the step is tried again at the next
// call, and the transaction has changed nothing.
func (n *Names) maintenanceTx(ctx context.Context, inTx InTx, fn func(Querier) error) (ran bool, err error) {
	return n.lockedTx(ctx, inTx, "outbox-maintain:", maintenanceLockTimeout, fn)
}

// lockedTx runs fn in a transaction that holds the advisory lock named lock (for this
// outbox), with lock_timeout set to timeout and UTC dates; see maintenanceTx.
func (n *Names) lockedTx(ctx context.Context, inTx InTx, lock, timeout string, fn func(Querier) error) (ran bool, err error) {
	err = inTx(ctx, func(q Querier) error {
		if err := q.Exec(ctx, `SET LOCAL lock_timeout = '`+timeout+`'; SET LOCAL TimeZone = 'UTC'`); err != nil {
			return err
		}
		got, err := queryInts(ctx, q, `SELECT pg_try_advisory_xact_lock(hashtext(`+literal(lock)+` || `+n.ChannelLiteral+`))::int`)
		if err != nil {
			return err
		}
		if len(got) != 1 || got[0] != 1 {
			return nil
		}
		ran = true
		return fn(q)
	})
	if SQLState(err) == "55P03" { // lock_not_available: lock_timeout passed
		return false, nil
	}
	return ran, err
}

// SQLState returns the SQLSTATE of a PostgreSQL error from either driver, or "".
func SQLState(err error) string {
	var pe interface{ SQLState() string }
	if errors.As(err, &pe) {
		return pe.SQLState()
	}
	return ""
}

// Partitioned reports whether the published history is partitioned (migration 3).
func (n *Names) Partitioned(ctx context.Context, inTx InTx) (bool, error) {
	var kind []int
	err := inTx(ctx, func(q Querier) error {
		var err error
		kind, err = queryInts(ctx, q, `SELECT (c.relkind = 'p')::int FROM pg_catalog.pg_class c WHERE c.oid = to_regclass($1)`, n.Published)
		return err
	})
	return len(kind) == 1 && kind[0] == 1, err
}

// ListPartitions returns the UTC days of the published history that have a partition,
// oldest first.
func (n *Names) ListPartitions(ctx context.Context, inTx InTx) ([]time.Time, error) {
	var out []time.Time
	err := inTx(ctx, func(q Querier) error {
		days, err := n.partitionDays(ctx, q)
		for _, d := range days {
			out = append(out, dayOf(d))
		}
		return err
	})
	return out, err
}

func (n *Names) partitionDays(ctx context.Context, q Querier) ([]int, error) {
	return queryInts(ctx, q, n.partitionDaysSQL(), n.Published)
}

// partitionDaysSQL lists, as YYYYMMDD, the days of the partitions of $1 that are named as
// the outbox names them (the base name holds only [a-z0-9_], nothing a regular expression
// reads specially): a partition someone attached under another name is left alone.
func (n *Names) partitionDaysSQL() string {
	return `SELECT right(c.relname, 8)::int AS day
FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = to_regclass($1) AND c.relname ~ '^` + n.prefix + `outbox_published_[0-9]{8}$'
ORDER BY day`
}

// CreatePartitions makes sure every UTC day from the database's today to today + ahead
// has its partition, and returns the days it created. ran is false when another process
// holds the maintenance lock.
// With dryRun it only says which days it would create.
func (n *Names) CreatePartitions(ctx context.Context, inTx InTx, ahead int, dryRun bool) (created []time.Time, ran bool, err error) {
	ran, err = n.maintenanceTx(ctx, inTx, func(q Querier) error {
		before, err := n.partitionDays(ctx, q)
		if err != nil {
			return err
		}
		had := map[int]bool{}
		for _, d := range before {
			had[d] = true
		}
		days, err := queryInts(ctx, q, n.r(`SELECT to_char(d, 'YYYYMMDD')::int FROM generate_series(
    (now() AT TIME ZONE 'UTC')::date, (now() AT TIME ZONE 'UTC')::date + $1::int, interval '1 day') d`), ahead)
		if err != nil {
			return err
		}
		for _, d := range days {
			if had[d] {
				continue
			}
			day := dayOf(d)
			if dryRun {
				created = append(created, day)
				continue
			}
			if err := q.Exec(ctx, `SELECT `+n.PartitionFunc+`($1::date)`, day.Format(time.DateOnly)); err != nil {
				return fmt.Errorf("create the partition of %s: %w", day.Format(time.DateOnly), err)
			}
			created = append(created, day)
		}
		return nil
	})
	return created, ran, err
}

// DropPartitions drops every day whose end is older than the database's now() minus
// retention, and the history kept from before migration 3 once that migration is older
// than retention. It returns the days dropped. With dryRun it only says which.
func (n *Names) DropPartitions(ctx context.Context, inTx InTx, retention time.Duration, dryRun bool) (dropped []time.Time, legacy, ran bool, err error) {
	ran, err = n.maintenanceTx(ctx, inTx, func(q Querier) error {
		days, err := n.partitionDays(ctx, q)
		if err != nil {
			return err
		}
		cutoff, err := queryInts(ctx, q, `SELECT to_char((now() - $1 * interval '1 second') AT TIME ZONE 'UTC', 'YYYYMMDD')::int`, retention.Seconds())
		if err != nil {
			return err
		}
		for _, d := range days {
			// A day ends at the next midnight: expired once that is at or before the cutoff,
			// so a day strictly before the cutoff's day.
			if d >= cutoff[0] {
				break
			}
			if !dryRun {
				if err := q.Exec(ctx, `DROP TABLE `+n.partition(dayOf(d))); err != nil {
					return fmt.Errorf("drop the partition of %s: %w", dayOf(d).Format(time.DateOnly), err)
				}
			}
			dropped = append(dropped, dayOf(d))
		}
		old, err := queryInts(ctx, q, n.r(`SELECT 1 FROM {{migrations}} m
WHERE m.version = 3 AND to_regclass($1) IS NOT NULL AND m.applied_at < now() - $2 * interval '1 second'`), n.PublishedLegacy, retention.Seconds())
		if err != nil {
			return err
		}
		if legacy = len(old) == 1; legacy && !dryRun {
			if err := q.Exec(ctx, `DROP TABLE `+n.PublishedLegacy); err != nil {
				return fmt.Errorf("drop the history kept from before version 3: %w", err)
			}
		}
		return nil
	})
	return dropped, legacy, ran, err
}

// Maintain is outboxdriver.Maintainer.Maintain for both drivers: days of published history
// created ahead and dropped once expired (or, before migration 3, expired rows deleted in
// batches), and expired dedup keys deleted in batches of req.Limit. The steps are
// independent: one that fails (rights, a lock it could not get) does not keep the others
// from running, and the errors are joined. Skipped says that a partition step found the
// maintenance lock taken or a table lock busy, and is left to the next call.
func (n *Names) Maintain(ctx context.Context, inTx InTx, req outboxdriver.MaintainRequest) (outboxdriver.Maintenance, error) {
	var m outboxdriver.Maintenance
	req.Limit = cmp.Or(max(req.Limit, 0), outbox.CleanupBatchDefault)
	partitioned, err := n.Partitioned(ctx, inTx)
	if err != nil {
		return m, err
	}
	var errs []error
	if partitioned {
		created, ran, err := n.CreatePartitions(ctx, inTx, PartitionDaysAhead, false)
		m.Created, m.Skipped = created, !ran
		errs = append(errs, err)
		if ran && req.Retention > 0 {
			m.Dropped, _, ran, err = n.DropPartitions(ctx, inTx, req.Retention, false)
			m.Skipped = !ran
			errs = append(errs, err)
		}
	}
	if req.Retention > 0 {
		batches := []string{n.DeleteDedup()}
		if !partitioned {
			batches = append(batches, n.DeletePublished())
		}
		for _, stmt := range batches {
			k, err := n.deleteBatches(ctx, inTx, stmt, req)
			m.Deleted += k
			if errs = append(errs, err); err != nil {
				break
			}
		}
	}
	return m, errors.Join(errs...)
}

// deleteBatches runs stmt (a DELETE with $1 retention seconds and $2 limit) until it
// deletes fewer than req.Limit rows, and returns how many it deleted.
func (n *Names) deleteBatches(ctx context.Context, inTx InTx, stmt string, req outboxdriver.MaintainRequest) (int, error) {
	deleted := 0
	for {
		var k []int
		err := inTx(ctx, func(q Querier) error {
			var err error
			k, err = queryInts(ctx, q, `WITH d AS (`+stmt+` RETURNING 1) SELECT count(*)::int FROM d`, req.Retention.Seconds(), req.Limit)
			return err
		})
		if err != nil {
			return deleted, err
		}
		deleted += k[0]
		if k[0] < req.Limit {
			return deleted, nil
		}
		select { // leave the database room between batches
		case <-ctx.Done():
			return deleted, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}
