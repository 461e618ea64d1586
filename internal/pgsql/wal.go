package pgsql

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
)

// This file prepares PostgreSQL for WAL mode (docs/design-wal.md, §7): what `outbox wal
// setup` checks and creates (a publication of the outbox's inserts, a logical replication
// slot, the slot's row in outbox_wal from migration 5), what `outbox wal status` reads,
// and what `outbox wal drop` removes. Every step is idempotent, so a setup or drop that
// stopped half-way is finished by running it again, and each step is also available as
// the SQL it runs, for a dry run or a DBA.
//
// Slots and publications are named by validated identifiers ([a-z_][a-z0-9_]*, as the
// schema and prefix are): the statements carry them as quoted identifiers or string
// literals, so what a dry run prints is exactly what runs.

const (
	// WALSlotDefault and WALPublicationDefault are the names of the slot and publication
	// of an outbox in the public schema without a prefix; WALDefaults adds the rest.
	WALSlotDefault        = "outbox_wal"
	WALPublicationDefault = "outbox_pub"
	// WALSlotTimeoutDefault bounds how long creating the slot waits for the transactions
	// open when it starts: a logical slot is consistent only once they all ended.
	WALSlotTimeoutDefault = 30 * time.Second

	walMinVersion      = 140000 // PostgreSQL 14
	walFailoverVersion = 170000 // failover slots: PostgreSQL 17
	// walLockTimeout bounds the wait of ALTER TABLE ... DISABLE/ENABLE TRIGGER for the
	// outbox's lock, which writers hold until they commit, and which writers queue
	// behind while it waits.
	walLockTimeout = "2s"
	// walTerminateWaitMS is how long drop --force waits for a terminated walsender to exit.
	walTerminateWaitMS = 5000
)

// walTable is the quoted, qualified name of WAL mode's bookkeeping table (migration 5).
func (n *Names) walTable() string { return n.Table("outbox_wal") }

// outboxDisplay is the outbox table as messages show it: schema.name, unquoted (both are
// plain identifiers).
func (n *Names) outboxDisplay() string { return n.schema + "." + n.prefix + "outbox" }

// WALDefaults returns the default slot and publication names of this outbox:
// WALSlotDefault and WALPublicationDefault with the prefix in front, and the schema too
// when it is not public ("billing" and "app_" give billing_app_outbox_wal). A slot's name
// is unique in the whole PostgreSQL cluster and a publication's in its database, so two
// outboxes must not share them.
func (n *Names) WALDefaults() (slot, publication string) {
	p := n.prefix
	if n.schema != "public" {
		p = n.schema + "_" + p
	}
	return p + WALSlotDefault, p + WALPublicationDefault
}

// WALSlot returns slot, or this outbox's default slot (WALDefaults) when slot is empty.
func (n *Names) WALSlot(slot string) string {
	if slot != "" {
		return slot
	}
	slot, _ = n.WALDefaults()
	return slot
}

// CheckWALName rejects a slot or publication name that is not a plain lower-case
// identifier of at most 63 bytes; field names it in the *outbox.ConfigError. PostgreSQL
// itself allows only [a-z0-9_] in slot names, and longer names would be truncated.
func CheckWALName(field, name string) error {
	if !identRE.MatchString(name) || len(name) > 63 {
		return &outbox.ConfigError{Field: field, Reason: fmt.Sprintf("%q must match [a-z_][a-z0-9_]* and be at most 63 bytes", name)}
	}
	return nil
}

// WALCheckError is WALSetup's and WALDrop's error when the server, the role or what
// exists already does not allow them. Nothing was changed. Each problem is one sentence
// that says what is wrong and what to do.
type WALCheckError struct {
	Problems []string
}

func (e *WALCheckError) Error() string {
	if len(e.Problems) == 1 {
		return e.Problems[0]
	}
	return fmt.Sprintf("%d problems, nothing was changed:\n  - %s", len(e.Problems), strings.Join(e.Problems, "\n  - "))
}

// WALSlotActiveError is WALDrop's error, without Force, when a process streams from the
// slot (PostgreSQL refuses to drop an active slot). Nothing was changed.
type WALSlotActiveError struct {
	Slot string
	PID  int
}

func (e *WALSlotActiveError) Error() string {
	return fmt.Sprintf("replication slot %q is in use by PID %d (a relay streaming from it): stop the relays in WAL mode first, "+
		"or pass --force to terminate it (relays then poll, and nothing is lost). Nothing was changed", e.Slot, e.PID)
}

// WALStep is one step of a setup or drop: what it does, in words, and the SQL it runs
// (several statements between BEGIN and COMMIT when they run in one transaction).
type WALStep struct {
	Do  string `json:"do"`
	SQL string `json:"sql"`
}

// walStep is a WALStep and how to run it.
type walStep struct {
	WALStep
	run func(ctx context.Context) error
}

// newStep makes the step of stmts: one runs alone, several in one transaction.
func newStep(inTx InTx, do string, stmts ...string) walStep {
	sql := stmts[0] + ";"
	if len(stmts) > 1 {
		sql = "BEGIN;\n" + strings.Join(stmts, ";\n") + ";\nCOMMIT;"
	}
	return walStep{WALStep: WALStep{Do: do, SQL: sql}, run: func(ctx context.Context) error {
		return inTx(ctx, func(q Querier) error {
			for _, s := range stmts {
				if err := q.Exec(ctx, s); err != nil {
					return err
				}
			}
			return nil
		})
	}}
}

// walFacts is what setup, status and drop decide on: the server, the role, and what of
// WAL mode exists already. It is read without locks; the steps cope with a concurrent
// setup or drop.
type walFacts struct {
	walLevel, versionText   string
	version                 int
	super, replication      bool
	user, userIdent, dbName string
	table                   bool   // the outbox table exists
	owner                   string // the outbox table's owner
	ownsTable, createOnDB   bool
	maxSlots, usedSlots     int
	triggerOn               bool // the NOTIFY trigger exists and is enabled
	walTable                bool // migration 5 is applied
	keepSize                string
	systemID                string

	slot walSlotFacts
	pub  walPubFacts
	row  *WALSetupRow
}

