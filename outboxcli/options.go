package outboxcli

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Where a flag's value comes from, strongest first: the command line, the environment
// (OUTBOX_<FLAG_NAME>), the YAML file named by --config or OUTBOX_CONFIG, the default.
// Everything is resolved before a command runs, so a bad value anywhere stops the
// command before it touches a database or a broker, with exit status 2.

// envName is the environment variable of a flag: --batch-size is OUTBOX_BATCH_SIZE.
func envName(flagName string) string {
	return "OUTBOX_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// aliasOf returns the name of the flag f is a one-letter alias of ("file" for -f, whose
// usage begins "the same as --file"), or "" when f is no alias. An alias has no
// environment variable and no config key: its long flag's are the ones.
func aliasOf(f *flag.Flag) string {
	long, ok := strings.CutPrefix(f.Usage, "the same as --")
	if len(f.Name) != 1 || !ok {
		return ""
	}
	name, _, _ := strings.Cut(long, " ")
	return name
}

// aliases maps each flag of fs that has a one-letter alias to the alias: "file" to "f".
func aliases(fs *flag.FlagSet) map[string]string {
	short := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) {
		if long := aliasOf(f); long != "" {
			short[long] = f.Name
		}
	})
	return short
}

// usageError is a mistake in how the command was called or configured: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// notInConfigFile are flags a config file may not set: --config itself, and the
// confirmation of destructive commands, which must be given each time on purpose.
var notInConfigFile = map[string]string{
	"config": "a config file cannot name another one",
	"yes":    "confirmations are given per command, on the command line or in OUTBOX_YES",
	"force":  "confirmations are given per command, on the command line or in OUTBOX_FORCE",
}

// configFile is a parsed --config file: flag name -> values (several for a list).
type configFile struct {
	path   string
	values map[string]configEntry
	// applied are the flags applySources set from the file, for errors found later
	// ("--schema: ..." becomes "outbox.yaml:3: --schema: ...").
	applied map[string]configEntry
	// outboxes is the file's outboxes key, read by `outbox relay` (fleet.go).
	outboxes []outboxItem
	// destinations and routing are the file's keys of those names, read by `outbox
	// relay` (destinations.go).
	destinations []destItem
	routing      []ruleItem
	structured   map[string]bool // the keys of structuredKeys the file has
}

// structuredKeys are the config file's keys that are no flag: each reads its value into
// the configFile.
var structuredKeys = map[string]func(cf *configFile, v *yaml.Node) error{
	"outboxes": func(cf *configFile, v *yaml.Node) (err error) {
		cf.outboxes, err = cf.parseOutboxes(v)
		return err
	},
	"destinations": func(cf *configFile, v *yaml.Node) (err error) {
		cf.destinations, err = cf.parseDestinations(v)
		return err
	},
	"routing": func(cf *configFile, v *yaml.Node) (err error) {
		cf.routing, err = cf.parseRouting(v)
		return err
	},
}

// outboxItem is one entry of a config file's outboxes list: its keys (fleetKeys) and
// its line.
type outboxItem struct {
	line   int
	values map[string]configEntry
}

// configEntry is one key of the file: its values and the line of each, and the key's
// line.
type configEntry struct {
	values []string
	lines  []int
	line   int
}

// at returns "FILE:LINE" of line in cf's file: the form of every error about it, which
// editors and terminals turn into a link.
func (cf *configFile) at(line int) string {
	if line <= 0 {
		return cf.path
	}
	return fmt.Sprintf("%s:%d", cf.path, line)
}

