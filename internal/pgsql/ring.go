package pgsql

import (
	"context"
	"errors"
	"fmt"

	"github.com/outboxkit/outbox/internal/broken"
	"github.com/outboxkit/outbox/outboxdriver"
)

// The pending ring (migration 4). Pending rows live in RingBuckets LIST partitions of the
// outbox table; writers append to the bucket outbox_ring names. Recycle, which relays call
// every second (every 100 ms while a retired bucket drains), does two things under the
// ring's advisory lock:
//
//   - reclaim: a bucket other than the current one whose rows are nearly all gone (at
//     most MoveLimit still pending) is locked, its pending rows are moved into the
//     current bucket with their seq and every other column unchanged, and it is
//     truncated. TRUNCATE gives the storage back whatever snapshot is open, where a
//     DELETE would leave dead rows for fetches to walk until vacuum may remove them.
//   - rotate: once the current bucket has taken RotateRows rows (counted by the seq
//     sequence since it became current) and the next bucket is empty (no storage at
//     all), the next one becomes current.
//
// A row may land in any bucket at any time (an INSERT that read the ring before a
// rotation, a long REPEATABLE READ writer), and a fetch reads every bucket, so where a
// row is stored is never a question of correctness: rotation and reclaim only decide
// how much dead storage a fetch walks. docs/design.md, "Bloat-proof storage", has the
// states, the locks, and what a crash at each step leaves.

// RotateRowsDefault is how many rows a bucket takes before the ring moves on.
const RotateRowsDefault = 2_000

// MoveLimit is the most pending rows a reclaim moves: the bucket is locked while they
// are copied, so a bucket holding more (a backlog) is left to drain first.
const MoveLimit = 1_000

// ringLockTimeout bounds how long a reclaim waits for the bucket's lock, which it can
// only get once the writers' and relays' statements on that bucket are done, and which
// queues every later fetch and outcome behind it while it waits; it tries again at the
// next call.
const ringLockTimeout = "20ms"

// ringLargeBucket is the size (bytes) from which a reclaim waits up to
// ringLargeLockTimeout for the bucket's lock: about 45,000 rows of a few hundred bytes,
// which every full fetch walks until the bucket is emptied.
const (
	ringLargeBucket      = 16 << 20
	ringLargeLockTimeout = "250ms"
)

// Ringed reports whether the pending table is a ring of buckets (migration 4).
func (n *Names) Ringed(ctx context.Context, inTx InTx) (bool, error) {
	var got []int
	err := inTx(ctx, func(q Querier) error {
		var err error
		got, err = queryInts(ctx, q, `SELECT (to_regclass($1) IS NOT NULL)::int`, n.Ring)
		return err
	})
	return len(got) == 1 && got[0] == 1, err
}

// Recycle reclaims the retired buckets that are nearly empty, then rotates the ring if
// the current bucket is full and the next one is free. Before migration 4 it does
// nothing.
func (n *Names) Recycle(ctx context.Context, inTx InTx) (outboxdriver.Recycling, error) {
	var r outboxdriver.Recycling
	ringed, err := n.Ringed(ctx, inTx)
	if err != nil || !ringed {
		return r, err
	}
	current, err := n.ringCurrent(ctx, inTx)
	if err != nil {
		return r, err
	}
	// Oldest first: the bucket after the current one is the next to become current.
	var errs []error
	for i := 1; i < RingBuckets; i++ {
		b := (current + i) % RingBuckets
		moved, done, waiting, err := n.reclaim(ctx, inTx, b)
		if done {
			r.Reclaimed++
			r.Moved += moved
		}
		r.Draining = r.Draining || waiting
		errs = append(errs, err)
	}
	r.Rotated, err = n.rotate(ctx, inTx, n.rotateRows)
	return r, errors.Join(append(errs, err)...)
}

func (n *Names) ringCurrent(ctx context.Context, inTx InTx) (int, error) {
	var got []int
	err := inTx(ctx, func(q Querier) error {
		var err error
		got, err = queryInts(ctx, q, `SELECT current FROM `+n.Ring)
		return err
	})
	if err == nil && len(got) != 1 {
		err = fmt.Errorf("%s holds %d rows; want 1", n.Ring, len(got))
	}
	if err != nil {
		return 0, err
	}
	return got[0], nil
}

// statusRing reads the ring for Status: the current bucket, the rotations, and the rows
// written since the last one. Run it only when the ring exists (statusRinged).
func (n *Names) statusRing() (string, []any) {
	return `SELECT current, rotations,
    coalesce(pg_sequence_last_value(pg_get_serial_sequence($1, 'seq')::regclass), 0) - rotated_seq
FROM ` + n.Ring, []any{n.Outbox}
}

// statusRinged says, for Status, whether the ring exists (one row: 1 or 0).
func (n *Names) statusRinged() (string, []any) {
	return `SELECT (to_regclass($1) IS NOT NULL)::int`, []any{n.Ring}
}

// ringTx runs fn in a transaction holding the ring's advisory lock, with lock_timeout
// ringLockTimeout. ran is false when another process holds the lock or a table lock was
// not granted in time: nothing changed, and the step is tried again at the next call.
func (n *Names) ringTx(ctx context.Context, inTx InTx, fn func(Querier) error) (ran bool, err error) {
	return n.lockedTx(ctx, inTx, "outbox-ring:", ringLockTimeout, fn)
}

