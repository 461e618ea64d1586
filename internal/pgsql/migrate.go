package pgsql

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// MigrationStatus is one migration and whether it is applied.
type MigrationStatus struct {
	Version int
	Name    string
	Applied bool
	// Deferrable: this code runs correctly without the migration, so relays can be
	// upgraded first and the migration applied once none of the old version runs (see
	// docs/operations.md, Migrations).
	Deferrable bool
	// DownDrops, when not empty, says what reverting the migration deletes for good (its
	// down migration drops tables with data in them); a command must ask before it.
	DownDrops string
}

// deferrable are the migrations this code runs without: version 3 (published history in
// partitions), whose maintenance falls back to deleting expired rows on the old table,
// version 4 (the pending ring), without which Recycle does nothing, version 5 (WAL
// mode's bookkeeping), without which relays poll, version 6 (the NOTIFY's seq),
// without which every wake-up fetches in full, version 7 (the wake gate), without
// which writers notify on every commit and the relay takes no gate, version 8 (the
// relays' fingerprints), without which relays do not compare their routing, and version
// 9 (replay jobs), which only outbox replay needs, and version 10 (priorities), without
// which the relay reads in seq order alone and writers refuse a priority.
var deferrable = map[int]bool{3: true, 4: true, 5: true, 6: true, 7: true, 8: true, 9: true, 10: true}

// downDrops returns what reverting each migration deletes: the migrations whose down
// migration drops tables holding data. (Reverting 3 and 4 copies their rows back.)
func (n *Names) downDrops() map[int]string {
	return map[int]string{
		1: "every outbox table with every message in them, pending ones included",
		2: fmt.Sprintf("%s and %s: the consumers' deduplication and version state", n.Inbox, n.Versions),
		5: fmt.Sprintf("%s, which names WAL mode's replication slots and their lease, and the relays' mode column "+
			"(it refuses while a slot named there exists: 'outbox wal drop' it first)", n.walTable()),
	}
}

// ringMigration makes the pending table a ring of buckets, copying the pending rows
// while it holds the outbox's lock.
const ringMigration = 4

// WALMigration records WAL mode's slots: `outbox wal setup` needs it and every version
// before it.
const WALMigration = 5

// ErrCopyLimit is wrapped by Up's error when migration 4 would copy more pending rows
// than the configured limit.
var ErrCopyLimit = errors.New("too many pending rows to copy")

// checkCopy refuses migration 4 when the outbox holds more pending rows than the limit:
// writers and relays wait while they are copied.
func (n *Names) checkCopy(ctx context.Context, q Querier) error {
	if n.copyLimit < 0 {
		return nil
	}
	got, err := queryInts(ctx, q, `SELECT count(*)::int FROM (SELECT 1 FROM `+n.Outbox+` LIMIT $1) x`, n.copyLimit+1)
	if err != nil {
		return err
	}
	if got[0] > n.copyLimit {
		return fmt.Errorf("%w: the outbox holds more than %d pending messages, which this migration copies while writers and relays wait for it (about 5 µs each); "+
			"let the relays drain the backlog first, or raise the limit (outbox migrate up --max-copy, or MigrateCopyLimit; -1 for none)", ErrCopyLimit, n.copyLimit)
	}
	return nil
}

func (n *Names) lockSQL() string {
	return `SELECT pg_advisory_xact_lock(hashtext('outbox-migrate:' || ` + n.ChannelLiteral + `))`
}

func (n *Names) ensureTableSQL() string {
	return n.r(`CREATE SCHEMA IF NOT EXISTS {{schema}};
CREATE TABLE IF NOT EXISTS {{migrations}} (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`)
}

func (n *Names) applied(ctx context.Context, q Querier) (map[int]bool, error) {
	vs, err := queryInts(ctx, q, n.r(`SELECT version FROM {{migrations}}`))
	if err != nil {
		return nil, err
	}
	m := map[int]bool{}
	for _, v := range vs {
		m[v] = true
	}
	return m, nil
}

// Status lists every migration and whether it is applied. It creates nothing.
func (n *Names) Status(ctx context.Context, inTx InTx) ([]MigrationStatus, error) {
	all, err := n.migrations()
	if err != nil {
		return nil, err
	}
	var out []MigrationStatus
	err = inTx(ctx, func(q Querier) error {
		exists, err := queryInts(ctx, q, `SELECT count(*)::int FROM pg_catalog.pg_class WHERE oid = to_regclass($1)`, n.Migrations)
		if err != nil {
			return err
		}
		done := map[int]bool{}
		if exists[0] > 0 {
			if done, err = n.applied(ctx, q); err != nil {
				return err
			}
		}
		drops := n.downDrops()
		for _, m := range all {
			out = append(out, MigrationStatus{Version: m.Version, Name: m.Name, Applied: done[m.Version],
				Deferrable: deferrable[m.Version], DownDrops: drops[m.Version]})
		}
		return nil
	})
	return out, err
}

