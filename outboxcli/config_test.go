package outboxcli

import (
	"strings"
	"testing"
	"time"
)

// migrate sql prints the schema it was given and needs no database, so it shows which
// source won.
func schemaIn(t *testing.T, r result) string {
	t.Helper()
	for _, l := range strings.Split(r.stdout, "\n") {
		if s, ok := strings.CutPrefix(l, `CREATE SCHEMA IF NOT EXISTS "`); ok {
			return strings.TrimSuffix(s, `";`)
		}
	}
	t.Fatalf("no CREATE SCHEMA in %s", r)
	return ""
}

func TestConfigPrecedence(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "outbox.yaml", "# shared by every command\nschema: from_file\nprefix: p_\nbatch-size: 500\nid: [a, b]\n")

	cases := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"default", nil, nil, "public"},
		{"file", nil, []string{"--config", file}, "from_file"},
		{"file named in the environment", map[string]string{"OUTBOX_CONFIG": file}, nil, "from_file"},
		{"env beats file", map[string]string{"OUTBOX_SCHEMA": "from_env"}, []string{"--config", file}, "from_env"},
		{"flag beats env and file", map[string]string{"OUTBOX_SCHEMA": "from_env"}, []string{"--config", file, "--schema", "from_flag"}, "from_flag"},
		{"flag beats a file named in the environment", map[string]string{"OUTBOX_CONFIG": file}, []string{"--schema=from_flag"}, "from_flag"},
	}
	for _, tc := range cases {
		r := must(t, 0, tc.env, append([]string{"migrate", "sql"}, tc.args...)...)
		if got := schemaIn(t, r); got != tc.want {
			t.Errorf("%s: schema %q, want %q", tc.name, got, tc.want)
		}
	}
	// The file's prefix applies where nothing overrides it.
	if r := must(t, 0, nil, "migrate", "sql", "--config", file); !strings.Contains(r.stdout, `"from_file"."p_outbox"`) {
		t.Errorf("prefix from the file not applied: %s", r)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OUTBOX_DATABASE_URL": unreachableDB}
	cases := []struct {
		name, file string
		args       []string
		want       string
	}{
		{"unknown key", "schema: s\nbatch-sise: 5\n", []string{"migrate", "sql"}, `unknown key "batch-sise"`},
		{"confirmation in a file", "yes: true\n", []string{"migrate", "sql"}, `key "yes" is not allowed`},
		{"not a mapping", "- a\n- b\n", []string{"migrate", "sql"}, "want a mapping"},
		{"broken yaml", "schema: [\n", []string{"migrate", "sql"}, "config file"},
		{"duplicate key", "schema: a\nschema: b\n", []string{"migrate", "sql"}, "schema"},
		{"null value", "schema:\n", []string{"migrate", "sql"}, `key "schema" has no value`},
		{"list for a single value", "schema: [a, b]\n", []string{"migrate", "sql"}, "takes one value"},
		{"bad value", "batch-size: many\n", []string{"relay"}, "--batch-size: invalid value in config file"},
		{"bad identifier", "schema: 'x\"y'\n", []string{"migrate", "sql"}, "--schema"},
	}
	for _, tc := range cases {
		path := writeFile(t, "bad.yaml", tc.file)
		r := cli(t, env, append(tc.args, "--config", path)...)
		if r.code != 2 || !strings.Contains(errorLine(r.stderr), tc.want) {
			t.Errorf("%s: want exit 2 and %q, got %s", tc.name, tc.want, r)
		}
	}

	r := cli(t, nil, "migrate", "sql", "--config", "/nonexistent/outbox.yaml")
	if r.code != 2 || !strings.Contains(r.stderr, "--config") {
		t.Errorf("missing config file: %s", r)
	}
	r = cli(t, with(env, "OUTBOX_BATCH_SIZE", "lots"), "relay")
	if r.code != 2 || !strings.Contains(r.stderr, "--batch-size") || !strings.Contains(r.stderr, "OUTBOX_BATCH_SIZE") {
		t.Errorf("bad env value: want exit 2 naming the flag and the variable, got %s", r)
	}
	// A key another command uses is fine: one file serves every command.
	path := writeFile(t, "shared.yaml", "batch-size: 10\nbroker: nats://127.0.0.1:4222\nlimit: 5\n")
	must(t, 0, nil, "migrate", "sql", "--config", path)
}

func TestParseDuration(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{
		"90s": 90 * time.Second, "106751d": 106751 * 24 * time.Hour, "2h": 2 * time.Hour, "7d": 7 * 24 * time.Hour, "1d12h": 36 * time.Hour, " 5m ": 5 * time.Minute,
	} {
		if got, err := parseDuration(in); err != nil || got != want {
			t.Errorf("parseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	// Out of range is an error, not a wrapped-around value (213504d once became 25m26s).
	for _, in := range []string{"", "d", "xd", "1.5d", "-1d", "soon", "213504d", "106752d", "106751d24h", "9999999999h"} {
		if _, err := parseDuration(in); err == nil {
			t.Errorf("parseDuration(%q): no error", in)
		}
	}
	for d, want := range map[time.Duration]string{time.Minute: "1m", time.Hour: "1h", 90 * time.Minute: "1h30m", 7 * 24 * time.Hour: "7d", 500 * time.Millisecond: "500ms"} {
		if got := formatDuration(d); got != want {
			t.Errorf("formatDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestPointInTime(t *testing.T) {
	t.Parallel()
	now := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	v := &pointInTime{now: func() time.Time { return now }}
	if err := v.Set("2h"); err != nil || !v.t.Equal(now.Add(-2*time.Hour)) {
		t.Fatalf("2h: %v, %v", v.t, err)
	}
	if err := v.Set("2024-04-30T08:00:00+02:00"); err != nil || !v.t.Equal(time.Date(2024, 4, 30, 6, 0, 0, 0, time.UTC)) {
		t.Fatalf("RFC 3339: %v, %v", v.t, err)
	}
	if err := v.Set("last tuesday"); err == nil {
		t.Fatal("no error for nonsense")
	}
}