// locate prefixes a usage error about a flag set from the file with the file and line
// of its value, when the error starts with that flag's name ("--schema: ...").
func (cf *configFile) locate(err error) error {
	ue, ok := err.(*usageError)
	if cf == nil || !ok {
		return err
	}
	name, ok := strings.CutPrefix(ue.msg, "--")
	if !ok {
		return err
	}
	if i := strings.IndexFunc(name, func(r rune) bool { return !(r == '-' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9') }); i >= 0 {
		name = name[:i]
	}
	e, ok := cf.applied[name]
	if !ok {
		return err
	}
	line := e.line // a list: the error may be about any item
	if len(e.lines) == 1 {
		line = e.lines[0]
	}
	return &usageError{msg: cf.at(line) + ": " + ue.msg}
}

// yamlLine matches the line yaml.v3 puts in its syntax errors.
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): `)

// loadConfig reads path, a YAML mapping of flag names to values. known holds every
// flag name of every command, so that one file can serve them all: a key that no
// command knows is an error (a typo would otherwise be silently ignored).
func loadConfig(path string, known map[string]bool) (*configFile, error) {
	if path == "" {
		return &configFile{}, nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, usageErrorf("--config: %v", err)
	}
	return parseConfig(path, raw, known)
}

func parseConfig(path string, raw []byte, known map[string]bool) (*configFile, error) {
	cf := &configFile{path: path, values: map[string]configEntry{}, applied: map[string]configEntry{}, structured: map[string]bool{}}
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		// "yaml: line 3: mapping values are not allowed in this context" becomes
		// "outbox.yaml:3: mapping values ..."; without a line, the file alone.
		msg := err.Error()
		if m := yamlLine.FindStringSubmatch(msg); m != nil {
			return nil, usageErrorf("%s:%s: not valid YAML: %s", path, m[1], msg[len(m[0]):])
		}
		return nil, usageErrorf("%s: not valid YAML: %s", path, strings.TrimPrefix(msg, "yaml: "))
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return cf, nil // empty file
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, usageErrorf("%s: want a mapping of flag names to values (database-url: ..., batch-size: 500)", cf.at(root.Line))
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		key := k.Value
		where := cf.at(k.Line)
		if k.Kind != yaml.ScalarNode {
			return nil, usageErrorf("%s: keys must be flag names", where)
		}
		if why, ok := notInConfigFile[key]; ok {
			return nil, usageErrorf("%s: key %q is not allowed in a config file: %s", where, key, why)
		}
		if structured := structuredKeys[key]; structured != nil {
			if cf.structured[key] {
				return nil, usageErrorf("%s: key %q appears twice", where, key)
			}
			if err := structured(cf, v); err != nil {
				return nil, err
			}
			cf.structured[key] = true
			continue
		}
		if !known[key] {
			return nil, usageErrorf("%s: unknown key %q: keys are flag names without the dashes (see outbox help)", where, key)
		}
		if _, dup := cf.values[key]; dup {
			return nil, usageErrorf("%s: key %q appears twice", where, key)
		}
		e, err := cf.entry(key, k, v)
		if err != nil {
			return nil, err
		}
		cf.values[key] = e
	}
	return cf, nil
}

// entry reads the value v of key (at k): a plain value or a non-empty list of them.
func (cf *configFile) entry(key string, k, v *yaml.Node) (configEntry, error) {
	where := cf.at(k.Line)
	e := configEntry{line: k.Line}
	switch v.Kind {
	case yaml.ScalarNode:
		if v.Tag == "!!null" {
			return e, usageErrorf("%s: key %q has no value", where, key)
		}
		e.values, e.lines = []string{v.Value}, []int{v.Line}
	case yaml.SequenceNode:
		for _, item := range v.Content {
			if item.Kind != yaml.ScalarNode {
				return e, usageErrorf("%s: key %q: a list may hold only plain values", cf.at(item.Line), key)
			}
			e.values, e.lines = append(e.values, item.Value), append(e.lines, item.Line)
		}
		if len(e.values) == 0 {
			return e, usageErrorf("%s: key %q has an empty list", where, key)
		}
	default:
		return e, usageErrorf("%s: key %q: want a plain value or a list", where, key)
	}
	return e, nil
}

// parseOutboxes reads the outboxes key: a list of mappings whose keys are fleetKeys.
func (cf *configFile) parseOutboxes(v *yaml.Node) ([]outboxItem, error) {
	if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
		return nil, usageErrorf("%s: key \"outboxes\": want a list of outboxes (- schema: tenant_a)", cf.at(v.Line))
	}
	items := make([]outboxItem, 0, len(v.Content))
	for _, item := range v.Content {
		if item.Kind != yaml.MappingNode || len(item.Content) == 0 {
			return nil, usageErrorf("%s: an outbox is a mapping of settings (- schema: tenant_a)", cf.at(item.Line))
		}
		o := outboxItem{line: item.Line, values: map[string]configEntry{}}
		for i := 0; i+1 < len(item.Content); i += 2 {
			k, val := item.Content[i], item.Content[i+1]
			where := cf.at(k.Line)
			if _, ok := fleetKeys[k.Value]; !ok || k.Kind != yaml.ScalarNode {
				return nil, usageErrorf("%s: %q cannot be set per outbox: an outbox takes %s; the other settings are the process's",
					where, k.Value, strings.Join(sortedKeys(fleetKeys), ", "))
			}
			if _, dup := o.values[k.Value]; dup {
				return nil, usageErrorf("%s: key %q appears twice in one outbox", where, k.Value)
			}
			if val.Kind != yaml.ScalarNode || val.Tag == "!!null" {
				return nil, usageErrorf("%s: key %q: want a plain value", where, k.Value)
			}
			o.values[k.Value] = configEntry{values: []string{val.Value}, lines: []int{val.Line}, line: k.Line}
		}
		if err := cf.checkOutbox(o); err != nil {
			return nil, err
		}
		items = append(items, o)
	}
	return items, nil
}

// checkOutbox checks what an entry of the outboxes list says by itself: its name, its
// patterns, not both schema and schemas, and no name on a rule.
func (cf *configFile) checkOutbox(o outboxItem) error {
	if v, ok := o.values["name"]; ok && !validFleetName(v.values[0]) {
		return usageErrorf("%s: name %q: want letters, digits and . _ - (it becomes a metric label and a log field)", cf.at(v.line), v.values[0])
	}
	for key, example := range map[string]string{"schemas": "tenant_*", "databases": "shop_*"} {
		if v, ok := o.values[key]; ok {
			if _, err := path.Match(v.values[0], ""); err != nil {
				return usageErrorf("%s: %s: %q is not a pattern (want a shell pattern: %s)", cf.at(v.line), key, v.values[0], example)
			}
		}
	}
	if _, ok := o.values["schemas"]; ok {
		if _, both := o.values["schema"]; both {
			return usageErrorf("%s: an outbox has schema (one) or schemas (a rule), not both", cf.at(o.line))
		}
	}
	if ruleOf(o).isRule() {
		if v, ok := o.values["name"]; ok {
			return usageErrorf("%s: name: a rule finds many outboxes, each named database.schema; name only an outbox listed alone", cf.at(v.line))
		}
	}
	return nil
}

// listValue is implemented by flags that may be given several times (--id): from the
// environment their value is split at commas, and in a config file it may be a list.
// The method is exported so that internal/brokers' list settings are lists here too.
type listValue interface {
	flag.Value
	IsList()
}

// applySources fills every flag not given on the command line from the environment,
// then from the config file.
func applySources(fs *flag.FlagSet, env func(string) string, cf *configFile) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || given[f.Name] || f.Name == "config" || aliasOf(f) != "" {
			return
		}
		_, isList := f.Value.(listValue)
		if v := env(envName(f.Name)); v != "" {
			vals := []string{v}
			if isList {
				vals = strings.Split(v, ",")
			}
			for _, s := range vals {
				if e := f.Value.Set(strings.TrimSpace(s)); e != nil {
					err = usageErrorf("--%s: in %s: %s", f.Name, envName(f.Name), valueProblem(f, strings.TrimSpace(s), e))
					return
				}
			}
			return
		}
		if e, ok := cf.values[f.Name]; ok {
			if len(e.values) != 1 && !isList {
				err = usageErrorf("%s: --%s takes one value, not a list", cf.at(e.line), f.Name)
				return
			}
			for i, s := range e.values {
				if e2 := f.Value.Set(s); e2 != nil {
					err = usageErrorf("%s: --%s: %s", cf.at(e.lines[i]), f.Name, valueProblem(f, s, e2))
					return
				}
			}
			cf.applied[f.Name] = e
		}
	})
	return err
}

// parseArgs parses flags and positional arguments in any order ("dead show ID --json"
// as well as "dead show --json ID"). After "--" everything is positional.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, parseError(fs, err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// The flag package's errors name a flag with one dash and say only "parse error" of a
// number that is not one.
var (
	flagValueErr = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for flag -([^:]+): (.*)$`)
	flagUnknown  = regexp.MustCompile(`^flag provided but not defined: -(.*)$`)
	flagNoValue  = regexp.MustCompile(`^flag needs an argument: -(.*)$`)
)