type walSlotFacts struct {
	exists, logical, active bool
	pid                     int
	plugin, database        string
	walStatus               string
}

type walPubFacts struct {
	exists, owned                            bool
	allTables, ins, upd, del, trunc, viaRoot bool
	tables                                   string // schema.table, ...
	filtered                                 bool   // a row filter or column list (PostgreSQL 15)
}

// WALSetupRow is a slot's row in outbox_wal: what setup recorded, and the slot lease
// of the relay that reads it.
type WALSetupRow struct {
	Publication string `json:"publication"`
	// Owner is the relay holding the slot lease, "" for none; LeaseLeft is how long its
	// lease has left, in database time, 0 when expired.
	Owner     string        `json:"owner,omitempty"`
	Token     int64         `json:"token"`
	LeaseLeft time.Duration `json:"lease_left"`
	// State is starting, streaming or fallback (relays poll), with its reason and since when.
	State       string    `json:"state"`
	StateReason string    `json:"state_reason,omitempty"`
	StateAt     time.Time `json:"state_at"`
	// CreatedLSN is the slot's position when setup recorded it; CreatedSeq the outbox
	// sequence's value then (rows at or below it may predate the slot, and reach relays by
	// their catch-up fetch); SystemID the cluster's system identifier then, and
	// SameSystem whether this server still has it (false after a failover to a server
	// without the slot).
	CreatedLSN     string `json:"created_lsn"`
	CreatedSeq     int64  `json:"created_seq"`
	SystemID       string `json:"system_id"`
	SameSystem     bool   `json:"same_system"`
	NotifyDisabled bool   `json:"notify_disabled"` // setup disabled the NOTIFY trigger; drop enables it again
}

