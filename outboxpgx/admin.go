package outboxpgx

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/outboxdriver"
)

// This file is the operator's side of the driver: the figures behind `outbox status`
// and the dead-letter tooling behind `outbox dead`. The statements are pgsql's, shared
// with outboxsql.

// ErrEmptyDeadFilter is outboxdriver.ErrEmptyDeadFilter.
var ErrEmptyDeadFilter = outboxdriver.ErrEmptyDeadFilter

var _ outboxdriver.Admin = (*Driver)(nil)

// PublishedExactBelow is the size of the published table, as estimated by PostgreSQL's
// statistics, under which Status counts published rows exactly. Above it the count is an
// estimate (see Status), because counting them exactly means reading the whole table.
const PublishedExactBelow = pgsql.PublishedExactBelow

// Status returns a snapshot of the outbox, read in one repeatable-read transaction so
// that its figures agree with each other and share one database clock.
//
// The pending and dead figures are exact and cheap: the pending table holds only the
// backlog and the dead table only the dead letters (published messages live in a table of
// their own), so their cost follows the backlog and the dead-letter store, not the
// history kept. Published is exact while PostgreSQL estimates the published table below
// PublishedExactBelow rows; above that it is PostgreSQL's row-count estimate for that
// table (pg_class.reltuples), because only a full scan could count it exactly.
// OldestPendingAge is measured from when the message was written, so a message delayed
// with DeliverAt counts from its write too.
//
// Relays lists the relays in the relays table (expired ones are kept about an hour and
// shown with Live false) with the number of shards each holds an unexpired lease on.
func (d *Driver) Status(ctx context.Context) (outboxdriver.Status, error) {
	if err := d.needPool(); err != nil {
		return outboxdriver.Status{}, err
	}
	st := outboxdriver.Status{Topics: []outboxdriver.TopicStatus{}, Relays: []outboxdriver.RelayInfo{}}
	opts := pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}
	err := pgx.BeginTxFunc(ctx, d.pool, opts, func(tx pgx.Tx) error {
		// Dashboards poll this; see pgsql.NoJIT.
		if _, err := tx.Exec(ctx, pgsql.NoJIT); err != nil {
			return err
		}
		if err := d.topicStatus(ctx, tx, &st); err != nil {
			return fmt.Errorf("count pending and dead: %w", err)
		}
		if err := d.publishedCount(ctx, tx, &st); err != nil {
			return fmt.Errorf("count published: %w", err)
		}
		if err := d.names.StorageStatus(ctx, pgxQuerier{tx}, &st); err != nil {
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

// topicStatus fills the per-topic rows and the totals.
func (d *Driver) topicStatus(ctx context.Context, tx pgx.Tx, st *outboxdriver.Status) error {
	rows, err := tx.Query(ctx, d.names.StatusTopics())
	if err != nil {
		return err
	}
	topics, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxdriver.TopicStatus, error) {
		var t outboxdriver.TopicStatus
		var ageMicros int64
		err := r.Scan(&t.Topic, &t.Pending, &t.Due, &t.Retrying, &t.Dead, &ageMicros)
		t.OldestPendingAge = time.Duration(ageMicros) * time.Microsecond
		return t, err
	})
	if err != nil {
		return err
	}
	pgsql.AddTopics(st, topics)
	return nil
}

// publishedCount counts the published table exactly while it is small and estimates it
// when it is large (see Status).
func (d *Driver) publishedCount(ctx context.Context, tx pgx.Tx, st *outboxdriver.Status) error {
	var relTuples, liveTuples int64
	var legacy bool
	q, args := d.names.StatusPublishedStats()
	if err := tx.QueryRow(ctx, q, args...).Scan(&relTuples, &liveTuples, &legacy); err != nil {
		return err
	}
	if n, ok := pgsql.PublishedEstimate(relTuples, liveTuples); ok {
		st.Published = n
		return nil
	}
	return tx.QueryRow(ctx, d.names.StatusPublishedCount(legacy)).Scan(&st.Published)
}

func (d *Driver) relayStatus(ctx context.Context, tx pgx.Tx, st *outboxdriver.Status) error {
	rows, err := tx.Query(ctx, d.names.StatusRelays())
	if err != nil {
		return err
	}
	relays, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxdriver.RelayInfo, error) {
		var ri outboxdriver.RelayInfo
		var pid int32
		err := r.Scan(&ri.ID, &ri.Hostname, &pid, &ri.StartedAt, &ri.HeartbeatAt, &ri.Live, &ri.Shards)
		ri.PID = int(pid)
		return ri, err
	})
	if err != nil {
		return err
	}
	st.Relays = append(st.Relays, relays...)
	return tx.QueryRow(ctx, d.names.StatusShards()).Scan(&st.Shards, &st.ShardsLeased)
}