// parseError rewords an error of fs.Parse as the CLI speaks: flags with two dashes, and
// what is wrong with a value.
func parseError(fs *flag.FlagSet, err error) error {
	msg := err.Error()
	if m := flagValueErr.FindStringSubmatch(msg); m != nil {
		if f := fs.Lookup(m[2]); f != nil {
			return usageErrorf("--%s: %s", m[2], valueProblem(f, m[1], errors.New(m[3])))
		}
	}
	if m := flagUnknown.FindStringSubmatch(msg); m != nil {
		return usageErrorf("unknown flag --%s", m[1])
	}
	if m := flagNoValue.FindStringSubmatch(msg); m != nil {
		return usageErrorf("--%s needs a value", m[1])
	}
	return err
}

// valueProblem says what is wrong with s as the value of f, given the error its Set
// returned: the flag package's own number and boolean errors say only "parse error" or
// "value out of range"; the CLI's own value types say what they want themselves.
func valueProblem(f *flag.Flag, s string, err error) string {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return err.Error()
	}
	var want string
	switch g.Get().(type) {
	case bool:
		want = "true or false"
	case int, int64:
		want = "a whole number"
	case uint, uint64:
		want = "a whole number, 0 or more"
	case float64:
		want = "a number"
	case time.Duration:
		want = "a duration such as 500ms, 30s or 5m"
	default:
		return err.Error()
	}
	if strings.Contains(err.Error(), "out of range") {
		return fmt.Sprintf("%q is out of range", s)
	}
	return fmt.Sprintf("%q is not %s", s, want)
}