// walFacts reads the facts about slot and pub. A server older than walMinVersion has
// only the first query's facts: the others use newer catalog columns.
func (n *Names) walFacts(ctx context.Context, inTx InTx, slot, pub string) (*walFacts, error) {
	f := &walFacts{}
	err := inTx(ctx, func(q Querier) error {
		err := q.QueryRow(ctx, `SELECT current_setting('wal_level'), current_setting('server_version_num')::int, current_setting('server_version'),
       r.rolsuper, r.rolreplication, current_user::text, quote_ident(current_user), current_database()::text
FROM pg_catalog.pg_roles r WHERE r.rolname = current_user`, nil,
			&f.walLevel, &f.version, &f.versionText, &f.super, &f.replication, &f.user, &f.userIdent, &f.dbName)
		if err != nil || f.version < walMinVersion {
			return err
		}
		err = q.QueryRow(ctx, `SELECT c.oid IS NOT NULL, coalesce(pg_catalog.pg_get_userbyid(c.relowner)::text, ''),
       coalesce(pg_catalog.pg_has_role(c.relowner, 'USAGE'), false), has_database_privilege(current_database(), 'CREATE'),
       current_setting('max_replication_slots')::int, (SELECT count(*)::int FROM pg_catalog.pg_replication_slots),
       coalesce((SELECT t.tgenabled <> 'D' FROM pg_catalog.pg_trigger t WHERE t.tgrelid = c.oid AND t.tgname::text = $2), false),
       to_regclass($3) IS NOT NULL, current_setting('max_slot_wal_keep_size'),
       coalesce((SELECT system_identifier::text FROM pg_catalog.pg_control_system()), '')
FROM (SELECT to_regclass($1) AS oid) o LEFT JOIN pg_catalog.pg_class c ON c.oid = o.oid`,
			[]any{n.Outbox, n.prefix + "outbox_notify", n.walTable()},
			&f.table, &f.owner, &f.ownsTable, &f.createOnDB, &f.maxSlots, &f.usedSlots, &f.triggerOn, &f.walTable, &f.keepSize, &f.systemID)
		if err != nil {
			return err
		}
		s := &f.slot
		err = q.QueryRow(ctx, `SELECT slot_type = 'logical', coalesce(plugin::text, ''), coalesce(database::text, ''), active,
       coalesce(active_pid, 0), coalesce(wal_status, '')
FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, []any{slot},
			&s.logical, &s.plugin, &s.database, &s.active, &s.pid, &s.walStatus)
		switch {
		case errors.Is(err, ErrNoRows):
		case err != nil:
			return err
		default:
			s.exists = true
		}
		p := &f.pub
		filtered := "false"
		if f.version >= 150000 {
			filtered = `EXISTS (SELECT 1 FROM pg_catalog.pg_publication_rel pr WHERE pr.prpubid = p.oid AND (pr.prqual IS NOT NULL OR pr.prattrs IS NOT NULL))`
		}
		err = q.QueryRow(ctx, `SELECT pg_catalog.pg_has_role(p.pubowner, 'USAGE'), p.puballtables, p.pubinsert, p.pubupdate, p.pubdelete,
       p.pubtruncate, p.pubviaroot,
       coalesce((SELECT string_agg(format('%I.%I', t.schemaname, t.tablename), ', ' ORDER BY t.schemaname, t.tablename)
                 FROM pg_catalog.pg_publication_tables t WHERE t.pubname = p.pubname), ''),
       `+filtered+`
FROM pg_catalog.pg_publication p WHERE p.pubname = $1`, []any{pub},
			&p.owned, &p.allTables, &p.ins, &p.upd, &p.del, &p.trunc, &p.viaRoot, &p.tables, &p.filtered)
		switch {
		case errors.Is(err, ErrNoRows):
		case err != nil:
			return err
		default:
			p.exists = true
		}
		if !f.walTable {
			return nil
		}
		r := &WALSetupRow{}
		var leftMS int64
		err = q.QueryRow(ctx, `SELECT publication, coalesce(owner, ''), token,
       CASE WHEN expires_at > now() THEN (extract(epoch FROM expires_at - now()) * 1000)::bigint ELSE 0 END,
       state, state_reason, state_at, created_lsn::text, created_seq, system_id, notify_disabled
FROM `+n.walTable()+` WHERE slot_name = $1`, []any{slot},
			&r.Publication, &r.Owner, &r.Token, &leftMS, &r.State, &r.StateReason, &r.StateAt, &r.CreatedLSN, &r.CreatedSeq, &r.SystemID, &r.NotifyDisabled)
		switch {
		case errors.Is(err, ErrNoRows):
		case err != nil:
			return err
		default:
			r.LeaseLeft = time.Duration(leftMS) * time.Millisecond
			r.SameSystem = r.SystemID == f.systemID
			f.row = r
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the server's settings and WAL mode's objects: %w", err)
	}
	return f, nil
}

// createPublicationSQL is the statement that makes the publication WAL mode reads:
// inserts only (a relay learns of new rows; deletes and retries are its own doing), named
// by the root table, so that rows in any bucket of the pending ring arrive as rows of the
// outbox.
func (n *Names) createPublicationSQL(pub string) string {
	return "CREATE PUBLICATION " + quote(pub) + " FOR TABLE " + n.Outbox + " WITH (publish = 'insert', publish_via_partition_root = true)"
}

// pubMismatch says how an existing publication differs from the one WAL mode needs, or
// "" when it fits.
func (n *Names) pubMismatch(p walPubFacts) string {
	var why []string
	if p.allTables {
		why = append(why, "it is FOR ALL TABLES")
	} else if want := n.schema + "." + n.prefix + "outbox"; p.tables != want {
		tables := p.tables
		if tables == "" {
			tables = "no table"
		}
		why = append(why, fmt.Sprintf("it publishes %s, not only %s", tables, want))
	}
	var ops []string
	for _, op := range []struct {
		on   bool
		name string
	}{{p.ins, "insert"}, {p.upd, "update"}, {p.del, "delete"}, {p.trunc, "truncate"}} {
		if op.on {
			ops = append(ops, op.name)
		}
	}
	if got := strings.Join(ops, ", "); got != "insert" {
		why = append(why, fmt.Sprintf("it publishes %q, not \"insert\" only", got))
	}
	if !p.viaRoot {
		why = append(why, "publish_via_partition_root is false")
	}
	if p.filtered {
		why = append(why, "it has a row filter or column list")
	}
	return strings.Join(why, "; ")
}

// slotMismatch says why an existing slot is not one WAL mode can read, or "".
func (f *walFacts) slotMismatch() string {
	switch s := f.slot; {
	case !s.logical:
		return "it is a physical slot"
	case s.plugin != "pgoutput":
		return fmt.Sprintf("it decodes with %q, not pgoutput", s.plugin)
	case s.database != f.dbName:
		return fmt.Sprintf("it belongs to database %q", s.database)
	}
	return ""
}

// walLevelProblem is the message for a server whose wal_level is not logical.
func walLevelProblem(level string) string {
	return fmt.Sprintf(`wal_level is %q; WAL mode needs "logical": ALTER SYSTEM SET wal_level = logical and restart PostgreSQL `+
		`(a reload is not enough). Relays with --source wal poll until then`, level)
}

// WALSetupOptions are WALSetup's settings.
type WALSetupOptions struct {
	// Slot and Publication name the replication slot and the publication; both must pass
	// CheckWALName. WALDefaults gives the usual ones.
	Slot, Publication string
	// KeepNotify leaves the NOTIFY trigger on. By default setup disables it, since relays
	// in WAL mode learn of new rows from the stream, and NOTIFY takes a lock global to the
	// cluster at every writer's commit. With KeepNotify, a trigger that an earlier setup
	// disabled is enabled again.
	KeepNotify bool
	// Failover makes the slot a failover slot, synchronized to standbys (PostgreSQL 17).
	Failover bool
	// SlotTimeout bounds how long creating the slot waits for the transactions open when
	// it starts. Defaults to WALSlotTimeoutDefault.
	SlotTimeout time.Duration
	// DryRun checks and plans, and changes nothing: the result's Steps are what setup
	// would run, and the error what would stop it.
	DryRun bool
}

// WALSetupResult is what WALSetup did, or with DryRun would do.
type WALSetupResult struct {
	Slot        string    `json:"slot"`
	Publication string    `json:"publication"`
	Steps       []WALStep `json:"steps"` // empty when everything was in place
	DryRun      bool      `json:"dry_run,omitempty"`
	// Setup is the slot's row in outbox_wal afterwards (nil on a dry run that would create it).
	Setup *WALSetupRow `json:"setup,omitempty"`
}

// setupProblems lists what stops setup with o, each as the sentence to show.
func (n *Names) setupProblems(f *walFacts, o WALSetupOptions) []string {
	if f.version < walMinVersion {
		return []string{fmt.Sprintf("WAL mode needs PostgreSQL 14 or later; this server runs %s", f.versionText)}
	}
	var out []string
	if f.walLevel != "logical" {
		out = append(out, walLevelProblem(f.walLevel))
	}
	if !f.super && !f.replication {
		out = append(out, fmt.Sprintf("role %q lacks the REPLICATION attribute: ALTER ROLE %s REPLICATION", f.user, f.userIdent))
	}
	if !f.table {
		return append(out, fmt.Sprintf("the outbox table %s does not exist: run 'outbox migrate up' with the same --schema and --prefix", n.outboxDisplay()))
	}
	if !f.walTable {
		out = append(out, fmt.Sprintf("the outbox in schema %q lacks schema version 5 (005_wal), which records WAL mode's slot: run 'outbox migrate up'", n.schema))
	}
	if o.Failover && f.version < walFailoverVersion {
		out = append(out, fmt.Sprintf("--failover needs PostgreSQL 17 or later (failover slots); this server runs %s", f.versionText))
	}
	if f.slot.exists {
		if why := f.slotMismatch(); why != "" {
			out = append(out, fmt.Sprintf("replication slot %q exists but is not one WAL mode can read: %s. Pass another --slot", o.Slot, why))
		} else if f.slot.walStatus == "lost" {
			out = append(out, fmt.Sprintf("replication slot %q is lost (PostgreSQL removed WAL it needed, beyond max_slot_wal_keep_size): "+
				"run 'outbox wal drop', then setup again (relays poll meanwhile; nothing is lost)", o.Slot))
		}
	} else if f.usedSlots >= f.maxSlots {
		out = append(out, fmt.Sprintf("no free replication slot (max_replication_slots = %d): drop an unused one "+
			"(SELECT slot_name, active FROM pg_replication_slots) or raise max_replication_slots, which needs a restart", f.maxSlots))
	}
	if f.pub.exists {
		if why := n.pubMismatch(f.pub); why != "" {
			out = append(out, fmt.Sprintf("publication %q exists but does not fit WAL mode: %s. Pass another --publication, or drop it "+
				"if nothing else uses it (DROP PUBLICATION %s) and run setup again", o.Publication, why, quote(o.Publication)))
		}
	}
	if f.row != nil && f.row.Publication != o.Publication {
		out = append(out, fmt.Sprintf("replication slot %q was set up with publication %q: pass --publication %s, or 'outbox wal drop' it first",
			o.Slot, f.row.Publication, f.row.Publication))
	}
	ownerNeeded := false
	if !f.pub.exists && (!f.ownsTable || !f.createOnDB) {
		var needs []string
		if !f.ownsTable {
			needs = append(needs, fmt.Sprintf("ownership of %s (owner %q)", n.outboxDisplay(), f.owner))
		}
		if !f.createOnDB {
			needs = append(needs, fmt.Sprintf("CREATE on database %q", f.dbName))
		}
		who := fmt.Sprintf("%q", f.owner)
		if f.ownsTable {
			who = fmt.Sprintf("a role with CREATE on database %q", f.dbName)
		}
		out = append(out, fmt.Sprintf("creating publication %q needs %s: run setup as %s, or have it run: %s",
			o.Publication, strings.Join(needs, " and "), who, n.createPublicationSQL(o.Publication)))
		ownerNeeded = !f.ownsTable
	}
	changesTrigger := (!o.KeepNotify && f.triggerOn) || (o.KeepNotify && !f.triggerOn && f.row != nil && f.row.NotifyDisabled)
	if changesTrigger && !f.ownsTable && !ownerNeeded {
		verb, advice := "disabling", ", or pass --keep-notify"
		if o.KeepNotify {
			verb, advice = "enabling", ""
		}
		out = append(out, fmt.Sprintf("%s the NOTIFY trigger %q needs ownership of %s (owner %q): run setup as %q%s",
			verb, n.prefix+"outbox_notify", n.outboxDisplay(), f.owner, f.owner, advice))
	}
	return out
}

// WALSetup prepares the database for WAL mode: it checks the server and the role, then
// creates what is missing, in this order: the publication, the slot, the slot's row in
// outbox_wal, and (unless KeepNotify) disables the NOTIFY trigger. Anything already in
// place is checked and kept, so running it twice is safe, and running it again finishes
// a setup that stopped half-way. A failed check returns a *WALCheckError before anything
// is created.
//
// The slot retains WAL from the moment it exists until a relay confirms positions: set
// max_slot_wal_keep_size, and drop the slot when no relay will read it.
func (n *Names) WALSetup(ctx context.Context, inTx InTx, o WALSetupOptions) (WALSetupResult, error) {
	res := WALSetupResult{Slot: o.Slot, Publication: o.Publication, DryRun: o.DryRun, Steps: []WALStep{}}
	if err := CheckWALName("Slot", o.Slot); err != nil {
		return res, err
	}
	if err := CheckWALName("Publication", o.Publication); err != nil {
		return res, err
	}
	if o.SlotTimeout < 0 {
		return res, &outbox.ConfigError{Field: "SlotTimeout", Reason: fmt.Sprintf("%s is negative", o.SlotTimeout)}
	}
	timeout := o.SlotTimeout
	if timeout == 0 {
		timeout = WALSlotTimeoutDefault
	}
	f, err := n.walFacts(ctx, inTx, o.Slot, o.Publication)
	if err != nil {
		return res, err
	}
	problems := n.setupProblems(f, o)

	var steps []walStep
	if !f.pub.exists {
		sql := n.createPublicationSQL(o.Publication)
		s := newStep(inTx, fmt.Sprintf("create publication %q of the inserts into %s", o.Publication, n.outboxDisplay()), sql)
		s.run = func(ctx context.Context) error {
			err := inTx(ctx, func(q Querier) error { return q.Exec(ctx, sql) })
			if SQLState(err) == "42710" { // duplicate_object: a concurrent setup made it
				return n.recheckPublication(ctx, inTx, o.Publication)
			}
			return err
		}
		steps = append(steps, s)
	}
	if !f.slot.exists {
		steps = append(steps, n.createSlotStep(inTx, o, timeout))
	}
	if f.row == nil || !f.slot.exists {
		steps = append(steps, newStep(inTx, fmt.Sprintf("record slot %q in %s", o.Slot, n.walTable()), n.recordSlotSQL(o.Slot, o.Publication)))
	}
	switch {
	case !o.KeepNotify && f.triggerOn:
		steps = append(steps, n.triggerStep(inTx, o.Slot, false))
	case o.KeepNotify && !f.triggerOn && f.row != nil && f.row.NotifyDisabled:
		steps = append(steps, n.triggerStep(inTx, o.Slot, true))
	}
	for _, s := range steps {
		res.Steps = append(res.Steps, s.WALStep)
	}
	if len(problems) > 0 {
		return res, &WALCheckError{Problems: problems}
	}
	if o.DryRun {
		res.Setup = f.row
		return res, nil
	}
	for _, s := range steps {
		if err := s.run(ctx); err != nil {
			return res, fmt.Errorf("%s: %w", s.Do, err)
		}
	}
	after, err := n.walFacts(ctx, inTx, o.Slot, o.Publication)
	if err != nil {
		return res, err
	}
	res.Setup = after.row
	return res, nil
}

// recheckPublication checks a publication that a concurrent setup created.
func (n *Names) recheckPublication(ctx context.Context, inTx InTx, pub string) error {
	f, err := n.walFacts(ctx, inTx, "", pub)
	if err != nil {
		return err
	}
	if why := n.pubMismatch(f.pub); why != "" {
		return fmt.Errorf("publication %q appeared meanwhile and does not fit WAL mode: %s", pub, why)
	}
	return nil
}

// createSlotStep creates the slot under a statement_timeout: creating a logical slot
// waits until every transaction open when it started has ended, and a session left
// idle in a transaction would hold it up for good.
func (n *Names) createSlotStep(inTx InTx, o WALSetupOptions, timeout time.Duration) walStep {
	create := "SELECT lsn::text FROM pg_create_logical_replication_slot(" + literal(o.Slot) + ", 'pgoutput')"
	if o.Failover {
		create = "SELECT lsn::text FROM pg_create_logical_replication_slot(" + literal(o.Slot) + ", 'pgoutput', false, false, true)"
	}
	set := "SET LOCAL statement_timeout = '" + pgDuration(timeout) + "'"
	s := newStep(inTx, fmt.Sprintf("create logical replication slot %q (pgoutput)", o.Slot), set, create)
	s.run = func(ctx context.Context) error {
		err := inTx(ctx, func(q Querier) error {
			if err := q.Exec(ctx, set); err != nil {
				return err
			}
			var lsn string
			return q.QueryRow(ctx, create, nil, &lsn)
		})
		switch SQLState(err) {
		case "57014": // query_canceled: the statement_timeout
			return n.slotWaitError(ctx, inTx, o.Slot, timeout, err)
		case "42710": // duplicate_object: a concurrent setup made it
			f, ferr := n.walFacts(ctx, inTx, o.Slot, "")
			if ferr != nil {
				return ferr
			}
			if why := f.slotMismatch(); why != "" {
				return fmt.Errorf("replication slot %q appeared meanwhile and is not one WAL mode can read: %s", o.Slot, why)
			}
			return nil
		}
		return err
	}
	return s
}

// slotWaitError names the oldest transaction that kept the slot's creation waiting.
// Without pg_read_all_stats a role sees only its own sessions' transactions.
func (n *Names) slotWaitError(ctx context.Context, inTx InTx, slot string, timeout time.Duration, cause error) error {
	var (
		pid        int
		user, app  string
		ageSeconds float64
	)
	err := inTx(ctx, func(q Querier) error {
		return q.QueryRow(ctx, `SELECT pid, coalesce(usename::text, ''), coalesce(application_name, ''),
       extract(epoch FROM now() - xact_start)::float8
FROM pg_catalog.pg_stat_activity
WHERE backend_xid IS NOT NULL AND xact_start IS NOT NULL AND pid <> pg_backend_pid()
ORDER BY xact_start LIMIT 1`, nil, &pid, &user, &app, &ageSeconds)
	})
	base := fmt.Sprintf("creating replication slot %q waited %s for the transactions open when it started to end", slot, timeout)
	switch {
	case errors.Is(err, ErrNoRows):
		return fmt.Errorf("%s; no open transaction is visible to this role now (a superuser or pg_read_all_stats sees all: "+
			"SELECT pid, usename, xact_start FROM pg_stat_activity WHERE backend_xid IS NOT NULL ORDER BY xact_start; "+
			"prepared transactions are in pg_prepared_xacts): run setup again: %w", base, cause)
	case err != nil:
		return fmt.Errorf("%s (%w); finding the oldest open transaction failed too: %v", base, cause, err)
	}
	age := time.Duration(ageSeconds * float64(time.Second)).Round(time.Second)
	return fmt.Errorf("%s; the oldest open transaction is PID %d (user %q, application %q), open for %s: "+
		"end it (SELECT pg_terminate_backend(%d)) or wait for it, then run setup again: %w", base, pid, user, app, age, pid, cause)
}

// WALRecreateSlot makes slot anew for the relay relayID that reads it under token (WAL
// mode, docs/design-wal.md §5): when the slot is missing (dropped by hand, a failover
// to a server without it) it is created; when it was invalidated (wal_status lost: it
// held more WAL than max_slot_wal_keep_size allows) it is dropped, then created. A slot
// that exists and is not lost is left as it is (another relay made it meanwhile).
// Creating waits, up to timeout, for the transactions open when it starts. The slot's
// row in outbox_wal keeps its lease and gets the new slot's position, as setup records
// it. created says a slot was made.
//
// Nothing is lost by it: the slot never holds the only copy of a message, every pending
// one is still in the outbox, and the reader's catch-up fetch reads them all.
func (n *Names) WALRecreateSlot(ctx context.Context, inTx InTx, slot, relayID string, token int64, timeout time.Duration) (created bool, err error) {
	if err := CheckWALName("Slot", slot); err != nil {
		return false, err
	}
	var pub string
	err = inTx(ctx, func(q Querier) error {
		return q.QueryRow(ctx, `SELECT publication FROM `+n.walTable()+` WHERE slot_name = $1 AND owner = $2 AND token = $3`,
			[]any{slot, relayID, token}, &pub)
	})
	if errors.Is(err, ErrNoRows) {
		return false, outboxdriver.ErrNotSlotReader
	}
	if err != nil {
		return false, err
	}
	var status string
	err = inTx(ctx, func(q Querier) error {
		return q.QueryRow(ctx, `SELECT coalesce(wal_status, 'lost') FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, []any{slot}, &status)
	})
	switch {
	case errors.Is(err, ErrNoRows):
	case err != nil:
		return false, err
	case status != "lost":
		return false, nil
	default:
		if err := n.dropSlotStep(inTx, slot, false).run(ctx); err != nil {
			return false, fmt.Errorf("drop lost replication slot %q: %w", slot, err)
		}
	}
	if err := n.createSlotStep(inTx, WALSetupOptions{Slot: slot}, timeout).run(ctx); err != nil {
		return false, fmt.Errorf("create replication slot %q: %w", slot, err)
	}
	if err := inTx(ctx, func(q Querier) error { return q.Exec(ctx, n.recordSlotSQL(slot, pub)) }); err != nil {
		return true, fmt.Errorf("record replication slot %q: %w", slot, err)
	}
	return true, nil
}

