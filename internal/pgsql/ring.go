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
//     most MoveLimit still pending, MoveLimitLarge for a bucket that held a backlog) is
//     locked, its pending rows are moved into the current bucket with their seq and
//     every other column unchanged, and it is truncated. TRUNCATE gives the storage
//     back whatever snapshot is open, where a DELETE would leave dead rows for fetches
//     to walk until vacuum may remove them.
//   - rotate: once the current bucket has taken RotateRows rows (counted by the seq
//     sequence since it became current), or right after a backlog's tail was moved into
//     it, and the next bucket is empty (no storage at all), the next one becomes
//     current.
//
// A row may land in any bucket at any time (an INSERT that read the ring before a
// rotation, a long REPEATABLE READ writer), and a fetch reads every bucket, so where a
// row is stored is never a question of correctness: rotation and reclaim only decide
// how much dead storage a fetch walks. docs/design.md, "Bloat-proof storage", has the
// states, the locks, and what a crash at each step leaves.

// RotateRowsDefault is how many rows a bucket takes before the ring moves on.
const RotateRowsDefault = 2_000

// MoveLimit is the most pending rows a reclaim moves: outcomes wait while they are
// copied, so a bucket holding more (a backlog) is left to drain first.
const MoveLimit = 1_000

// MoveLimitLarge is MoveLimit for a bucket of ringLargeBucket bytes or more, one that
// held a backlog. Until such a bucket is emptied every full fetch walks the rows
// published from it, tens of milliseconds while a snapshot keeps them: emptied with up
// to 10,000 rows left, it is emptied while the backlog's last rows are published rather
// than after, and the ring moves on at once, so that the rows moved do not stay in the
// current bucket once published (docs/design.md, "Rotation and reclaim").
const MoveLimitLarge = 10_000

// ringLockTimeout bounds how long a reclaim waits for the bucket's lock, which it can
// only get once the writers' and relays' statements on that bucket are done, and which
// queues every later fetch and outcome behind it while it waits; it tries again at the
// next call.
const ringLockTimeout = "20ms"

// ringLargeBucket is the size (bytes) from which a bucket counts as large: about 45,000
// rows of a few hundred bytes, which every full fetch walks until the bucket is
// emptied. A reclaim moves up to MoveLimitLarge rows out of it and waits up to
// ringLargeLockTimeout for its lock, since those fetches are slow and the lock cannot
// be had until one ends.
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
	var tail bool
	for i := 1; i < RingBuckets; i++ {
		b := (current + i) % RingBuckets
		rc, err := n.reclaim(ctx, inTx, b)
		if rc.done {
			r.Reclaimed++
			r.Moved += rc.moved
			tail = tail || rc.tail
		}
		r.Draining = r.Draining || rc.waiting
		errs = append(errs, err)
	}
	// A backlog's tail, moved out of a large bucket, is published within a moment: move
	// on now, so that the bucket it went to is emptied next rather than after RotateRows
	// more writes, while every full fetch walks it. Rows that wait (retries, delays)
	// do not count: they would be moved back and forth.
	r.Rotated, err = n.rotate(ctx, inTx, n.rotateRows, tail)
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

// reclaimed is what a reclaim did: done says the bucket was truncated after moving
// moved rows out of it, tail that it was a large bucket (ringLargeBucket) and more than
// MoveLimit of the rows moved were due (a backlog's tail), waiting that it holds more
// pending rows than may be moved.
type reclaimed struct {
	moved               int
	done, tail, waiting bool
}

