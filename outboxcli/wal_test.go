package outboxcli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testpg"
)

// walServer is a private PostgreSQL server with wal_level=logical (the shared one runs
// replica) and the outbox migrated in its public schema, and the environment that
// points the CLI at it as postgres, a superuser.
type walServer struct {
	*testpg.Server
	env map[string]string
}

func newWALServer(t *testing.T, settings ...string) *walServer {
	t.Helper()
	s := &walServer{Server: testpg.StartServer(t, append([]string{"wal_level=logical"}, settings...)...)}
	s.env = map[string]string{"OUTBOX_DATABASE_URL": s.URL()}
	must(t, 0, s.env, "migrate", "up")
	return s
}

// as returns the environment that runs the CLI as role.
func (s *walServer) as(role string) map[string]string {
	return with(s.env, "OUTBOX_DATABASE_URL", "postgres://"+role+"@"+s.Addr()+"/"+testpg.Database+"?sslmode=disable")
}

// exec runs statements as postgres.
func (s *walServer) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	execAt(t, s.URL(), sql, args...)
}

func execAt(t *testing.T, dbURL, sql string, args ...any) {
	t.Helper()
	ctx := testenv.Context(t)
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// walObjects is what of WAL mode exists on a server, read from PostgreSQL's catalogs.
type walObjects struct {
	slot, publication bool   // they exist
	slotActive        bool   // a process streams from the slot
	plugin            string // the slot's
	pubInsertOnly     bool   // the publication publishes inserts only, via the root
	rows              int    // rows in outbox_wal
	notifyDisabled    bool   // the row says setup disabled the trigger
	triggerOn         bool   // the NOTIFY trigger is enabled
}

func readWALObjects(t *testing.T, dbURL, schema, slot, pub string) walObjects {
	t.Helper()
	ctx := testenv.Context(t)
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var o walObjects
	err = conn.QueryRow(ctx, `SELECT
    EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $2),
    coalesce((SELECT active FROM pg_replication_slots WHERE slot_name = $2), false),
    coalesce((SELECT plugin::text FROM pg_replication_slots WHERE slot_name = $2), ''),
    EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $3),
    coalesce((SELECT pubinsert AND NOT pubupdate AND NOT pubdelete AND NOT pubtruncate AND pubviaroot FROM pg_publication WHERE pubname = $3), false),
    (SELECT tgenabled <> 'D' FROM pg_trigger WHERE tgrelid = to_regclass(quote_ident($1) || '.outbox') AND tgname = 'outbox_notify')`,
		schema, slot, pub).Scan(&o.slot, &o.slotActive, &o.plugin, &o.publication, &o.pubInsertOnly, &o.triggerOn)
	if err != nil {
		t.Fatal(err)
	}
	err = conn.QueryRow(ctx, fmt.Sprintf(`SELECT count(*)::int, coalesce(bool_or(notify_disabled), false) FROM %s.outbox_wal`, pgx.Identifier{schema}.Sanitize())).
		Scan(&o.rows, &o.notifyDisabled)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func walStatusJSON(t *testing.T, want int, env map[string]string, args ...string) (pgsql.WALStatus, result) {
	t.Helper()
	r := must(t, want, env, append([]string{"wal", "status", "--json"}, args...)...)
	var st pgsql.WALStatus
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("wal status --json: %v\n%s", err, r)
	}
	return st, r
}

// TestWALSetupStatusDrop runs the commands' whole round on a server that allows logical
// replication: a setup held up by an open transaction names it and is finished by the
// next run, a second setup changes nothing, status shows the slot and its lag, drop
// removes everything and turns NOTIFY back on, and status then fails.
func TestWALSetupStatusDrop(t *testing.T) {
	t.Parallel()
	s := newWALServer(t)
	objects := func() walObjects { t.Helper(); return readWALObjects(t, s.URL(), "public", "outbox_wal", "outbox_pub") }

	// A transaction that wrote and stays open keeps a logical slot from becoming
	// consistent: setup gives up after --slot-timeout and names it. The publication,
	// created first, stays; the next setup finishes the rest.
	ctx := testenv.Context(t)
	holder, err := pgx.Connect(ctx, s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var holderPID int
	var xid int64
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid(), txid_current()`).Scan(&holderPID, &xid); err != nil {
		t.Fatal(err)
	}
	r := must(t, 1, s.env, "wal", "setup", "--slot-timeout", "1s")
	if line := errorLine(r.stderr); !strings.Contains(line, fmt.Sprintf("oldest open transaction is PID %d", holderPID)) ||
		!strings.Contains(line, "waited 1s") {
		t.Fatalf("setup held up by PID %d: %s", holderPID, r)
	}
	if o := objects(); !o.publication || o.slot || o.rows != 0 || !o.triggerOn {
		t.Fatalf("after a setup that timed out creating the slot: %+v; want the publication only", o)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	r = must(t, 0, s.env, "wal", "setup")
	for _, want := range []string{`done: create logical replication slot "outbox_wal"`, `done: record slot "outbox_wal"`,
		"done: disable the NOTIFY trigger", `WAL mode is set up: slot "outbox_wal"`, "max_slot_wal_keep_size"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("setup output lacks %q:\n%s", want, r)
		}
	}
	if strings.Contains(r.stdout, "create publication") {
		t.Errorf("setup created the publication again:\n%s", r)
	}
	o := objects()
	if !o.slot || o.plugin != "pgoutput" || !o.publication || !o.pubInsertOnly || o.rows != 1 || !o.notifyDisabled || o.triggerOn {
		t.Fatalf("after setup: %+v", o)
	}

	// Setup again: everything is in place, and nothing changes.
	before, _ := walStatusJSON(t, 0, s.env)
	if before.Setup == nil || before.LagBytes == nil {
		t.Fatalf("status after setup: %+v", before)
	}
	if r := must(t, 0, s.env, "wal", "setup"); !strings.Contains(r.stdout, "nothing to do") || strings.Contains(r.stdout, "done:") {
		t.Fatalf("second setup: %s", r)
	}
	if r := must(t, 0, s.env, "wal", "setup", "--dry-run"); !strings.Contains(r.stdout, "-- nothing: everything is in place") {
		t.Fatalf("dry run of a third setup: %s", r)
	}
	st, _ := walStatusJSON(t, 0, s.env)
	if o := objects(); o.rows != 1 || !o.slot || st.Setup == nil || st.Setup.CreatedLSN != before.Setup.CreatedLSN {
		t.Fatalf("after a second setup: %+v, status %+v; want the same slot and row", o, st.Setup)
	}

	// Status: the slot, idle, with its figures.
	if !st.SlotExists || st.Active || st.WALStatus != "reserved" || st.LagBytes == nil || *st.LagBytes < 0 || st.RetainedBytes == nil ||
		!st.PublicationExists || st.PublicationMismatch != "" || len(st.Problems) != 0 || st.WALLevel != "logical" || !st.Replication {
		t.Fatalf("status after setup: %+v", st)
	}
	if s := st.Setup; s.State != "starting" || s.Owner != "" || !s.NotifyDisabled || !s.SameSystem || s.SystemID == "" || s.CreatedSeq != 0 ||
		!regexp.MustCompile(`^[0-9A-F]+/[0-9A-F]+$`).MatchString(s.CreatedLSN) {
		t.Fatalf("status's setup row: %+v", s)
	}
	// An insert moves the server's WAL past the slot's confirmed position: lag measures it.
	s.exec(t, `INSERT INTO outbox (id, topic, payload, dedup_key) VALUES (gen_random_uuid(), 't', '\x01', 'k1')`)
	if after, _ := walStatusJSON(t, 0, s.env); after.LagBytes == nil || *after.LagBytes <= *st.LagBytes {
		t.Fatalf("lag after an insert: %v, before %d; want it to grow", after.LagBytes, *st.LagBytes)
	}
	// 'outbox status' has the slot's line too.
	r = must(t, 0, s.env, "status")
	if !regexp.MustCompile(`WAL slot outbox_wal +starting +\(no reader, [^;]+ in this state; [^,]+ behind, [^,]+ retained, wal_status reserved\)`).MatchString(r.stdout) {
		t.Errorf("outbox status lacks the slot's line:\n%s", r.stdout)
	}
	r = must(t, 0, s.env, "wal", "status")
	for _, want := range []string{"outbox_wal", "no relay streams from it; wal_status reserved", "lag", "retained WAL",
		"unlimited", "outbox_pub", "inserts into", "starting", "disabled by setup", "logical", "REPLICATION yes"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status text lacks %q:\n%s", want, r.stdout)
		}
	}

	// Drop: a dry run changes nothing, then everything goes and NOTIFY is back on.
	r = must(t, 0, s.env, "wal", "drop", "--dry-run")
	for _, want := range []string{"SELECT pg_drop_replication_slot('outbox_wal');", `DROP PUBLICATION IF EXISTS "outbox_pub";`,
		`ENABLE TRIGGER "outbox_notify"`, "DELETE FROM"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("drop --dry-run lacks %q:\n%s", want, r.stdout)
		}
	}
	if o := objects(); !o.slot || !o.publication || o.rows != 1 || o.triggerOn {
		t.Fatalf("drop --dry-run changed something: %+v", o)
	}
	r = must(t, 0, s.env, "wal", "drop")
	if !strings.Contains(r.stdout, `done: drop replication slot "outbox_wal"`) || !strings.Contains(r.stdout, "nothing is lost") {
		t.Fatalf("drop: %s", r)
	}
	if o := objects(); o.slot || o.publication || o.rows != 0 || !o.triggerOn {
		t.Fatalf("after drop: %+v; want no slot, publication or row, and the trigger on", o)
	}

	// Status now fails: no slot.
	r = must(t, 1, s.env, "wal", "status")
	if !strings.Contains(r.stderr, `no replication slot "outbox_wal"`) || !strings.Contains(r.stdout, "missing") {
		t.Fatalf("status after drop: %s", r)
	}
	if st, _ := walStatusJSON(t, 1, s.env); st.SlotExists || len(st.Problems) == 0 {
		t.Fatalf("status --json after drop: %+v", st)
	}
	if r := must(t, 0, s.env, "wal", "drop"); !strings.Contains(r.stdout, "nothing left to drop") {
		t.Fatalf("second drop: %s", r)
	}

	// Reverting migration 5 while a slot it names exists would leave the slot retaining WAL
	// with nothing naming it: refused until the slot is dropped.
	must(t, 0, s.env, "wal", "setup", "--keep-notify")
	r = must(t, 1, s.env, "migrate", "down", "--to", "4", "--yes")
	if !strings.Contains(r.stderr, `replication slot "outbox_wal" of WAL mode still exists`) || !strings.Contains(r.stderr, "outbox wal drop") {
		t.Fatalf("migrate down with a slot: %s", r)
	}
	must(t, 0, s.env, "wal", "drop")
	must(t, 0, s.env, "migrate", "down", "--to", "4", "--yes")
}

// TestWALSetupNeedsLogicalWAL: on a server with wal_level=replica, setup says what to
// change and creates nothing, dry run included.
func TestWALSetupNeedsLogicalWAL(t *testing.T) {
	t.Parallel()
	b := migrated(t)
	dbURL := testdb.URL()
	ctx := testenv.Context(t)
	var level string
	if err := b.Pool.QueryRow(ctx, `SELECT current_setting('wal_level')`).Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level == "logical" { // the shared server is meant to run replica; check on a server that does
		dbURL = testpg.StartServer(t, "wal_level=replica").URL()
		must(t, 0, with(b.env, "OUTBOX_DATABASE_URL", dbURL), "migrate", "up")
	}
	env := with(b.env, "OUTBOX_DATABASE_URL", dbURL)
	slot, pub := b.Schema+"_outbox_wal", b.Schema+"_outbox_pub" // the defaults outside the public schema
	for _, args := range [][]string{{"wal", "setup"}, {"wal", "setup", "--dry-run"}, {"wal", "setup", "--json"}} {
		r := must(t, 1, env, args...)
		line := errorLine(r.stderr)
		if !strings.Contains(line, `wal_level is "replica"; WAL mode needs "logical": ALTER SYSTEM SET wal_level = logical and restart PostgreSQL`) {
			t.Errorf("%v: %s", args, r)
		}
		if o := readWALObjects(t, dbURL, b.Schema, slot, pub); o.slot || o.publication || o.rows != 0 || !o.triggerOn {
			t.Fatalf("%v created something: %+v", args, o)
		}
	}
	if r := must(t, 1, env, "wal", "setup", "--failover"); !strings.Contains(r.stderr, "2 problems") ||
		!strings.Contains(r.stderr, "--failover needs PostgreSQL 17 or later") {
		t.Errorf("setup --failover on PostgreSQL 15: %s", r)
	}
	if r := must(t, 1, env, "wal", "setup", "--dry-run"); !strings.Contains(r.stdout, "CREATE PUBLICATION") {
		t.Errorf("dry run does not show the SQL it would run: %s", r)
	}
	if r := must(t, 1, env, "wal", "status"); !strings.Contains(r.stderr, `wal_level is "replica"`) || !strings.Contains(r.stderr, "not set up") {
		t.Errorf("status on wal_level=replica: %s", r)
	}
}

// TestWALPrivilegeMessages: a role without REPLICATION, then one that does not own the
// outbox table, get the message that says what to grant or who should run setup; with a
// publication its owner made from the message's SQL, a REPLICATION role creates the
// slot. With every slot taken, setup says so. Nothing is created by a refused setup.
func TestWALPrivilegeMessages(t *testing.T) {
	t.Parallel()
	s := newWALServer(t, "max_replication_slots=1")
	s.exec(t, `CREATE ROLE app LOGIN;
GRANT USAGE ON SCHEMA public TO app;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO app;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO app`)
	app := s.as("app")
	objects := func() walObjects { t.Helper(); return readWALObjects(t, s.URL(), "public", "outbox_wal", "outbox_pub") }
	nothing := func(when string) {
		t.Helper()
		if o := objects(); o.slot || o.publication || o.rows != 0 || !o.triggerOn {
			t.Fatalf("%s: %+v; want nothing created", when, o)
		}
	}

	const replication = `role "app" lacks the REPLICATION attribute: ALTER ROLE app REPLICATION`
	const owner = `creating publication "outbox_pub" needs ownership of public.outbox (owner "postgres") and CREATE on database "test": ` +
		`run setup as "postgres", or have it run: CREATE PUBLICATION "outbox_pub" FOR TABLE "public"."outbox" WITH (publish = 'insert', publish_via_partition_root = true)`
	r := must(t, 1, app, "wal", "setup")
	if !strings.Contains(r.stderr, "2 problems, nothing was changed") || !strings.Contains(r.stderr, replication) || !strings.Contains(r.stderr, owner) {
		t.Fatalf("setup as a role without REPLICATION: %s", r)
	}
	nothing("refused for REPLICATION")

	s.exec(t, `ALTER ROLE app REPLICATION`)
	r = must(t, 1, app, "wal", "setup")
	if line := errorLine(r.stderr); line != "outbox: "+owner {
		t.Fatalf("setup as a REPLICATION role that does not own the table:\n%s\nwant\noutbox: %s", r, owner)
	}
	nothing("refused for ownership")

	// The owner runs the statement the message gives; then the REPLICATION role sets up
	// the slot, leaving the trigger (which it may not change) on.
	s.exec(t, owner[strings.Index(owner, "CREATE PUBLICATION"):])
	r = must(t, 1, app, "wal", "setup")
	if line := errorLine(r.stderr); !strings.Contains(line, `disabling the NOTIFY trigger "outbox_notify" needs ownership of public.outbox (owner "postgres")`) ||
		!strings.Contains(line, "--keep-notify") {
		t.Fatalf("setup that would disable the trigger of a table the role does not own: %s", r)
	}
	r = must(t, 0, app, "wal", "setup", "--keep-notify")
	if !strings.Contains(r.stdout, "done: create logical replication slot") || strings.Contains(r.stdout, "create publication") {
		t.Fatalf("setup --keep-notify with the owner's publication: %s", r)
	}
	if o := objects(); !o.slot || !o.publication || o.rows != 1 || o.notifyDisabled || !o.triggerOn {
		t.Fatalf("after the REPLICATION role's setup: %+v", o)
	}
	if st, _ := walStatusJSON(t, 0, app); st.Role != "app" || !st.Replication || st.OwnsTable {
		t.Fatalf("status as app: %+v", st)
	}
	// Dropping the owner's publication needs its ownership: refused, nothing dropped.
	r = must(t, 1, app, "wal", "drop")
	if !strings.Contains(errorLine(r.stderr), `dropping publication "outbox_pub" needs its ownership`) {
		t.Fatalf("drop as app: %s", r)
	}
	if o := objects(); !o.slot || !o.publication || o.rows != 1 {
		t.Fatalf("a refused drop dropped something: %+v", o)
	}

	// The only slot is taken: a setup of another one says so, and creates nothing.
	r = must(t, 1, s.env, "wal", "setup", "--slot", "second", "--publication", "second_pub")
	if line := errorLine(r.stderr); line != "outbox: no free replication slot (max_replication_slots = 1): drop an unused one "+
		"(SELECT slot_name, active FROM pg_replication_slots) or raise max_replication_slots, which needs a restart" {
		t.Fatalf("setup with no free slot: %s", r)
	}
	if o := readWALObjects(t, s.URL(), "public", "second", "second_pub"); o.slot || o.publication || o.rows != 1 {
		t.Fatalf("a setup refused for slots created something: %+v", o)
	}
	must(t, 0, s.env, "wal", "drop")
	if o := objects(); o.slot || o.publication || o.rows != 0 {
		t.Fatalf("after drop as postgres: %+v", o)
	}
}

// startReplication streams from slot on a replication connection, as a relay in WAL
// mode will, so that PostgreSQL marks the slot active; the connection is returned once
// the server has entered streaming (CopyBoth).
func startReplication(t *testing.T, dbURL, slot, pub string) *pgconn.PgConn {
	t.Helper()
	ctx := testenv.Context(t)
	conn, err := pgconn.Connect(ctx, dbURL+"&replication=database")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	conn.Frontend().Send(&pgproto3.Query{String: fmt.Sprintf(
		`START_REPLICATION SLOT %s LOGICAL 0/0 (proto_version '1', publication_names '%s')`, slot, pub)})
	if err := conn.Frontend().Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			t.Fatalf("START_REPLICATION: %v", err)
		}
		switch m := msg.(type) {
		case *pgproto3.CopyBothResponse:
			return conn
		case *pgproto3.ErrorResponse:
			t.Fatalf("START_REPLICATION: %s (%s)", m.Message, m.Code)
		}
	}
}

// TestWALDropActiveSlot: while a replication connection streams from the slot, drop
// refuses and changes nothing; --force terminates that connection and drops.
func TestWALDropActiveSlot(t *testing.T) {
	t.Parallel()
	s := newWALServer(t)
	must(t, 0, s.env, "wal", "setup")
	stream := startReplication(t, s.URL(), "outbox_wal", "outbox_pub")
	var pid int
	testenv.Await(t, "the slot to be active", func() (any, bool) {
		st, _ := walStatusJSON(t, 0, s.env)
		pid = st.ActivePID
		return st, st.Active && st.ActivePID != 0
	})
	if r := must(t, 0, s.env, "wal", "status"); !strings.Contains(r.stdout, fmt.Sprintf("streaming to PID %d", pid)) {
		t.Errorf("status of an active slot: %s", r)
	}

	r := must(t, 2, s.env, "wal", "drop")
	if line := errorLine(r.stderr); !strings.Contains(line, fmt.Sprintf(`replication slot "outbox_wal" is in use by PID %d`, pid)) ||
		!strings.Contains(line, "--force") || !strings.Contains(line, "Nothing was changed") {
		t.Fatalf("drop of an active slot: %s", r)
	}
	if r := must(t, 0, s.env, "wal", "drop", "--force", "--dry-run"); !strings.Contains(r.stdout, fmt.Sprintf("SELECT pg_terminate_backend(%d, 5000);", pid)) {
		t.Fatalf("drop --force --dry-run: %s", r)
	}
	if o := readWALObjects(t, s.URL(), "public", "outbox_wal", "outbox_pub"); !o.slot || !o.slotActive || !o.publication || o.rows != 1 {
		t.Fatalf("a refused drop changed something: %+v", o)
	}

	var res pgsql.WALDropResult
	r = must(t, 0, s.env, "wal", "drop", "--force", "--json")
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.Terminated != pid || len(res.Steps) != 4 {
		t.Fatalf("drop --force --json (%v): %s", err, r)
	}
	if o := readWALObjects(t, s.URL(), "public", "outbox_wal", "outbox_pub"); o.slot || o.publication || o.rows != 0 || !o.triggerOn {
		t.Fatalf("after drop --force: %+v", o)
	}
	// The streaming connection was terminated: it ends with an error, not a hang.
	ctx, cancel := testenv.CallContext()
	defer cancel()
	for {
		msg, err := stream.ReceiveMessage(ctx)
		if ctx.Err() != nil {
			t.Fatal("the replication connection still streams after drop --force")
		}
		if _, fatal := msg.(*pgproto3.ErrorResponse); err != nil || fatal {
			break
		}
	}
}

// TestWALUsageErrors: names that are not plain identifiers, a bad timeout and a
// database that is not PostgreSQL are usage errors, found before connecting.
func TestWALUsageErrors(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OUTBOX_DATABASE_URL": unreachableDB}
	sqlite := "sqlite://" + filepath.Join(t.TempDir(), "app.db")
	mysql := (&url.URL{Scheme: "mysql", User: url.UserPassword("u", "secret"), Host: "127.0.0.1:1", Path: "/db"}).String()
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{env, []string{"wal", "setup", "--slot", "Outbox-WAL"}, "--slot"},
		{env, []string{"wal", "status", "--publication", `p"; DROP TABLE outbox; --`}, "--publication"},
		{env, []string{"wal", "setup", "--slot-timeout", "0s"}, "--slot-timeout"},
		{with(env, "OUTBOX_SCHEMA", strings.Repeat("s", 54)), []string{"wal", "status"}, "--slot: the default name"},
		{with(env, "OUTBOX_DATABASE_URL", sqlite), []string{"wal", "status"}, "PostgreSQL only"},
		{with(env, "OUTBOX_DATABASE_URL", mysql), []string{"wal", "setup"}, "PostgreSQL only"},
		{with(env, "OUTBOX_DATABASE_URL", sqlite), []string{"wal", "drop", "--force"}, "PostgreSQL only"},
		{env, []string{"wal"}, "wal needs a command: setup, status, drop"},
		{env, []string{"wal", "status", "extra"}, `unexpected argument "extra"`},
	} {
		r := cli(t, tc.env, tc.args...)
		if r.code != 2 || !strings.Contains(errorLine(r.stderr), tc.want) || strings.Contains(r.stderr, "connect to") || strings.Contains(r.stderr, "secret") {
			t.Errorf("outbox %v: want exit 2 and %q before connecting, got %s", tc.args, tc.want, r)
		}
	}
	// --force is a confirmation: a config file may not give it.
	cfg := writeFile(t, "outbox.yaml", "force: true\n")
	if r := cli(t, env, "wal", "drop", "--config", cfg); r.code != 2 || !strings.Contains(r.stderr, "force") {
		t.Errorf("force from a config file: %s", r)
	}
}

// TestWALMigrationIsDeferrable: without schema version 5 the other commands run (relays
// poll without it), and wal setup asks for the migration.
func TestWALMigrationIsDeferrable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	must(t, 0, b.env, "migrate", "up", "--to", "4")
	must(t, 0, b.env, "status")
	if r := must(t, 0, b.env, "partitions", "list"); r.stdout == "" {
		t.Errorf("partitions list without version 5 lists no day: %s", r)
	}
	if r := must(t, 1, b.env, "wal", "setup"); !strings.Contains(errorLine(r.stderr), "lacks schema versions [5]") ||
		!strings.Contains(r.stderr, "outbox migrate up") {
		t.Errorf("wal setup without version 5: %s", r)
	}
	if r := must(t, 1, b.env, "wal", "status"); !strings.Contains(r.stderr, "lacks schema version 5 (005_wal)") {
		t.Errorf("wal status without version 5: %s", r)
	}
}