// recordSlotSQL records the slot in outbox_wal with where it is now, the outbox sequence's
// value and the cluster's identity, keeping the lease and state of an existing row.
func (n *Names) recordSlotSQL(slot, pub string) string {
	return `INSERT INTO ` + n.walTable() + ` (slot_name, publication, created_lsn, created_seq, system_id)
SELECT s.slot_name, ` + literal(pub) + `, s.confirmed_flush_lsn,
       coalesce(pg_sequence_last_value(pg_get_serial_sequence(` + n.TableLiteral("outbox") + `, 'seq')::regclass), 0),
       coalesce((SELECT system_identifier::text FROM pg_control_system()), '')
FROM pg_catalog.pg_replication_slots s WHERE s.slot_name = ` + literal(slot) + `
ON CONFLICT (slot_name) DO UPDATE SET publication = EXCLUDED.publication, created_lsn = EXCLUDED.created_lsn,
    created_seq = EXCLUDED.created_seq, system_id = EXCLUDED.system_id`
}

// triggerStep disables the NOTIFY trigger and records that setup did (enable: turns it
// back on and clears the record). ALTER TABLE waits for writers' commits, and writers
// queue behind it meanwhile: the lock_timeout keeps that short.
func (n *Names) triggerStep(inTx InTx, slot string, enable bool) walStep {
	verb, do := "DISABLE", "disable the NOTIFY trigger (relays in WAL mode learn of new rows from the stream)"
	if enable {
		verb, do = "ENABLE", "enable the NOTIFY trigger again (an earlier setup disabled it)"
	}
	s := newStep(inTx, do,
		"SET LOCAL lock_timeout = '"+walLockTimeout+"'",
		"ALTER TABLE "+n.Outbox+" "+verb+" TRIGGER "+n.Trigger,
		"UPDATE "+n.walTable()+" SET notify_disabled = "+strconv.FormatBool(!enable)+" WHERE slot_name = "+literal(slot))
	advice := ", or pass --keep-notify"
	if enable {
		advice = ""
	}
	run := s.run
	s.run = func(ctx context.Context) error {
		err := run(ctx)
		if SQLState(err) == "55P03" { // lock_not_available
			return fmt.Errorf("waited %s for writers holding %s and gave up rather than hold them up; run the command again "+
				"(the steps before are done)%s: %w", walLockTimeout, n.outboxDisplay(), advice, err)
		}
		return err
	}
	return s
}