// reclaim empties bucket b if it is not the current one, has storage, and holds at most
// MoveLimit pending rows (MoveLimitLarge if it is large): in one transaction, lock it,
// move its rows into the current bucket, and truncate it.
//
// The rows are copied under a SHARE lock, which waits for the statements that change b
// (outcomes, inserts that routed a row there) and holds off new ones, while fetches go
// on reading b; the copies stay invisible to them until commit. The ACCESS EXCLUSIVE
// lock that follows waits for the fetches too and holds off every statement on b until
// commit, for the TRUNCATE alone: a bucket that held a large backlog takes tens of
// milliseconds to scan while a snapshot keeps its dead rows, and no fetch waits for
// that. A statement that waited for either lock takes its snapshot after the lock is
// granted (READ COMMITTED), so it finds the moved rows in their new bucket. The ring row
// is read FOR SHARE, so b cannot become current meanwhile.
func (n *Names) reclaim(ctx context.Context, inTx InTx, b int) (reclaimed, error) {
	bucket := n.Bucket(b)
	var rc reclaimed
	ran, err := n.ringTx(ctx, inTx, func(q Querier) error {
		cur, err := queryInts(ctx, q, `SELECT current FROM `+n.Ring+` FOR SHARE`)
		if err != nil || len(cur) != 1 || cur[0] == b {
			return err
		}
		size, err := queryInts(ctx, q, `SELECT pg_relation_size($1)`, bucket)
		if err != nil || size[0] == 0 {
			return err // never written since its last reclaim: nothing to give back
		}
		large := size[0] >= ringLargeBucket
		limit := MoveLimit
		if large {
			limit = MoveLimitLarge
		}
		// Count first without the lock, which would hold off outcomes while the count
		// walks a bucket still full of backlog. From the highest seq down: a backlog
		// drains from its lowest seq, so its live rows come first and the count stops at
		// the limit without walking the rows already published.
		if live, err := queryInts(ctx, q, `SELECT count(*)::int FROM (SELECT 1 FROM `+bucket+` ORDER BY seq DESC LIMIT $1) x`, limit+1); err != nil || live[0] > limit {
			rc.waiting = err == nil
			return err
		}
		// Waiting for the commit to be flushed would hold the lock longer. If the commit
		// is lost in a crash, the reclaim never happened: a consistent state. Any later
		// transaction that depends on it flushes it first (the log is flushed in order).
		if err := q.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
			return err
		}
		// SHARE holds off the writers and outcomes that would change b (they take ROW
		// EXCLUSIVE) but not the fetches, which read on while the stragglers are copied.
		if err := q.Exec(ctx, `LOCK TABLE `+bucket+` IN SHARE MODE`); err != nil {
			return err
		}
		// Copy what is there (a writer may have added rows since the count), in one scan
		// of the bucket, and undo it all if that is more than the limit after all. The
		// copies are seen by others only at commit, when b is empty. Count the rows due
		// now (neither retried nor delayed), which are about to be published.
		// Priorities go along from schema version 10 on, which may have been applied
		// since the relay started.
		var prio bool
		if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = $1::regclass
    AND attname = 'priority' AND NOT attisdropped)`, []any{n.Outbox}, &prio); err != nil {
			return err
		}
		cols := pendingColumns
		if prio {
			cols += ", priority"
		}
		move := `WITH m AS (INSERT INTO ` + n.Outbox + ` (` + cols + `, bucket) OVERRIDING SYSTEM VALUE
SELECT ` + cols + `, $1 FROM ` + bucket + ` ORDER BY seq RETURNING next_attempt_at, created_at)
SELECT count(*)::int, (count(*) FILTER (WHERE next_attempt_at <= now() OR next_attempt_at = created_at))::int FROM m`
		if broken.Has(broken.TruncateStragglers) {
			move = `SELECT 0, 0 WHERE $1::int IS NOT NULL` // canary: the pending rows are not moved
		}
		var moved, due int
		if err := q.QueryRow(ctx, move, []any{cur[0]}, &moved, &due); err != nil {
			return fmt.Errorf("move the pending rows of bucket %d: %w", b, err)
		}
		if moved > limit {
			return errTooManyToMove
		}
		if large {
			if err := q.Exec(ctx, `SET LOCAL lock_timeout = '`+ringLargeLockTimeout+`'`); err != nil {
				return err
			}
		}
		// From here to the commit, fetches of b wait too: only the TRUNCATE is left.
		if err := q.Exec(ctx, `LOCK TABLE `+bucket+` IN ACCESS EXCLUSIVE MODE`); err != nil {
			return err
		}
		if err := q.Exec(ctx, `TRUNCATE `+bucket); err != nil {
			return fmt.Errorf("truncate bucket %d: %w", b, err)
		}
		rc.moved, rc.done, rc.tail = moved, true, large && due > MoveLimit
		return nil
	})
	if errors.Is(err, errTooManyToMove) {
		return reclaimed{waiting: true}, nil
	}
	if err != nil {
		return reclaimed{}, fmt.Errorf("reclaim bucket %d: %w", b, err)
	}
	rc.done = rc.done && ran
	return rc, nil
}

// rotate makes the next bucket current once the current one has taken rotateRows rows,
// or at once with now, and the next one has no storage (it was reclaimed, or never
// used). Rows written since are counted by the seq sequence, which moves and replays do
// not advance.
func (n *Names) rotate(ctx context.Context, inTx InTx, rotateRows int, now bool) (rotated bool, err error) {
	ran, err := n.ringTx(ctx, inTx, func(q Querier) error {
		var current, taken int
		if err := q.QueryRow(ctx, `SELECT current,
    coalesce(pg_sequence_last_value(pg_get_serial_sequence($1, 'seq')::regclass), 0) - rotated_seq
FROM `+n.Ring+` FOR UPDATE`, []any{n.Outbox}, &current, &taken); err != nil || (taken < rotateRows && !now) {
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
// its limit of rows once locked.
var errTooManyToMove = errors.New("too many pending rows to move")

// pendingColumns are the pending table's columns a move copies: all but the generated
// shard (computed again from the same key and id), the bucket, and the priority (schema
// version 10), which a move adds when the table has it.
const pendingColumns = "seq, id, topic, key, aggregate_type, event_type, content_type, payload, headers, dedup_key, created_at, next_attempt_at, attempts, last_error"
