package refdocs

import (
	"fmt"
	"slices"
	"strings"
)

// Command is one command of the outbox CLI as its --help shows it. A group (like
// `outbox dead`) has Subs and no Flags; a leaf (like `outbox dead list`) has Flags.
type Command struct {
	Path     string // "outbox dead list"
	Summary  string // the line the parent's list shows
	Synopsis string // the usage line: "outbox dead show [flags] ID"
	Help     string // the paragraphs --help prints after the usage line
	Subs     []*Command
	Flags    []Flag
}

// Flag is one flag of a leaf command.
type Flag struct {
	Name        string // "batch-size", without dashes
	Placeholder string // the value's name in --help: "n" in "--batch-size n"; empty for a boolean
	Type        string // what the value must be: "int", "duration", "string, repeatable", ...
	Usage       string // the description --help prints, placeholder unquoted
	Default     string // the default --help shows; empty when it shows none
	Env         string // the environment variable: OUTBOX_BATCH_SIZE
	Short       string // a one-letter alias: "f" for -f; empty for none
	// Secret hides the default: a password, secret or token never appears in the docs,
	// even as the empty string, so that nobody learns to expect one there.
	Secret bool
}

// CLI renders cli.md: the command tree, then every command with its synopsis, help and
// flags. root is the `outbox` command itself, whose Help holds what applies to every
// command (where flag values come from, exit statuses).
func CLI(root *Command) []byte {
	var b strings.Builder
	header(&b, "outbox command line reference", "the flag sets of package outboxcli")
	fmt.Fprintf(&b, "Every command of `outbox`, with every flag as `outbox <command> --help` shows it. "+
		"Keys of the config file are the flag names: see [config.md](config.md).\n\n")
	fmt.Fprintf(&b, "%s\n\n", fenced(root.Help))
	b.WriteString("## Commands\n\n")
	walk(root, func(c *Command, depth int) {
		if depth == 0 {
			return
		}
		fmt.Fprintf(&b, "%s- [%s](#%s): %s\n", strings.Repeat("  ", depth-1), c.Path, anchor(c.Path), c.Summary)
	})
	walk(root, func(c *Command, depth int) {
		if depth > 0 {
			writeCommand(&b, c)
		}
	})
	return []byte(b.String())
}

func writeCommand(b *strings.Builder, c *Command) {
	fmt.Fprintf(b, "\n## %s\n\n%s.\n\nUsage: %s\n\n", c.Path, strings.TrimSuffix(c.Summary, "."), code(c.Synopsis))
	if c.Help != "" {
		fmt.Fprintf(b, "%s\n\n", fenced(c.Help))
	}
	if len(c.Subs) > 0 {
		b.WriteString("| Command | What it does |\n|---|---|\n")
		for _, s := range c.Subs {
			fmt.Fprintf(b, "| [%s](#%s) | %s |\n", code(s.Path), anchor(s.Path), cell(s.Summary))
		}
		return
	}
	if len(c.Flags) == 0 {
		b.WriteString("No flags.\n")
		return
	}
	b.WriteString("| Flag | Type | Default | Environment | Description |\n|---|---|---|---|---|\n")
	for _, f := range c.Flags {
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n", code(flagSynopsis(f)), cell(f.Type), code(shownDefault(f)), code(f.Env), cell(f.Usage))
	}
}

// flagSynopsis is the flag as --help lists it: "--batch-size n", "--file file, -f file".
func flagSynopsis(f Flag) string {
	value := ""
	if f.Placeholder != "" {
		value = " " + f.Placeholder
	}
	s := "--" + f.Name + value
	if f.Short != "" {
		s += ", -" + f.Short + value
	}
	return s
}

func shownDefault(f Flag) string {
	if f.Secret {
		return ""
	}
	return f.Default
}

// fenced is help text as --help prints it. Help is written as plain text, with
// indented examples and names like OUTBOX_<FLAG>, so it is shown as it is rather than
// read as Markdown.
func fenced(text string) string {
	return "```text\n" + strings.TrimSpace(text) + "\n```"
}