// WALStatus is the state of WAL mode's slot, publication and bookkeeping.
type WALStatus struct {
	Slot        string `json:"slot"`
	Publication string `json:"publication"`
	WALLevel    string `json:"wal_level"`
	// Role is the connected role; Replication whether it may stream (REPLICATION or
	// superuser); OwnsTable whether it owns the outbox table.
	Role        string `json:"role"`
	Replication bool   `json:"replication"`
	OwnsTable   bool   `json:"owns_table"`

	SlotExists bool `json:"slot_exists"`
	// Active: a process streams from the slot (ActivePID).
	Active    bool `json:"active"`
	ActivePID int  `json:"active_pid,omitempty"`
	// WALStatus is PostgreSQL's: reserved, extended, unreserved or lost.
	WALStatus string `json:"wal_status,omitempty"`
	// SafeWALSizeBytes is how much more WAL may be written before the slot is lost (nil
	// when max_slot_wal_keep_size is -1, no limit); LagBytes how far the slot's confirmed
	// position is behind the server's WAL; RetainedBytes how much WAL the slot keeps.
	SafeWALSizeBytes   *int64 `json:"safe_wal_size_bytes,omitempty"`
	LagBytes           *int64 `json:"lag_bytes,omitempty"`
	RetainedBytes      *int64 `json:"retained_bytes,omitempty"`
	MaxSlotWALKeepSize string `json:"max_slot_wal_keep_size"`

	PublicationExists bool `json:"publication_exists"`
	// PublicationMismatch says how the publication differs from what WAL mode needs.
	PublicationMismatch string `json:"publication_mismatch,omitempty"`
	// TriggerEnabled: the NOTIFY trigger wakes relays at every insert.
	TriggerEnabled bool `json:"notify_trigger_enabled"`

	// Setup is the slot's row in outbox_wal, nil when setup has not recorded it.
	Setup *WALSetupRow `json:"setup,omitempty"`
	// Problems are what keeps relays from streaming: a missing or lost slot, a missing or
	// unfit publication, wal_level, relays in fallback. Empty when WAL mode can run.
	Problems []string `json:"problems"`
}

