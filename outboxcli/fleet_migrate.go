package outboxcli

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"slices"
)

// fleetOutboxDB is one outbox of a config file's outboxes list, for the commands that
// work on the outbox's tables (migrate up).
type fleetOutboxDB struct {
	name string
	db   *dbFlags
	item outboxItem // the entry that named or found it
}

// fleetOutboxDBs resolves the config file's outboxes list for a command whose database
// flags are base: each entry's database-url, schema and prefix over base's, and the
// outboxes each rule finds, looked up on a connection of its own per database, closed
// after.
func fleetOutboxDBs(ctx context.Context, inv *invocation, base *dbFlags) ([]fleetOutboxDB, error) {
	cf := inv.config
	var out []fleetOutboxDB
	seen := map[string]bool{}
	add := func(name string, db *dbFlags, item outboxItem) {
		key, def := outboxKey(db)
		if !seen[key] {
			seen[key] = true
			out = append(out, fleetOutboxDB{name: cmp.Or(name, def), db: db, item: item})
		}
	}
	for _, item := range cf.outboxes {
		db := *base
		for key, field := range map[string]*string{"database-url": &db.url, "schema": &db.schema, "prefix": &db.prefix} {
			if v, ok := item.values[key]; ok {
				*field = v.values[0]
			}
		}
		inv.secrets.addDSN(db.url)
		if _, err := db.target("outbox migrate"); err != nil {
			return nil, usageErrorf("%s: %v", cf.at(item.line), err)
		}
		var name string
		if v, ok := item.values["name"]; ok {
			name = v.values[0]
		}
		r := ruleOf(item)
		if !r.isRule() {
			add(name, &db, item)
			continue
		}
		if kind, _ := db.kind(); kind != dbPostgres {
			return nil, usageErrorf("%s: %s: %s has no schemas or databases to look through; list its outboxes one by one", cf.at(item.line), r, kind)
		}
		found, err := r.find(ctx, &db, func(d *dbFlags) (querier, func(), error) { return connectOnce(ctx, d) })
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", cf.at(item.line), r, err)
		}
		for _, fd := range found {
			if fd.err != nil {
				return nil, fmt.Errorf("%s: %s: look for outboxes in %s: %w", cf.at(item.line), r, redactDSN(fd.db.url), fd.err)
			}
			for _, d := range fd.in {
				add("", d, item)
			}
		}
	}
	return out, nil
}

// usesOutboxList says whether a command works on every outbox of the config file's
// outboxes list: there is one, and fs's --outbox, --database-url, --schema and --prefix
// were not given on the command line.
func usesOutboxList(inv *invocation, fs *flag.FlagSet) bool {
	if inv.config == nil || inv.config.outboxes == nil {
		return false
	}
	if f := fs.Lookup("outbox"); f != nil && f.Value.String() != "" {
		return false
	}
	given := false
	fs.Visit(func(f *flag.Flag) {
		given = given || f.Name == "database-url" || f.Name == "schema" || f.Name == "prefix"
	})
	return !given
}

// selectOutbox sets fs's flags to the outbox of the config file's outboxes list named
// name (--outbox): its database, schema and prefix, and the entry's other keys that fs
// has a flag for (the relay's settings), over every other source.
func selectOutbox(ctx context.Context, inv *invocation, fs *flag.FlagSet, name string) error {
	if inv.config == nil || inv.config.outboxes == nil {
		return usageErrorf("--outbox: names an outbox of a config file's outboxes list, and there is none (--config)")
	}
	value := func(flag string) string {
		if f := fs.Lookup(flag); f != nil {
			return f.Value.String()
		}
		return ""
	}
	base := &dbFlags{url: value("database-url"), schema: value("schema"), prefix: value("prefix")}
	targets, err := fleetOutboxDBs(ctx, inv, base)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(targets, func(t fleetOutboxDB) bool { return t.name == name })
	if i < 0 {
		names := make([]string, len(targets))
		for i, t := range targets {
			names[i] = t.name
		}
		return usageErrorf("--outbox: no outbox %q in the config file's outboxes list (%s)", name, firstNames(names, 5))
	}
	t := targets[i]
	set := map[string]string{"database-url": t.db.url, "schema": t.db.schema, "prefix": t.db.prefix}
	for k, e := range t.item.values {
		if _, ok := set[k]; !ok && k != "name" && k != "schemas" && k != "databases" {
			set[k] = e.values[0]
		}
	}
	for _, k := range sortedKeys(set) {
		if fs.Lookup(k) == nil {
			continue
		}
		if err := fs.Set(k, set[k]); err != nil {
			return usageErrorf("%s: --%s: %v", inv.config.at(t.item.line), k, err)
		}
	}
	return nil
}

// migrateFleet is `migrate up` on every outbox of the config file's outboxes list, one
// after the other, going on past a failure: each outbox's migrations are applied once,
// so running it again after a failure migrates what is left.
func migrateFleet(ctx context.Context, inv *invocation, base *dbFlags, to int) error {
	conns := newDBConns(ctx, "outbox migrate")
	defer conns.close()
	targets, err := fleetOutboxDBs(ctx, inv, base)
	if err != nil {
		return err
	}
	var failed []string
	for i, t := range targets {
		head := fmt.Sprintf("[%d/%d] %s", i+1, len(targets), t.name)
		applied, names, err := func() ([]int, map[int]string, error) {
			drv, err := conns.driver(t.db)
			if err != nil {
				return nil, nil, err
			}
			applied, err := drv.MigrateUp(ctx, to)
			if err != nil {
				return nil, nil, err
			}
			return applied, migrationNames(ctx, drv), nil
		}()
		switch {
		case err != nil:
			failed = append(failed, t.name)
			fmt.Fprintf(inv.stdout, "%s: failed: %v\n", head, err)
		case len(applied) == 0:
			fmt.Fprintf(inv.stdout, "%s: up to date\n", head)
		default:
			for _, v := range applied {
				fmt.Fprintf(inv.stdout, "%s: applied %03d_%s\n", head, v, names[v])
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("migrate up: %d of %d outboxes failed (%s; the reasons are above): run it again once fixed, which migrates only what is left",
			len(failed), len(targets), firstNames(failed, 5))
	}
	return nil
}

// dbConns are the connections of a command working on many outboxes: one per database
// URL, opened on first use. It is not safe for concurrent use.
type dbConns struct {
	ctx context.Context
	app string
	m   map[string]*openedStore
}

func newDBConns(ctx context.Context, app string) *dbConns {
	return &dbConns{ctx: ctx, app: app, m: map[string]*openedStore{}}
}

// open returns the connection to db's database.
func (c *dbConns) open(db *dbFlags) (*openedStore, error) {
	if st, ok := c.m[db.url]; ok {
		return st, nil
	}
	st, err := db.open(c.ctx, c.app)
	if err != nil {
		return nil, err
	}
	c.m[db.url] = st
	return st, nil
}

// driver returns db's outbox on the connection to its database.
func (c *dbConns) driver(db *dbFlags) (storeDriver, error) {
	st, err := c.open(db)
	if err != nil {
		return nil, err
	}
	return db.newDriver(st.kind, st.pool, st.db)
}

func (c *dbConns) close() {
	for _, st := range c.m {
		st.close()
	}
}

// firstNames lists up to n names, and how many more.
func firstNames(names []string, n int) string {
	if len(names) <= n {
		return fmt.Sprint(names)
	}
	return fmt.Sprintf("%v and %d more", names[:n], len(names)-n)
}