// walk visits c and its descendants in the order `outbox help` lists them.
func walk(c *Command, visit func(c *Command, depth int)) {
	var rec func(c *Command, depth int)
	rec = func(c *Command, depth int) {
		visit(c, depth)
		for _, s := range c.Subs {
			rec(s, depth+1)
		}
	}
	rec(c, 0)
}

// Config renders config.md: every key the --config file accepts, which is every flag of
// every leaf command, with the flag and environment variable it stands for, its type
// and its default. The relay's keys come first, as the file is mostly the relay's;
// forbidden are the flags a file may not set, with the reason; outboxKeys are the keys
// an entry of the relay's outboxes list may hold.
func Config(root *Command, forbidden map[string]string, outboxKeys []string) []byte {
	var relay *Command
	walk(root, func(c *Command, _ int) {
		if c.Path == "outbox relay" {
			relay = c
		}
	})
	inRelay := map[string]bool{}
	var b strings.Builder
	header(&b, "Config file reference", "the flag sets of package outboxcli")
	b.WriteString("`outbox relay --config FILE` (or `OUTBOX_CONFIG=FILE`) reads flag values from a YAML mapping " +
		"whose keys are the flag names without the dashes: the key `batch-size` sets `--batch-size`. " +
		"A repeatable flag takes a YAML list. The command line beats the environment, which beats the file, " +
		"which beats the default.\n\n")
	b.WriteString("```yaml\n# /etc/outbox/relay.yaml\ndatabase-url: postgres://relay@db:5432/app?sslmode=verify-full\n" +
		"broker: nats://nats-1:4222\nroute: events.{topic}\nbatch-size: 500\nretention: 14d\n```\n\n")
	b.WriteString("One file can serve every command: a command takes the keys it has a flag for and ignores the " +
		"others, and a key that no command knows is an error, so that a typo is not silently ignored. " +
		"[cli.md](cli.md) has each command's flags.\n\n")

	b.WriteString("## Keys of outbox relay\n\n| Key | Flag | Environment | Type | Default | Description |\n|---|---|---|---|---|---|\n")
	if relay != nil {
		for _, f := range relay.Flags {
			if _, no := forbidden[f.Name]; no {
				continue
			}
			inRelay[f.Name] = true
			fmt.Fprintf(&b, "| %s | [%s](cli.md#outbox-relay) | %s | %s | %s | %s |\n",
				code(f.Name), code("--"+f.Name), code(f.Env), cell(f.Type), code(shownDefault(f)), cell(f.Usage))
		}
	}

	b.WriteString("\n## The outboxes list\n\nWith an `outboxes` key, one `outbox relay` process serves many outboxes " +
		"(docs/operations.md, \"Many outboxes from one relay\"). Each entry is a mapping: `schema` names one outbox, " +
		"`schemas` is a rule (a shell pattern: every schema of the database that matches and holds an outbox), " +
		"`databases` is one too (a shell pattern: every database of the server of `database-url` that matches, " +
		"searched for `schema`, or for the `schemas` pattern); rules are applied again every `discover-interval` " +
		"and on SIGHUP. `name` is the outbox's name in logs and metrics (default: database.schema; a rule's " +
		"outboxes keep theirs). An entry's keys beat the command line, the environment and the " +
		"file's top level, which give the defaults of every entry; the other keys are the process's.\n\n```yaml\n" +
		"database-url: postgres://relay@db:5432/app\nbroker: nats://nats-1:4222\noutboxes:\n  - schema: billing\n" +
		"    max-attempts: 5\n  - schemas: tenant_*\n    route: tenants.{topic}\n  - database-url: postgres://relay@db:5432/shop\n" +
		"    schema: public\n    name: shop\n  - databases: service_*\n    schema: outbox\n```\n\nKeys of an entry: ")
	for i, k := range outboxKeys {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(code(k))
	}
	b.WriteString(".\n")

	b.WriteString("\n## Destinations and routing\n\nWith a `destinations` key (a mapping of names to settings) and a " +
		"`routing` key (a list of rules), one `outbox relay` of one outbox publishes to several brokers " +
		"(docs/operations.md, \"Several destinations\"). A destination takes `broker` (required), `route`, the " +
		"`broker-tls-*` keys and its broker's own keys, as the flags of the same names; `--broker` is the " +
		"destination `default`. A rule takes `topic`, `aggregate-type`, `event-type` (exact values or globs), " +
		"`headers` (a mapping of names to values or globs), `destination`, and `route` (a route template for the " +
		"messages it matches, instead of the destination's); the first rule that matches " +
		"a message names its destination, and a message no rule matches goes to `default-destination`.\n\n```yaml\n" +
		"broker: nats://nats-1:4222\ndestinations:\n  audit:\n    broker: amqp://relay@rabbit:5672/\n" +
		"    rabbitmq-exchange: audit\nrouting:\n  - topic: \"payments.*\"\n    destination: audit\n```\n")

	// The other commands' keys, each once, with the commands that read it.
	type use struct {
		flag  Flag
		leafs map[string]bool
		byDef map[string]map[string]bool // default -> leaf paths
		defs  []string                   // the defaults, in tree order
	}
	others := map[string]*use{}
	walk(root, func(c *Command, _ int) {
		for _, f := range c.Flags {
			if _, no := forbidden[f.Name]; no || inRelay[f.Name] {
				continue
			}
			u, ok := others[f.Name]
			if !ok {
				u = &use{flag: f, leafs: map[string]bool{}, byDef: map[string]map[string]bool{}}
				others[f.Name] = u
			}
			u.leafs[c.Path] = true
			d := shownDefault(f)
			if u.byDef[d] == nil {
				u.byDef[d] = map[string]bool{}
				u.defs = append(u.defs, d)
			}
			u.byDef[d][c.Path] = true
		}
	})
	b.WriteString("\n## Keys of the other commands\n\nThe relay ignores these keys; the commands named read them. " +
		"A key the relay has too (`database-url`, `broker`, ...) is in the table above, with the relay's default; " +
		"another command's default for it is in [cli.md](cli.md).\n\n")
	b.WriteString("| Key | Flag | Environment | Type | Default | Commands | Description |\n|---|---|---|---|---|---|---|\n")
	for _, k := range sortedKeys(others) {
		u := others[k]
		def := code(u.defs[0])
		if len(u.defs) > 1 {
			parts := make([]string, len(u.defs))
			for i, d := range u.defs {
				shown := code(d)
				if d == "" {
					shown = "none"
				}
				parts[i] = fmt.Sprintf("%s (%s)", shown, strings.Join(commandNames(root, u.byDef[d], false), ", "))
			}
			def = strings.Join(parts, "; ")
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", code(k), code("--"+k), code(u.flag.Env),
			cell(u.flag.Type), def, strings.Join(commandNames(root, u.leafs, true), ", "), cell(u.flag.Usage))
	}

	b.WriteString("\n## Keys a config file may not hold\n\n| Key | Why |\n|---|---|\n")
	for _, k := range sortedKeys(forbidden) {
		fmt.Fprintf(&b, "| %s | %s |\n", code(k), cell(forbidden[k]))
	}
	return []byte(b.String())
}

// commandNames names the commands in leafs, without "outbox ", in tree order: a group
// whose leaves are all in leafs by the group's name alone ("dead", not its four
// commands), and each linked to its section of cli.md when link is set.
func commandNames(root *Command, leafs map[string]bool, link bool) []string {
	var names []string
	var all func(c *Command) bool
	all = func(c *Command) bool {
		if len(c.Subs) == 0 {
			return leafs[c.Path]
		}
		for _, s := range c.Subs {
			if !all(s) {
				return false
			}
		}
		return true
	}
	var rec func(c *Command)
	rec = func(c *Command) {
		if c != root && all(c) {
			name := strings.TrimPrefix(c.Path, "outbox ")
			if link {
				name = fmt.Sprintf("[%s](cli.md#%s)", name, anchor(c.Path))
			}
			names = append(names, name)
			return
		}
		for _, s := range c.Subs {
			rec(s)
		}
	}
	rec(root)
	return names
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
