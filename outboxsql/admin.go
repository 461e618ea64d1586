package outboxsql

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/outboxdriver"
)

// This file is the operator's side of the driver (outboxdriver.Admin): the figures behind
// `outbox status` and the dead-letter tooling behind `outbox dead`. The statements are
// pgsql's, the same text outboxpgx runs, so both report and act alike.

// PublishedExactBelow is the size of the published table, as estimated by PostgreSQL's
// statistics, under which Status counts published rows exactly. Above it the count is an
// estimate (see Status), because counting them exactly means reading the whole table.
const PublishedExactBelow = pgsql.PublishedExactBelow

// Status returns a snapshot of the outbox, read in one repeatable-read, read-only
// transaction so that its figures agree with each other and share one database clock.
//
// The pending and dead figures are exact and cheap: the pending table holds only the
// backlog and the dead table only the dead letters, so their cost follows the backlog and
// the dead-letter store, not the history kept. Published is exact while PostgreSQL
// estimates the published table below PublishedExactBelow rows; above that it is
// PostgreSQL's row-count estimate for that table (pg_class.reltuples). OldestPendingAge
// is measured from when the message was written, so a message delayed with DeliverAt
// counts from its write too.
//
// Relays lists the relays in the relays table (expired ones are kept about an hour and
// shown with Live false) with the number of shards each holds an unexpired lease on.
func (d *Driver) Status(ctx context.Context) (outboxdriver.Status, error) {
	if err := d.needDB(); err != nil {
		return outboxdriver.Status{}, err
	}
	st := outboxdriver.Status{Topics: []outboxdriver.TopicStatus{}, Relays: []outboxdriver.RelayInfo{}}
	opts := &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}
	err := withTx(ctx, d.db, opts, func(tx *sql.Tx) error {
		// Dashboards poll this; see pgsql.NoJIT.
		if _, err := tx.ExecContext(ctx, pgsql.NoJIT); err != nil {
			return err
		}
		if err := d.topicStatus(ctx, tx, &st); err != nil {
			return fmt.Errorf("count pending and dead: %w", err)
		}
		if err := d.publishedCount(ctx, tx, &st); err != nil {
			return fmt.Errorf("count published: %w", err)
		}
		if err := d.names.StorageStatus(ctx, sqlQuerier{tx}, &st); err != nil {
			return fmt.Errorf("read partitions and transactions: %w", err)
		}
		if err := d.relayStatus(ctx, tx, &st); err != nil {
			return fmt.Errorf("read relays and leases: %w", err)
		}
		return nil
	})
	if err != nil {
		return outboxdriver.Status{}, fmt.Errorf("outbox status: %w", err)
	}
	return st, nil
}

func (d *Driver) topicStatus(ctx context.Context, tx *sql.Tx, st *outboxdriver.Status) error {
	topics, err := collect(ctx, tx, d.names.StatusTopics(), nil, func(rows *sql.Rows) (outboxdriver.TopicStatus, error) {
		var t outboxdriver.TopicStatus
		var ageMicros int64
		err := rows.Scan(&t.Topic, &t.Pending, &t.Due, &t.Retrying, &t.Dead, &ageMicros)
		t.OldestPendingAge = time.Duration(ageMicros) * time.Microsecond
		return t, err
	})
	if err != nil {
		return err
	}
	pgsql.AddTopics(st, topics)
	return nil
}

func (d *Driver) publishedCount(ctx context.Context, tx *sql.Tx, st *outboxdriver.Status) error {
	var relTuples, liveTuples int64
	var legacy bool
	q, args := d.names.StatusPublishedStats()
	if err := tx.QueryRowContext(ctx, q, args...).Scan(&relTuples, &liveTuples, &legacy); err != nil {
		return err
	}
	if n, ok := pgsql.PublishedEstimate(relTuples, liveTuples); ok {
		st.Published = n
		return nil
	}
	return tx.QueryRowContext(ctx, d.names.StatusPublishedCount(legacy)).Scan(&st.Published)
}

func (d *Driver) relayStatus(ctx context.Context, tx *sql.Tx, st *outboxdriver.Status) error {
	relays, err := collect(ctx, tx, d.names.StatusRelays(), nil, func(rows *sql.Rows) (outboxdriver.RelayInfo, error) {
		var ri outboxdriver.RelayInfo
		err := rows.Scan(&ri.ID, &ri.Hostname, &ri.PID, &ri.StartedAt, &ri.HeartbeatAt, &ri.Live, &ri.Shards)
		return ri, err
	})
	if err != nil {
		return err
	}
	st.Relays = append(st.Relays, relays...)
	return tx.QueryRowContext(ctx, d.names.StatusShards()).Scan(&st.Shards, &st.ShardsLeased)
}