// walSlotStatusSQL is §6's slot query: the figures of the slot's metrics.
const walSlotStatusSQL = `SELECT s.active, coalesce(s.active_pid, 0), coalesce(s.wal_status, ''),
       s.safe_wal_size IS NOT NULL, coalesce(s.safe_wal_size, 0),
       s.confirmed_flush_lsn IS NOT NULL, coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint, 0),
       s.restart_lsn IS NOT NULL, coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint, 0)
FROM pg_catalog.pg_replication_slots s WHERE s.slot_name = $1`

// WALStatus reads the state of slot and publication. It changes nothing, and needs no
// privilege beyond reading the outbox's tables.
func (n *Names) WALStatus(ctx context.Context, inTx InTx, slot, publication string) (WALStatus, error) {
	st := WALStatus{Slot: slot, Publication: publication, Problems: []string{}}
	if err := CheckWALName("Slot", slot); err != nil {
		return st, err
	}
	if err := CheckWALName("Publication", publication); err != nil {
		return st, err
	}
	f, err := n.walFacts(ctx, inTx, slot, publication)
	if err != nil {
		return st, err
	}
	st.WALLevel, st.Role, st.Replication = f.walLevel, f.user, f.super || f.replication
	if f.version < walMinVersion {
		st.Problems = append(st.Problems, fmt.Sprintf("WAL mode needs PostgreSQL 14 or later; this server runs %s", f.versionText))
		return st, nil
	}
	st.OwnsTable, st.MaxSlotWALKeepSize, st.TriggerEnabled = f.ownsTable, f.keepSize, f.triggerOn
	st.SlotExists, st.PublicationExists, st.Setup = f.slot.exists, f.pub.exists, f.row
	if f.walLevel != "logical" {
		st.Problems = append(st.Problems, walLevelProblem(f.walLevel))
	}
	if !f.walTable {
		st.Problems = append(st.Problems, fmt.Sprintf("the outbox in schema %q lacks schema version 5 (005_wal): run 'outbox migrate up'", n.schema))
	}
	if f.slot.exists {
		var safeOK, lagOK, retainedOK bool
		var safe, lag, retained int64
		err := inTx(ctx, func(q Querier) error {
			return q.QueryRow(ctx, walSlotStatusSQL, []any{slot},
				&st.Active, &st.ActivePID, &st.WALStatus, &safeOK, &safe, &lagOK, &lag, &retainedOK, &retained)
		})
		switch {
		case errors.Is(err, ErrNoRows): // dropped meanwhile
			st.SlotExists = false
		case err != nil:
			return st, fmt.Errorf("read replication slot %q: %w", slot, err)
		}
		if safeOK {
			st.SafeWALSizeBytes = &safe
		}
		if lagOK {
			st.LagBytes = &lag
		}
		if retainedOK {
			st.RetainedBytes = &retained
		}
	}
	if !st.SlotExists && !f.pub.exists && f.row == nil {
		st.Problems = append(st.Problems, fmt.Sprintf("WAL mode is not set up (no replication slot %q, no publication %q): run 'outbox wal setup'", slot, publication))
		return st, nil
	}
	switch {
	case !st.SlotExists:
		st.Problems = append(st.Problems, fmt.Sprintf("replication slot %q does not exist: run 'outbox wal setup', which creates it", slot))
	case f.slotMismatch() != "":
		st.Problems = append(st.Problems, fmt.Sprintf("replication slot %q is not one WAL mode can read: %s", slot, f.slotMismatch()))
	case st.WALStatus == "lost":
		st.Problems = append(st.Problems, fmt.Sprintf("replication slot %q is lost (PostgreSQL removed WAL it needed, beyond max_slot_wal_keep_size): "+
			"relays poll; 'outbox wal drop' and setup again", slot))
	}
	switch {
	case !f.pub.exists:
		st.Problems = append(st.Problems, fmt.Sprintf("publication %q does not exist: run 'outbox wal setup'", publication))
	default:
		if st.PublicationMismatch = n.pubMismatch(f.pub); st.PublicationMismatch != "" {
			st.Problems = append(st.Problems, fmt.Sprintf("publication %q does not fit WAL mode: %s", publication, st.PublicationMismatch))
		}
	}
	switch r := f.row; {
	case !f.walTable:
	case r == nil:
		st.Problems = append(st.Problems, fmt.Sprintf("replication slot %q is not recorded in %s: run 'outbox wal setup'", slot, n.walTable()))
	case r.Publication != publication:
		st.Problems = append(st.Problems, fmt.Sprintf("replication slot %q was set up with publication %q, not %q", slot, r.Publication, publication))
	case r.State == "fallback":
		st.Problems = append(st.Problems, fmt.Sprintf("relays are in fallback (polling) since %s: %s", r.StateAt.UTC().Format(time.RFC3339), r.StateReason))
	case !r.SameSystem:
		st.Problems = append(st.Problems, fmt.Sprintf("replication slot %q was set up on another server (system %s, this one is %s): after a failover, "+
			"'outbox wal drop' and setup again", slot, r.SystemID, f.systemID))
	}
	return st, nil
}