// ---- flag value types ----

// durationValue is a time.Duration flag that also takes days ("7d") and, when
// allowForever is set, -1 for "forever".
type durationValue struct {
	d            *time.Duration
	allowForever bool
}

func (v durationValue) String() string {
	if v.d == nil {
		return ""
	}
	if *v.d == -1 {
		return "-1"
	}
	return formatDuration(*v.d)
}

func (v durationValue) Set(s string) error {
	if v.allowForever && strings.TrimSpace(s) == "-1" {
		*v.d = -1
		return nil
	}
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	*v.d = d
	return nil
}

// parseDuration is time.ParseDuration plus a whole number of days ("7d", "1d12h").
// maxDays is the most whole days a time.Duration holds (about 292 years).
const maxDays = math.MaxInt64 / int64(24*time.Hour)

func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	whole := s
	var days time.Duration
	if i := strings.IndexByte(s, 'd'); i > 0 {
		// Days are digits only, and what follows them has no sign of its own: "-0d5m"
		// and "1d-5h" once read as +5m and 19h.
		n, err := strconv.Atoi(s[:i])
		if err != nil || strings.TrimLeft(s[:i], "0123456789") != "" || strings.HasPrefix(s[i+1:], "-") || strings.HasPrefix(s[i+1:], "+") {
			return 0, fmt.Errorf("invalid duration %q: want e.g. 30s, 5m, 2h or 7d", s)
		}
		if int64(n) > maxDays {
			return 0, fmt.Errorf("duration %q is too long: at most %dd", whole, maxDays)
		}
		days = time.Duration(n) * 24 * time.Hour
		s = s[i+1:]
		if s == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(s) // fails on overflow itself
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q: want e.g. 30s, 5m, 2h or 7d", s)
	}
	if d > 0 && days > math.MaxInt64-d {
		return 0, fmt.Errorf("duration %q is too long: at most %dd", whole, maxDays)
	}
	return days + d, nil
}

// formatDuration prints whole days as "7d" and the rest as time.Duration does, without
// its zero tails ("1m", not "1m0s").
func formatDuration(d time.Duration) string {
	const day = 24 * time.Hour
	if d > 0 && d%day == 0 {
		return strconv.FormatInt(int64(d/day), 10) + "d"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// optionalInt is an int flag that tells "not given" from any number.
type optionalInt struct {
	n   int
	set bool
}

func (v *optionalInt) String() string {
	if v == nil || !v.set {
		return ""
	}
	return strconv.Itoa(v.n)
}

func (v *optionalInt) Set(s string) error {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return errors.New("not a whole number")
	}
	v.n, v.set = n, true
	return nil
}

// pointInTime is a --since / --until flag: an RFC 3339 time, or a duration meaning
// that long ago ("2h"), measured by this machine's clock when the flag is read.
type pointInTime struct {
	t   time.Time
	now func() time.Time
}

func (v *pointInTime) String() string {
	if v == nil || v.t.IsZero() {
		return ""
	}
	return v.t.Format(time.RFC3339)
}

func (v *pointInTime) Set(s string) error {
	s = strings.TrimSpace(s)
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		v.t = t
		return nil
	}
	d, err := parseDuration(s)
	if err != nil || d < 0 {
		return fmt.Errorf("invalid time %q: want an RFC 3339 time (2024-05-01T12:00:00Z) or a duration ago (90m, 2h, 7d)", s)
	}
	now := time.Now
	if v.now != nil {
		now = v.now
	}
	v.t = now().Add(-d)
	return nil
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }
func (l *stringList) Set(s string) error {
	if s == "" {
		return errors.New("empty value")
	}
	*l = append(*l, s)
	return nil
}
func (l *stringList) IsList() {}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