// DeadList returns the dead letters that match f, most recently dead-lettered first.
func (d *Driver) DeadList(ctx context.Context, f outboxdriver.DeadFilter) ([]outboxdriver.DeadLetter, error) {
	if err := d.needDB(); err != nil {
		return nil, err
	}
	q, args, err := d.names.DeadList(f)
	if err != nil {
		return nil, err
	}
	out, err := collect(ctx, d.db, q, args, func(rows *sql.Rows) (outboxdriver.DeadLetter, error) {
		var dl outboxdriver.DeadLetter
		err := scanMessage(rows, &dl.Message, &dl.DeadAt)
		return dl, err
	})
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}

// DeadCount returns how many dead letters match f (at most f.Limit when it is set): what
// DeadReplay or DeadPurge would act on if called now.
func (d *Driver) DeadCount(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	if err := d.needDB(); err != nil {
		return 0, err
	}
	q, args, err := d.names.DeadCount(f)
	if err != nil {
		return 0, err
	}
	var n int
	if err := d.db.QueryRowContext(ctx, q, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count dead letters: %w", err)
	}
	return n, nil
}

// DeadReplay moves the dead letters that match f back to pending, due at once, with
// their attempt count reset, and returns how many it moved. With f.Limit set it takes the
// ones DeadList would show first.
//
// A replayed message keeps its ID, dedup key and position (seq), so it reaches the broker
// with the identity it was written with and consumers that already saw it (a broker that
// accepted it but whose confirmation was lost) deduplicate it as usual. Replayed messages
// of one key are published in their original order; messages of that key written after
// them and already published are not held back, so a consumer sees the replayed message
// after its successors. The last error is kept until the next attempt overwrites it, for
// whoever investigates a message that fails again.
//
// The matching dead letters are locked and moved from the dead table to the pending one
// in one transaction, which also wakes the relays that listen for notifications (relays
// on outboxpgx; relays on this package poll).
func (d *Driver) DeadReplay(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	if err := d.needDB(); err != nil {
		return 0, err
	}
	pick, args, err := d.names.DeadPick(f)
	if err != nil {
		return 0, err
	}
	var n int64
	err = withTx(ctx, d.db, nil, func(tx *sql.Tx) error {
		seqs, err := collect(ctx, tx, pick, args, scanInt64)
		if err != nil || len(seqs) == 0 {
			return err
		}
		res, err := tx.ExecContext(ctx, d.names.Replay(), pgsql.IntArray(seqs))
		if err != nil {
			return err
		}
		if n, err = res.RowsAffected(); err != nil || n == 0 {
			return err
		}
		notify, args := d.names.Notify()
		_, err = tx.ExecContext(ctx, notify, args...)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("replay dead letters: %w", err)
	}
	return int(n), nil
}

// DeadPurge deletes the dead letters that match f and returns how many it deleted. With
// f.Limit set it takes the ones DeadList would show first.
//
// A purged message's dedup key is not released at once: the relay's retention cleanup
// releases it later, once it is older than the retention time. Until then a message
// written with the same dedup key is still skipped as a duplicate.
//
// A filter that selects nothing in particular is refused with outboxdriver.ErrEmptyDeadFilter:
// deleting everything is DeadPurgeAll.
func (d *Driver) DeadPurge(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	if f.IsEmpty() {
		return 0, outboxdriver.ErrEmptyDeadFilter
	}
	return d.deadPurge(ctx, f)
}

// DeadPurgeAll deletes every dead letter and returns how many it deleted. Pending and
// published messages are not touched. Dedup keys are released later, as for DeadPurge.
func (d *Driver) DeadPurgeAll(ctx context.Context) (int, error) {
	return d.deadPurge(ctx, outboxdriver.DeadFilter{})
}

func (d *Driver) deadPurge(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	if err := d.needDB(); err != nil {
		return 0, err
	}
	q, args, err := d.names.DeadPurge(f)
	if err != nil {
		return 0, err
	}
	res, err := d.db.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("purge dead letters: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("purge dead letters: %w", err)
	}
	return int(n), nil
}