// WALDropOptions are WALDrop's settings.
type WALDropOptions struct {
	// Slot and Publication name what to drop, as given to setup. The publication recorded
	// with the slot wins over Publication.
	Slot, Publication string
	// Force terminates the process streaming from the slot, instead of refusing.
	Force bool
	// DryRun changes nothing: the result's Steps are what drop would run.
	DryRun bool
}

// WALDropResult is what WALDrop did, or would do.
type WALDropResult struct {
	Slot        string    `json:"slot"`
	Publication string    `json:"publication"`
	Steps       []WALStep `json:"steps"` // empty when nothing was left to drop
	DryRun      bool      `json:"dry_run,omitempty"`
	// Terminated is the PID of the walsender that Force terminated.
	Terminated int `json:"terminated_pid,omitempty"`
}

// WALDrop undoes WALSetup: it drops the slot (refusing with *WALSlotActiveError while a
// process streams from it, unless Force terminates that process), drops the publication,
// deletes the slot's row and enables the NOTIFY trigger again if setup disabled it.
// Relays then poll; nothing is lost, since every pending message is still in the outbox
// table. What is already gone is skipped, so dropping twice is safe.
func (n *Names) WALDrop(ctx context.Context, inTx InTx, o WALDropOptions) (WALDropResult, error) {
	res := WALDropResult{Slot: o.Slot, Publication: o.Publication, DryRun: o.DryRun, Steps: []WALStep{}}
	if err := CheckWALName("Slot", o.Slot); err != nil {
		return res, err
	}
	if err := CheckWALName("Publication", o.Publication); err != nil {
		return res, err
	}
	f, err := n.walFacts(ctx, inTx, o.Slot, o.Publication)
	if err != nil {
		return res, err
	}
	if f.version < walMinVersion {
		return res, &WALCheckError{Problems: []string{fmt.Sprintf("WAL mode needs PostgreSQL 14 or later; this server runs %s: there is nothing to drop", f.versionText)}}
	}
	if f.row != nil && f.row.Publication != o.Publication {
		res.Publication = f.row.Publication
		if f, err = n.walFacts(ctx, inTx, o.Slot, res.Publication); err != nil {
			return res, err
		}
	}
	if f.slot.exists && f.slot.active && !o.Force {
		return res, &WALSlotActiveError{Slot: o.Slot, PID: f.slot.pid}
	}
	var problems []string
	if f.slot.exists && !f.super && !f.replication {
		problems = append(problems, fmt.Sprintf("role %q lacks the REPLICATION attribute, which dropping a slot needs: ALTER ROLE %s REPLICATION, or drop as a role that has it",
			f.user, f.userIdent))
	}
	// A publication is ours to drop if it is recorded with the slot, or publishes the
	// outbox table alone.
	dropPub := f.pub.exists && (f.row != nil || f.pub.tables == n.schema+"."+n.prefix+"outbox")
	if dropPub && !f.pub.owned {
		problems = append(problems, fmt.Sprintf("dropping publication %q needs its ownership: drop as its owner", res.Publication))
	}
	enable := f.row != nil && f.row.NotifyDisabled && f.table && !f.triggerOn
	if enable && !f.ownsTable {
		problems = append(problems, fmt.Sprintf("enabling the NOTIFY trigger %q again needs ownership of %s (owner %q): drop as %q",
			n.prefix+"outbox_notify", n.outboxDisplay(), f.owner, f.owner))
	}

	var steps []walStep
	// The slot's row goes first: a relay in WAL mode opens the stream only while the
	// slot is recorded, so once the row is gone a terminated reader does not take the
	// slot again before it is dropped.
	if f.row != nil {
		stmts := []string{"DELETE FROM " + n.walTable() + " WHERE slot_name = " + literal(o.Slot)}
		do := fmt.Sprintf("forget slot %q in %s", o.Slot, n.walTable())
		if enable {
			stmts = append([]string{"SET LOCAL lock_timeout = '" + walLockTimeout + "'", "ALTER TABLE " + n.Outbox + " ENABLE TRIGGER " + n.Trigger}, stmts...)
			do += ", and enable the NOTIFY trigger that setup disabled"
		}
		steps = append(steps, newStep(inTx, do, stmts...))
	}
	if f.slot.exists {
		if f.slot.active {
			res.Terminated = f.slot.pid
			steps = append(steps, newStep(inTx, fmt.Sprintf("terminate PID %d, which streams from the slot", f.slot.pid),
				fmt.Sprintf("SELECT pg_terminate_backend(%d, %d)", f.slot.pid, walTerminateWaitMS)))
		}
		steps = append(steps, n.dropSlotStep(inTx, o.Slot, o.Force))
	}
	if dropPub {
		steps = append(steps, newStep(inTx, fmt.Sprintf("drop publication %q", res.Publication), "DROP PUBLICATION IF EXISTS "+quote(res.Publication)))
	}
	for _, s := range steps {
		res.Steps = append(res.Steps, s.WALStep)
	}
	if len(problems) > 0 {
		return res, &WALCheckError{Problems: problems}
	}
	if o.DryRun {
		return res, nil
	}
	for _, s := range steps {
		if err := s.run(ctx); err != nil {
			return res, fmt.Errorf("%s: %w", s.Do, err)
		}
	}
	return res, nil
}