// reclaim empties bucket b if it is not the current one, has storage, and holds at most
// MoveLimit pending rows: in one transaction, lock it, move its rows into the current
// bucket, and truncate it. done says the bucket was truncated, waiting that it holds
// more than MoveLimit pending rows.
//
// The ACCESS EXCLUSIVE lock waits for the statements that use b (fetches, outcomes,
// inserts that routed a row there) and holds off new ones until commit. A statement that
// waited takes its snapshot after the lock is granted (READ COMMITTED), so it finds the
// moved rows in their new bucket. The ring row is read FOR SHARE, so b cannot become
// current meanwhile.
func (n *Names) reclaim(ctx context.Context, inTx InTx, b int) (moved int, done, waiting bool, err error) {
	bucket := n.Bucket(b)
	ran, err := n.ringTx(ctx, inTx, func(q Querier) error {
		cur, err := queryInts(ctx, q, `SELECT current FROM `+n.Ring+` FOR SHARE`)
		if err != nil || len(cur) != 1 || cur[0] == b {
			return err
		}
		size, err := queryInts(ctx, q, `SELECT pg_relation_size($1)`, bucket)
		if err != nil || size[0] == 0 {
			return err // never written since its last reclaim: nothing to give back
		}
		// Count first without the lock, which would stop every fetch and outcome while
		// the count walks a bucket still full of backlog. From the highest seq down: a
		// backlog drains from its lowest seq, so its live rows come first and the count
		// stops at MoveLimit without walking the rows already published.
		if live, err := queryInts(ctx, q, `SELECT count(*)::int FROM (SELECT 1 FROM `+bucket+` ORDER BY seq DESC LIMIT $1) x`, MoveLimit+1); err != nil || live[0] > MoveLimit {
			waiting = err == nil
			return err
		}
		// Waiting for the commit to be flushed would hold the lock longer. If the commit
		// is lost in a crash, the reclaim never happened: a consistent state. Any later
		// transaction that depends on it flushes it first (the log is flushed in order).
		if err := q.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
			return err
		}
		// A bucket that held a large backlog makes every full fetch walk it, so those
		// fetches are slow, and the lock cannot be had until one ends: wait longer for it.
		if size[0] >= ringLargeBucket {
			if err := q.Exec(ctx, `SET LOCAL lock_timeout = '`+ringLargeLockTimeout+`'`); err != nil {
				return err
			}
		}
		if err := q.Exec(ctx, `LOCK TABLE `+bucket+` IN ACCESS EXCLUSIVE MODE`); err != nil {
			return err
		}
		// Move what is there (a writer may have added rows since the count), in one scan
		// of the bucket, and undo it all if that is more than MoveLimit after all.
		move := `WITH m AS (INSERT INTO ` + n.Outbox + ` (` + pendingColumns + `, bucket) OVERRIDING SYSTEM VALUE
SELECT ` + pendingColumns + `, $1 FROM ` + bucket + ` ORDER BY seq RETURNING 1) SELECT count(*)::int FROM m`
		if broken.Has(broken.TruncateStragglers) {
			move = `SELECT 0 WHERE $1::int IS NOT NULL` // canary: the pending rows are not moved
		}
		got, err := queryInts(ctx, q, move, cur[0])
		if err != nil {
			return fmt.Errorf("move the pending rows of bucket %d: %w", b, err)
		}
		if len(got) == 1 && got[0] > MoveLimit {
			return errTooManyToMove
		}
		if err := q.Exec(ctx, `TRUNCATE `+bucket); err != nil {
			return fmt.Errorf("truncate bucket %d: %w", b, err)
		}
		moved, done = got[0], true
		return nil
	})
	if errors.Is(err, errTooManyToMove) {
		return 0, false, true, nil
	}
	if err != nil {
		return 0, false, false, fmt.Errorf("reclaim bucket %d: %w", b, err)
	}
	return moved, done && ran, waiting, nil
}

// rotate makes the next bucket current once the current one has taken rotateRows rows
// and the next one has no storage (it was reclaimed, or never used). Rows written since
// are counted by the seq sequence, which moves and replays do not advance.
func (n *Names) rotate(ctx context.Context, inTx InTx, rotateRows int) (rotated bool, err error) {
	ran, err := n.ringTx(ctx, inTx, func(q Querier) error {
		var current, taken int
		if err := q.QueryRow(ctx, `SELECT current,
    coalesce(pg_sequence_last_value(pg_get_serial_sequence($1, 'seq')::regclass), 0) - rotated_seq
FROM `+n.Ring+` FOR UPDATE`, []any{n.Outbox}, &current, &taken); err != nil || taken < rotateRows {
			return err
		}
		next := (current + 1) % RingBuckets
		free, err := queryInts(ctx, q, `SELECT (pg_relation_size($1) = 0)::int`, n.Bucket(next))
		if err != nil || free[0] != 1 {
			return err
		}
		rotated = true
		return q.Exec(ctx, `UPDATE `+n.Ring+` SET current = $1, rotated_at = now(), rotations = rotations + 1,
    rotated_seq = coalesce(pg_sequence_last_value(pg_get_serial_sequence($2, 'seq')::regclass), 0)`, next, n.Outbox)
	})
	if err != nil {
		return false, fmt.Errorf("rotate the ring: %w", err)
	}
	return rotated && ran, nil
}

// errTooManyToMove rolls a reclaim back when the bucket turned out to hold more than
// MoveLimit rows once locked.
var errTooManyToMove = errors.New("too many pending rows to move")

// pendingColumns are the pending table's columns a move copies: all but the generated
// shard (computed again from the same key and id) and the bucket.
const pendingColumns = "seq, id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, created_at, next_attempt_at, attempts, last_error"
