package outboxcli

import (
	"fmt"
	"math/big"
	"regexp"
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
	// Every error names the file and the line, FILE:LINE: as compilers do, so that
	// editors and terminals open it there.
	cases := []struct {
		name, file string
		args       []string
		line       int // 0: the error knows no line
		want       string
	}{
		{"unknown key", "schema: s\nbatch-sise: 5\n", []string{"migrate", "sql"}, 2, `unknown key "batch-sise"`},
		{"confirmation in a file", "yes: true\n", []string{"migrate", "sql"}, 1, `key "yes" is not allowed`},
		{"not a mapping", "# list\n- a\n- b\n", []string{"migrate", "sql"}, 2, "want a mapping"},
		{"broken yaml", "schema: s\nprefix: p\n  x: y\n", []string{"migrate", "sql"}, 3, "not valid YAML"},
		{"yaml error without a line", "\tschema: s\n", []string{"migrate", "sql"}, 0, "not valid YAML"},
		{"duplicate key", "schema: a\nschema: b\n", []string{"migrate", "sql"}, 2, `key "schema" appears twice`},
		{"null value", "prefix: p\nschema:\n", []string{"migrate", "sql"}, 2, `key "schema" has no value`},
		{"list for a single value", "schema: [a, b]\n", []string{"migrate", "sql"}, 1, "--schema takes one value"},
		{"bad value", "\nbatch-size: many\n", []string{"relay"}, 2, `--batch-size: "many" is not a whole number`},
		{"empty item of a list", "id:\n  - 0190a5c8-0000-7000-8000-000000000000\n  - ''\n", []string{"dead", "list"}, 3, "--id: empty value"},
		{"bad item of a list found later", "\nid:\n  - 0190a5c8-0000-7000-8000-000000000000\n  - nope\n", []string{"dead", "list"}, 2, `--id: invalid id: "nope"`},
		{"bad value found later", "prefix: p\nschema: 'x\"y'\n", []string{"migrate", "sql"}, 2, "--schema"},
		{"bad duration", "poll-interval: 5 minutes\n", []string{"relay"}, 1, "--poll-interval"},
	}
	for _, tc := range cases {
		path := writeFile(t, "bad.yaml", tc.file)
		prefix := path + ":"
		if tc.line > 0 {
			prefix = fmt.Sprintf("%s:%d: ", path, tc.line)
		}
		r := cli(t, env, append(tc.args, "--config", path)...)
		if line := errorLine(r.stderr); r.code != 2 || !strings.HasPrefix(line, "outbox: "+prefix) || !strings.Contains(line, tc.want) {
			t.Errorf("%s: want exit 2 and %q after %q, got %s", tc.name, tc.want, prefix, r)
		}
	}
	// A value from the command line or the environment is not the file's.
	path := writeFile(t, "fine.yaml", "prefix: p\n")
	if r := cli(t, env, "migrate", "sql", "--config", path, "--schema", "x\"y"); r.code != 2 || strings.Contains(r.stderr, path) {
		t.Errorf("a bad flag given beside a file: %s", r)
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
	path = writeFile(t, "shared.yaml", "batch-size: 10\nbroker: nats://127.0.0.1:4222\nlimit: 5\n")
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
	for _, in := range []string{"", "d", "xd", "1.5d", "-1d", "soon", "213504d", "106752d", "106751d24h", "9999999999h", "1d-5h", "-0d5m", "+1d"} {
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

// durationRef is a reference reading of a duration flag, with exact arithmetic: an
// optional sign for the whole, optional whole days, then time.ParseDuration's units (or
// its "0": 7d0 is 7d).
var (
	durationRef     = regexp.MustCompile(`^([-+]?)(?:([0-9]+)d)?((?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))*|0)$`)
	durationRefPart = regexp.MustCompile(`([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)`)
	durationUnits   = map[string]int64{"ns": 1, "us": 1e3, "µs": 1e3, "μs": 1e3, "ms": 1e6, "s": 1e9, "m": 60e9, "h": 3600e9}
)

// exactDuration returns the nanoseconds s means, exactly, and how many parts it has
// (time.ParseDuration drops each part's fraction of a nanosecond); ok is false when the
// reference does not read s.
func exactDuration(s string) (ns *big.Rat, parts int, ok bool) {
	s = strings.TrimSpace(s)
	if strings.TrimLeft(s, "+-") == "0" && len(s) <= 2 {
		return new(big.Rat), 0, true
	}
	m := durationRef.FindStringSubmatch(s)
	if m == nil || (m[2] == "" && m[3] == "") {
		return nil, 0, false
	}
	ns = new(big.Rat)
	if m[2] != "" {
		days, _ := new(big.Int).SetString(m[2], 10)
		ns.SetInt(days.Mul(days, big.NewInt(int64(24*time.Hour))))
	}
	for _, p := range durationRefPart.FindAllStringSubmatch(m[3], -1) {
		v, okv := new(big.Rat).SetString(p[1])
		if !okv {
			return nil, 0, false
		}
		ns.Add(ns, v.Mul(v, new(big.Rat).SetInt64(durationUnits[p[2]])))
		parts++
	}
	if m[1] == "-" {
		ns.Neg(ns)
	}
	return ns, parts, true
}

// FuzzParseDuration: a duration flag either fails or means what the text says, to the
// nanosecond (checked with exact arithmetic, so that a wrapped-around value shows: 213504d
// once became 25m26s), and prints back as text that parses to the same value.
func FuzzParseDuration(f *testing.F) {
	for _, seed := range []string{"90s", "7d", "1d12h", " 5m ", "0", "-1", "213504d", "106751d", "106751d23h47m16.854775807s",
		"106751d23h47m16.854775808s", "9223372036854775807ns", "1d-5h", "-0d5m", "+1d", "1.5h", "0.0000000001s", ".5m", "1d1d", "d", "5"} {
		f.Add(seed, false)
	}
	f.Add("-1", true)
	f.Fuzz(func(t *testing.T, s string, forever bool) {
		var d time.Duration
		v := durationValue{d: &d, allowForever: forever}
		if err := v.Set(s); err != nil {
			return
		}
		if forever && strings.TrimSpace(s) == "-1" {
			if d != -1 || v.String() != "-1" {
				t.Fatalf("-1 (forever): %d, %q", d, v.String())
			}
			return
		}
		exact, parts, ok := exactDuration(s)
		if !ok {
			t.Fatalf("Set(%q) = %v, but the text is not a duration", s, d)
		}
		diff := new(big.Rat).Sub(exact, new(big.Rat).SetInt64(int64(d)))
		if diff.Abs(diff).Cmp(new(big.Rat).SetInt64(int64(parts+1))) >= 0 {
			t.Fatalf("Set(%q) = %d ns, but it means %s ns", s, int64(d), exact.FloatString(3))
		}
		back := v.String()
		var d2 time.Duration
		if err := (durationValue{d: &d2}).Set(back); err != nil || d2 != d {
			t.Fatalf("Set(%q) = %v prints as %q, which reads back as %v, %v", s, d, back, d2, err)
		}
	})
}

// FuzzPointInTime: --since and --until either fail or give an RFC 3339 time as written,
// or a duration ago measured from now (never in the future, never wrapped around), and
// print back as a time that reads back to the same second.
func FuzzPointInTime(f *testing.F) {
	for _, seed := range []string{"2h", "7d", "0", "-5m", "2024-04-30T08:00:00+02:00", "2024-04-30T08:00:00.123456789Z",
		"106751d", "106752d", "9999-12-31T23:59:59Z", "0000-01-01T00:00:00Z", "last tuesday", "1d-5h"} {
		f.Add(seed)
	}
	now := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		v := &pointInTime{now: func() time.Time { return now }}
		if err := v.Set(s); err != nil {
			return
		}
		if rfc, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(s)); err == nil {
			if !v.t.Equal(rfc) {
				t.Fatalf("Set(%q) = %v, want %v", s, v.t, rfc)
			}
		} else {
			exact, parts, ok := exactDuration(s)
			if !ok || exact.Sign() < 0 {
				t.Fatalf("Set(%q) = %v, but the text is neither a time nor a duration ago", s, v.t)
			}
			ago := new(big.Rat).SetInt64(int64(now.Sub(v.t)))
			if v.t.After(now) || ago.Sub(ago, exact).Abs(ago).Cmp(new(big.Rat).SetInt64(int64(parts+1))) >= 0 {
				t.Fatalf("Set(%q) = %v: %v before now, but it means %s ns", s, v.t, now.Sub(v.t), exact.FloatString(3))
			}
		}
		if v.t.IsZero() {
			return // the zero time prints as unset
		}
		back := v.String()
		v2 := &pointInTime{now: func() time.Time { return now }}
		if err := v2.Set(back); err != nil || !v2.t.Equal(v.t.Truncate(time.Second)) {
			t.Fatalf("Set(%q) = %v prints as %q, which reads back as %v, %v", s, v.t, back, v2.t, err)
		}
	})
}