// dropSlotStep drops the slot. A relay may start streaming again between a terminate
// and the drop (PostgreSQL answers 55006, object_in_use): with force it terminates and
// tries again, a few times, backing off; without, it reports the slot active.
func (n *Names) dropSlotStep(inTx InTx, slot string, force bool) walStep {
	sql := "SELECT pg_drop_replication_slot(" + literal(slot) + ")"
	s := newStep(inTx, fmt.Sprintf("drop replication slot %q", slot), sql)
	s.run = func(ctx context.Context) error {
		backoff := 100 * time.Millisecond
		for attempt := 1; ; attempt++ {
			err := inTx(ctx, func(q Querier) error { return q.Exec(ctx, sql) })
			switch SQLState(err) {
			case "42704": // undefined_object: dropped meanwhile
				return nil
			case "55006":
			default:
				return err
			}
			var pid int
			perr := inTx(ctx, func(q Querier) error {
				return q.QueryRow(ctx, `SELECT coalesce(active_pid, 0) FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, []any{slot}, &pid)
			})
			if errors.Is(perr, ErrNoRows) {
				return nil
			} else if perr != nil {
				return perr
			}
			if !force {
				return &WALSlotActiveError{Slot: slot, PID: pid}
			}
			if attempt == 10 {
				return fmt.Errorf("a process took the slot again after each of %d terminations (last PID %d): stop the relays in WAL mode, then drop: %w", attempt, pid, err)
			}
			if pid != 0 {
				if terr := inTx(ctx, func(q Querier) error {
					return q.Exec(ctx, fmt.Sprintf("SELECT pg_terminate_backend(%d, %d)", pid, walTerminateWaitMS))
				}); terr != nil {
					return terr
				}
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
		}
	}
	return s
}

// pgDuration writes d as a PostgreSQL time setting: whole seconds as "30s", else
// milliseconds.
func pgDuration(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
}