// DeadList returns the dead letters that match f, most recently dead-lettered first.
func (d *Driver) DeadList(ctx context.Context, f outboxdriver.DeadFilter) ([]outboxdriver.DeadLetter, error) {
	if err := d.needPool(); err != nil {
		return nil, err
	}
	q, args, err := d.names.DeadList(f)
	if err != nil {
		return nil, err
	}
	rows, err := d.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanDeadLetter)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}

func scanDeadLetter(row pgx.CollectableRow) (outboxdriver.DeadLetter, error) {
	var dl outboxdriver.DeadLetter
	m := &dl.Message
	var id [16]byte
	var headers []byte
	var shard int16
	if err := row.Scan(&m.Seq, &id, &m.Topic, &m.Key, &m.AggregateType, &m.EventType, &m.ContentType, &m.Payload,
		&headers, &m.DedupKey, &shard, &m.CreatedAt, &m.Attempts, &m.LastError, &dl.DeadAt); err != nil {
		return dl, err
	}
	m.ID = id
	m.Shard = int(shard)
	var err error
	m.Headers, err = pgsql.DecodeHeaders(m.Seq, headers)
	return dl, err
}

// DeadCount returns how many dead letters match f (at most f.Limit when it is set): what
// DeadReplay or DeadPurge would act on if called now.
func (d *Driver) DeadCount(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	if err := d.needPool(); err != nil {
		return 0, err
	}
	q, args, err := d.names.DeadCount(f)
	if err != nil {
		return 0, err
	}
	var n int
	if err := d.pool.QueryRow(ctx, q, args...).Scan(&n); err != nil {
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
// in one transaction, and relays listening for notifications are woken in it.
func (d *Driver) DeadReplay(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	if err := d.needPool(); err != nil {
		return 0, err
	}
	pick, args, err := d.names.DeadPick(f)
	if err != nil {
		return 0, err
	}
	var n int
	err = pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, pick, args...)
		if err != nil {
			return err
		}
		seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil || len(seqs) == 0 {
			return err
		}
		tag, err := tx.Exec(ctx, d.names.Replay(), seqs)
		if err != nil {
			return err
		}
		n = int(tag.RowsAffected())
		if n > 0 {
			notify, args := d.names.Notify()
			_, err = tx.Exec(ctx, notify, args...)
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("replay dead letters: %w", err)
	}
	return n, nil
}

// DeadPurge deletes the dead letters that match f and returns how many it deleted. With
// f.Limit set it takes the ones DeadList would show first.
//
// A purged message's dedup key is not released at once: the relay's retention cleanup
// releases it later, once it is older than the retention time. Until then a message
// written with the same dedup key is still skipped as a duplicate.
//
// A filter that selects nothing in particular is refused with ErrEmptyDeadFilter:
// deleting everything is DeadPurgeAll.
func (d *Driver) DeadPurge(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	if f.IsEmpty() {
		return 0, ErrEmptyDeadFilter
	}
	return d.deadPurge(ctx, f)
}

// DeadPurgeAll deletes every dead letter and returns how many it deleted. Pending and
// published messages are not touched. Dedup keys are released later, as for DeadPurge.
func (d *Driver) DeadPurgeAll(ctx context.Context) (int, error) {
	return d.deadPurge(ctx, outboxdriver.DeadFilter{})
}

func (d *Driver) deadPurge(ctx context.Context, f outboxdriver.DeadFilter) (int, error) {
	if err := d.needPool(); err != nil {
		return 0, err
	}
	q, args, err := d.names.DeadPurge(f)
	if err != nil {
		return 0, err
	}
	tag, err := d.pool.Exec(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("purge dead letters: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