// Up applies every migration up to target (0 means all) in one transaction, under an
// advisory lock so concurrent migrators do not race. It returns the versions applied.
func (n *Names) Up(ctx context.Context, inTx InTx, target int) ([]int, error) {
	return n.migrate(ctx, inTx, func(q Querier, all []Migration, applied map[int]bool, done *[]int) error {
		if err := n.lockFirst(ctx, q, applied, target); err != nil {
			return err
		}
		for _, m := range all {
			if applied[m.Version] || (target > 0 && m.Version > target) {
				continue
			}
			if m.Version == ringMigration {
				if err := n.checkCopy(ctx, q); err != nil {
					return fmt.Errorf("migration %03d_%s up: %w", m.Version, m.Name, err)
				}
			}
			if err := q.Exec(ctx, m.Up); err != nil {
				return fmt.Errorf("migration %03d_%s up: %w", m.Version, m.Name, err)
			}
			if err := q.Exec(ctx, n.r(`INSERT INTO {{migrations}} (version, name) VALUES ($1, $2)`), m.Version, m.Name); err != nil {
				return err
			}
			*done = append(*done, m.Version)
		}
		return nil
	})
}

// migrate runs fn in one transaction, under the advisory lock that keeps concurrent
// migrators apart, with every migration and the applied ones; fn appends to done the
// versions it applies or reverts, which migrate returns.
func (n *Names) migrate(ctx context.Context, inTx InTx, fn func(q Querier, all []Migration, applied map[int]bool, done *[]int) error) ([]int, error) {
	all, err := n.migrations()
	if err != nil {
		return nil, err
	}
	var done []int
	err = inTx(ctx, func(q Querier) error {
		done = nil
		if err := q.Exec(ctx, n.lockSQL()); err != nil {
			return err
		}
		if err := q.Exec(ctx, n.ensureTableSQL()); err != nil {
			return err
		}
		applied, err := n.applied(ctx, q)
		if err != nil {
			return err
		}
		return fn(q, all, applied, &done)
	})
	if err != nil {
		return nil, err
	}
	return done, nil
}

// lockFirst takes the pending table's lock before any migration runs when the ring
// migration is among those to apply and the table exists. A relay recording an outcome
// locks the pending table, then the history; migration 3 renames the history, and
// migration 4 then locks the pending table, in the same transaction: in that order the
// two would deadlock against a running relay. Writers wait from here rather than from
// migration 4, which holds the lock until the commit anyway.
func (n *Names) lockFirst(ctx context.Context, q Querier, applied map[int]bool, target int) error {
	if applied[ringMigration] || (target > 0 && target < ringMigration) {
		return nil
	}
	exists, err := queryInts(ctx, q, `SELECT (to_regclass($1) IS NOT NULL)::int`, n.Outbox)
	if err != nil || exists[0] == 0 {
		return err
	}
	return q.Exec(ctx, `LOCK TABLE `+n.Outbox+` IN ACCESS EXCLUSIVE MODE`)
}

// Down reverts applied migrations above target (0 reverts all), newest first, in one
// transaction. It returns the versions reverted.
func (n *Names) Down(ctx context.Context, inTx InTx, target int) ([]int, error) {
	return n.migrate(ctx, inTx, func(q Querier, all []Migration, applied map[int]bool, done *[]int) error {
		for i := len(all) - 1; i >= 0; i-- {
			m := all[i]
			if !applied[m.Version] || m.Version <= target {
				continue
			}
			if err := q.Exec(ctx, m.Down); err != nil {
				return fmt.Errorf("migration %03d_%s down: %w", m.Version, m.Name, err)
			}
			if err := q.Exec(ctx, n.r(`DELETE FROM {{migrations}} WHERE version = $1`), m.Version); err != nil {
				return err
			}
			*done = append(*done, m.Version)
		}
		return nil
	})
}

// SQL returns the DDL of every migration as one script, with the bookkeeping rows, for
// teams that apply migrations with their own tool.
func (n *Names) SQL() (string, error) {
	all, err := n.migrations()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("-- outbox schema, generated by `outbox migrate sql`.\nBEGIN;\n")
	b.WriteString(n.ensureTableSQL() + ";\n")
	for _, m := range all {
		fmt.Fprintf(&b, "\n-- %03d_%s\n%s\n", m.Version, m.Name, strings.TrimSpace(m.Up))
		fmt.Fprintf(&b, "INSERT INTO %s (version, name) VALUES (%d, '%s');\n", n.Migrations, m.Version, m.Name)
	}
	b.WriteString("COMMIT;\n")
	return b.String(), nil
}
