package outboxcli

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxpgx"
)

// syncBuffer is the output of a command the test reads while it is written.
type syncBuffer = testenv.Buffer

type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout:\n%s--- stderr:\n%s", r.code, r.stdout, r.stderr)
}

// cli runs the command line in-process with exactly the environment env (the test
// process's own environment is never read). Its context bounds a hang (testenv.Stall()),
// not how long the command may take; it ends with the call, since polls call cli too.
func cli(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	ctx, cancel := testenv.CallContext()
	defer cancel()
	var stdout, stderr syncBuffer
	code := run(ctx, args, func(k string) string { return env[k] }, &stdout, &stderr)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// must runs args and fails the test unless the exit status is want.
func must(t *testing.T, want int, env map[string]string, args ...string) result {
	t.Helper()
	r := cli(t, env, args...)
	if r.code != want {
		t.Fatalf("outbox %s: want exit %d, got %s", strings.Join(args, " "), want, r)
	}
	return r
}

// unreachableDB is a database URL nothing listens on: commands that must not connect
// are run with it.
const unreachableDB = "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2"

// testBundle is a fresh schema on the test database and the environment that points
// the CLI at it.
type testBundle struct {
	*testdb.DB
	env map[string]string
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	db := testdb.NewDB(t)
	return &testBundle{DB: db, env: map[string]string{
		"OUTBOX_DATABASE_URL": testdb.URL(),
		"OUTBOX_SCHEMA":       db.Schema,
	}}
}

// migrated is setup plus `outbox migrate up`.
func migrated(t *testing.T) *testBundle {
	t.Helper()
	b := setup(t)
	must(t, 0, b.env, "migrate", "up")
	return b
}

func (b *testBundle) driver(t *testing.T) *outboxpgx.Driver {
	t.Helper()
	drv, err := outboxpgx.New(b.Pool, outboxpgx.Config{Schema: b.Schema})
	if err != nil {
		t.Fatal(err)
	}
	return drv
}

// count counts the pending messages (the outbox table) that match where.
func (b *testBundle) count(t *testing.T, where string) int {
	t.Helper()
	return b.CountIn(t, "outbox", where)
}

func with(env map[string]string, kv ...string) map[string]string {
	out := make(map[string]string, len(env)+len(kv)/2)
	for k, v := range env {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// errorLine returns the line of stderr that reports the error ("outbox: ...").
func errorLine(stderr string) string {
	for _, l := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(l, "outbox: ") {
			return l
		}
	}
	return ""
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// leaves returns every runnable command with its path ("dead list").
func leaves() map[string]*command {
	out := map[string]*command{}
	var walk func(path string, c *command)
	walk = func(path string, c *command) {
		if c.setup != nil {
			out[path] = c
		}
		for _, s := range c.subs {
			walk(strings.TrimSpace(path+" "+s.name), s)
		}
	}
	for _, c := range commands {
		walk(c.name, c)
	}
	return out
}

func TestHelpListsEveryFlagWithItsEnvVar(t *testing.T) {
	t.Parallel()
	for path, cmd := range leaves() {
		fs, _, _ := leafFlags(path, cmd)
		for _, helpArg := range []string{"--help", "-h"} {
			args := append(strings.Fields(path), helpArg)
			r := must(t, 0, nil, args...)
			fs.VisitAll(func(f *flag.Flag) {
				if long := aliasOf(f); long != "" {
					if !strings.Contains(r.stdout, "--"+long) || !strings.Contains(r.stdout, ", -"+f.Name) {
						t.Errorf("outbox %s %s: alias -%s of --%s missing from:\n%s", path, helpArg, f.Name, long, r.stdout)
					}
					return
				}
				if !strings.Contains(r.stdout, "--"+f.Name) || !strings.Contains(r.stdout, envName(f.Name)) {
					t.Errorf("outbox %s %s: flag --%s or %s missing from:\n%s", path, helpArg, f.Name, envName(f.Name), r.stdout)
				}
			})
			if wantConfig := path != "version"; wantConfig != strings.Contains(r.stdout, "--config") {
				t.Errorf("outbox %s %s: --config shown: %v, want %v:\n%s", path, helpArg, !wantConfig, wantConfig, r.stdout)
			}
		}
		// `outbox help <path>` prints the same.
		r := must(t, 0, nil, append([]string{"help"}, strings.Fields(path)...)...)
		if !strings.Contains(r.stdout, "Usage:\n  outbox "+path) {
			t.Errorf("outbox help %s:\n%s", path, r.stdout)
		}
	}
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"dead", "--help"}, {"migrate", "-h"}, {"help", "dead"}} {
		r := must(t, 0, nil, args...)
		if !strings.Contains(r.stdout, "Commands:") {
			t.Errorf("outbox %v: no command list:\n%s", args, r.stdout)
		}
	}
	r := must(t, 0, nil, "--help")
	for _, name := range []string{"relay", "migrate", "status", "dead", "version", "OUTBOX_DATABASE_URL", "Exit status"} {
		if !strings.Contains(r.stdout, name) {
			t.Errorf("outbox --help does not mention %s:\n%s", name, r.stdout)
		}
	}
	if r := must(t, 0, nil, "relay", "--help"); !strings.Contains(r.stdout, databaseURLDefault) {
		t.Errorf("relay --help does not show the database default:\n%s", r.stdout)
	}
}

func TestUsageErrorsExitTwo(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OUTBOX_DATABASE_URL": unreachableDB}
	cases := []struct {
		args []string
		want string // in stderr
	}{
		{nil, "no command given"},
		{[]string{"nosuch"}, `unknown command "nosuch"`},
		{[]string{"dead"}, "dead needs a command"},
		{[]string{"dead", "nosuch"}, `unknown command "nosuch"`},
		{[]string{"status", "--bogus"}, "unknown flag --bogus"},
		{[]string{"demo", "--database-url", "sqlite:///tmp/demo.db"}, "--database-url: the demo runs on PostgreSQL"},
		{[]string{"demo", "--broker", "amqp://guest:guest@127.0.0.1:5672/"}, "--broker: the demo's consumer reads NATS JetStream"},
		{[]string{"dead", "list", "--limit", "many"}, `--limit: "many" is not a whole number`},
		{[]string{"dead", "list", "--limit", "99999999999999999999"}, `--limit: "99999999999999999999" is out of range`},
		{[]string{"dead", "list", "--limit"}, "--limit needs a value"},
		{[]string{"dead", "list", "--limit", "-1"}, "--limit"},
		{[]string{"dead", "list", "--since", "yesterday"}, "invalid time"},
		{[]string{"dead", "list", "--since", "1h", "--until", "2h"}, "is not before --until"},
		{[]string{"dead", "list", "--id", "not-a-uuid"}, "--id"},
		{[]string{"dead", "show"}, "one message id"},
		{[]string{"dead", "show", "nope"}, "invalid id"},
		{[]string{"status", "extra"}, `unexpected argument "extra"`},
		{[]string{"migrate", "up", "--to", "0"}, "--to"},
		{[]string{"help", "nosuch"}, `no help for "nosuch"`},
		{[]string{"migrate", "sql", "--schema", `x"y`}, "--schema"},
		{[]string{"status", "--schema", `x"y`}, "--schema"},
		{[]string{"dead", "list", "--prefix", "Bad Prefix"}, "--prefix"},
		{[]string{"status", "--database-url", "postgres://h:notaport/db"}, "--database-url"},
	}
	for _, tc := range cases {
		r := cli(t, env, tc.args...)
		if r.code != 2 || !strings.Contains(errorLine(r.stderr), tc.want) {
			t.Errorf("outbox %v: want exit 2 and an error line with %q on stderr, got %s", tc.args, tc.want, r)
		}
		if strings.Contains(r.stderr, "connect to PostgreSQL") {
			t.Errorf("outbox %v: tried to connect before rejecting its arguments: %s", tc.args, r)
		}
		if strings.Contains(r.stderr, "outbox: outbox:") {
			t.Errorf("outbox %v: the prefix doubled: %s", tc.args, r)
		}
	}
}

func TestRelayRejectsBadSettingsBeforeConnecting(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OUTBOX_DATABASE_URL": unreachableDB}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--batch-size", "0"}, "--batch-size: must be a positive number"},
		{[]string{"--poll-interval", "-5s"}, "--poll-interval"},
		{[]string{"--poll-interval", "fast"}, `--poll-interval: invalid duration "fast"`},
		{[]string{"--lease-ttl", "100ms"}, "--lease-ttl: must be at least 1s"},
		{[]string{"--max-in-flight", "10", "--publish-batch-size", "20"}, "--publish-batch-size: 20 is larger than --max-in-flight (10)"},
		{[]string{"--publish-batch-size", "-1"}, "--publish-batch-size: must be a positive number (or 0 for the default)"},
		{[]string{"--retry-min-delay", "1m", "--retry-max-delay", "1s"}, "--retry-max-delay: is shorter than --retry-min-delay"},
		{[]string{"--retention", "-2h"}, "--retention"},
		{[]string{"--log-format", "xml"}, "--log-format"},
		{[]string{"--log-level", "loud"}, "--log-level"},
		{[]string{"--broker", "gopher://x"}, `unknown scheme "gopher"`},
		{[]string{"--broker", "not a url"}, "--broker"},
		{[]string{"--route", "events.{nope}"}, "--route"},
		{[]string{"--route", "events.{topic"}, "--route"},
		{[]string{"--broker-tls-cert", "/nonexistent.pem"}, "--broker-tls-cert and --broker-tls-key"},
		{[]string{"--broker-tls-ca", "/nonexistent.pem"}, "--broker-tls-ca"},
		{[]string{"--nats-create-stream", "S"}, "--nats-create-stream"},
		{[]string{"--nats-create-stream", "a.b", "--route", "x.{topic}"}, "not a valid stream name"},
		{[]string{"--nats-stream-subjects", "x.>"}, "only used with --nats-create-stream"},
		{[]string{"--schema", `x"y`}, "--schema"},
	}
	for _, tc := range cases {
		r := cli(t, env, append([]string{"relay"}, tc.args...)...)
		if r.code != 2 || !strings.Contains(errorLine(r.stderr), tc.want) {
			t.Errorf("relay %v: want exit 2 and %q, got %s", tc.args, tc.want, r)
		}
	}
	// A retention of -1 is "forever", not an error: this run gets as far as connecting.
	if r := cli(t, env, "relay", "--retention", "-1"); r.code != 1 || !strings.Contains(r.stderr, "connect to PostgreSQL") {
		t.Errorf("relay --retention -1: want a connection failure (exit 1), got %s", r)
	}
}

// TestRelaySmallMaxInFlight: --max-in-flight below the publish batch's default of 250,
// alone, is a valid setting (the batch follows it down): the relay gets as far as
// connecting.
func TestRelaySmallMaxInFlight(t *testing.T) {
	t.Parallel()
	r := cli(t, map[string]string{"OUTBOX_DATABASE_URL": unreachableDB}, "relay", "--max-in-flight", "100")
	if r.code != 1 || strings.Contains(r.stderr, "publish-batch-size") {
		t.Fatalf("want exit 1 (the database is unreachable), not a settings error; got %s", r)
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	r := must(t, 0, nil, "version")
	if !strings.HasPrefix(r.stdout, "outbox ") || !strings.Contains(r.stdout, "commit ") || !strings.Contains(r.stdout, "go1.") {
		t.Fatalf("version output: %s", r)
	}
}
