package sqlstore

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/outboxkit/outbox/internal/pgsql"
)

// MigrationStatus is one schema migration and whether it is applied: the same type
// outboxpgx reports, so that tools list every store's migrations alike.
type MigrationStatus = pgsql.MigrationStatus

// migration is one schema version, rendered for a store's names and split into
// statements (database/sql drivers run one statement per call).
type migration struct {
	version  int
	name     string
	up, down []string
}

func (s *Store) migrations() ([]migration, error) {
	m := s.d.Migrations
	files, err := fs.Glob(m.FS, "*.sql")
	if err != nil {
		return nil, err
	}
	byVersion := map[int]*migration{}
	for _, f := range files {
		num, rest, ok := strings.Cut(f, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("sqlstore: bad migration file name %q", f)
		}
		name, dir, _ := strings.Cut(rest, ".")
		raw, err := fs.ReadFile(m.FS, f)
		if err != nil {
			return nil, err
		}
		tmpl, err := template.New(f).Option("missingkey=error").Parse(string(raw))
		if err != nil {
			return nil, fmt.Errorf("sqlstore: migration %s: %w", f, err)
		}
		var buf bytes.Buffer
		if err := tmpl.Execute(&buf, s.names); err != nil {
			return nil, fmt.Errorf("sqlstore: migration %s: %w", f, err)
		}
		mg := byVersion[v]
		if mg == nil {
			mg = &migration{version: v, name: name}
			byVersion[v] = mg
		}
		switch dir {
		case "up.sql":
			mg.up = splitStatements(buf.String())
		case "down.sql":
			mg.down = splitStatements(buf.String())
		default:
			return nil, fmt.Errorf("sqlstore: bad migration file name %q", f)
		}
	}
	out := make([]migration, 0, len(byVersion))
	for _, mg := range byVersion {
		out = append(out, *mg)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// splitStatements splits a migration into statements: each ends with ";" at the end of a
// line; lines starting with "--" are comments.
func splitStatements(script string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(script, "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(t, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if t := strings.TrimSpace(cur.String()); t != "" {
		out = append(out, t)
	}
	return out
}

func (s *Store) ensureTableSQL() string {
	return fmt.Sprintf(s.d.Migrations.Table, s.names.Migrations)
}

// lockName names the migration lock of this outbox.
func (s *Store) lockName() string { return "outbox_migrate:" + s.names.prefix }

func (s *Store) applied(ctx context.Context, q Querier) (map[int]bool, error) {
	vs, err := collect(ctx, q, scanInt64, s.sql(`SELECT version FROM {{migrations}}`))
	if err != nil {
		return nil, err
	}
	m := map[int]bool{}
	for _, v := range vs {
		m[int(v)] = true
	}
	return m, nil
}

// MigrationStatus lists every migration and whether it is applied. It creates nothing.
func (s *Store) MigrationStatus(ctx context.Context) ([]MigrationStatus, error) {
	if err := s.needDB(); err != nil {
		return nil, err
	}
	all, err := s.migrations()
	if err != nil {
		return nil, err
	}
	var exists int
	if err := s.db.QueryRowContext(ctx, s.d.Migrations.TableExists, s.names.Raw("outbox_migrations")).Scan(&exists); err != nil {
		return nil, fmt.Errorf("migration status: %w", err)
	}
	done := map[int]bool{}
	if exists > 0 {
		if done, err = s.applied(ctx, s.db); err != nil {
			return nil, fmt.Errorf("migration status: %w", err)
		}
	}
	drops := s.downDrops()
	out := make([]MigrationStatus, 0, len(all))
	for _, m := range all {
		out = append(out, MigrationStatus{Version: m.version, Name: m.name, Applied: done[m.version],
			Deferrable: m.version == PriorityMigration, DownDrops: drops[m.version]})
	}
	return out, nil
}

// downDrops returns what reverting each migration deletes: both drop tables that hold
// data (MigrationStatus.DownDrops).
func (s *Store) downDrops() map[int]string {
	return map[int]string{
		1: "every outbox table with every message in them, pending ones included",
		2: fmt.Sprintf("%s and %s: the consumers' deduplication and version state", s.names.Inbox, s.names.Versions),
	}
}

// redone reports whether a migration's statement failed only because an interrupted
// run of it already made its change (see Migrations.Redone).
func (s *Store) redone(err error) bool {
	return s.d.Migrations.Redone != nil && s.d.Migrations.Redone(err)
}

// MigrateUp applies the schema migrations up to version target (0 for all) under the
// dialect's migration lock, and returns the versions it applied. Running it again, or
// from several processes at once, is safe.
//
// SQLite applies them in one IMMEDIATE transaction. MySQL commits DDL statement by
// statement, so a migration is not atomic there; every statement of it is idempotent
// (IF NOT EXISTS, or an "already there" error taken as done: Migrations.Redone), and one
// interrupted halfway is finished by running MigrateUp again. Concurrent
// migrators wait for each other on a named lock (GET_LOCK).
func (s *Store) MigrateUp(ctx context.Context, target int) ([]int, error) {
	return s.migrate(ctx, "up", func(all []migration, applied map[int]bool) []step {
		var steps []step
		for _, m := range all {
			if !applied[m.version] && (target <= 0 || m.version <= target) {
				steps = append(steps, step{m, m.up,
					s.sql(`INSERT INTO {{migrations}} (version, name, applied_at) VALUES (?, ?, {{now}})`), []any{m.version, m.name}})
			}
		}
		return steps
	})
}

// MigrateDown reverts applied migrations above version target (0 reverts all, dropping
// the outbox and everything in it), newest first, and returns the versions it reverted.
func (s *Store) MigrateDown(ctx context.Context, target int) ([]int, error) {
	return s.migrate(ctx, "down", func(all []migration, applied map[int]bool) []step {
		var steps []step
		for i := len(all) - 1; i >= 0; i-- {
			if m := all[i]; applied[m.version] && m.version > target {
				steps = append(steps, step{m, m.down, s.sql(`DELETE FROM {{migrations}} WHERE version = ?`), []any{m.version}})
			}
		}
		return steps
	})
}

// A step is one migration applied or reverted: its statements, then the bookkeeping
// row's statement and arguments.
type step struct {
	m          migration
	stmts      []string
	record     string
	recordArgs []any
}

// migrate runs, under the dialect's migration lock, the steps plan picks from every
// migration and the applied ones, and returns their versions; dir ("up", "down") names
// them in errors.
func (s *Store) migrate(ctx context.Context, dir string, plan func(all []migration, applied map[int]bool) []step) ([]int, error) {
	if err := s.needDB(); err != nil {
		return nil, err
	}
	all, err := s.migrations()
	if err != nil {
		return nil, err
	}
	var done []int
	err = s.d.Migrations.Locked(ctx, s.db, s.lockName(), func(q Querier) error {
		done = nil
		if _, err := q.ExecContext(ctx, s.ensureTableSQL()); err != nil {
			return err
		}
		applied, err := s.applied(ctx, q)
		if err != nil {
			return err
		}
		for _, st := range plan(all, applied) {
			for _, stmt := range st.stmts {
				if _, err := q.ExecContext(ctx, stmt); err != nil && !s.redone(err) {
					return fmt.Errorf("migration %03d_%s %s: %w", st.m.version, st.m.name, dir, err)
				}
			}
			if _, err := q.ExecContext(ctx, st.record, st.recordArgs...); err != nil {
				return err
			}
			done = append(done, st.m.version)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("migrate %s: %w", dir, err)
	}
	return done, nil
}

// MigrationSQL returns the DDL of every migration as one script, with the bookkeeping
// rows, for teams that apply migrations with their own tool. It needs no database.
func (s *Store) MigrationSQL() (string, error) {
	all, err := s.migrations()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("-- outbox schema, generated by `outbox migrate sql`.\n")
	b.WriteString(s.d.Migrations.ScriptBegin)
	b.WriteString(s.ensureTableSQL() + ";\n")
	for _, m := range all {
		fmt.Fprintf(&b, "\n-- %03d_%s\n", m.version, m.name)
		for _, stmt := range m.up {
			b.WriteString(stmt + ";\n")
		}
		fmt.Fprintf(&b, "%s;\n", s.sql(fmt.Sprintf(`INSERT INTO {{migrations}} (version, name, applied_at) VALUES (%d, '%s', {{now}})`, m.version, m.name)))
	}
	b.WriteString(s.d.Migrations.ScriptEnd)
	return b.String(), nil
}
