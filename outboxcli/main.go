// Package outboxcli is the outbox command line: the relay daemon, schema migrations,
// status, dead letters, the web console, the demo and the benchmark. The outbox command
// (cmd/outbox) is Main and a signal handler; a team that builds its own binary (another
// name, extra build tags) calls Main the same way.
//
//	outbox demo
//	outbox migrate up --database-url postgres://app@db/app
//	outbox relay --database-url postgres://app@db/app --broker nats://nats:4222 --route 'events.{topic}'
//	outbox status --database-url sqlite:///var/lib/app/app.db
//	outbox dead list --topic orders --since 2h
//
// The database URL's scheme picks the store (postgres://, mysql://, sqlite:) and the broker
// URL's the broker. Every flag can also come from the environment (OUTBOX_<FLAG_NAME>) or
// from a YAML file (--config). Exit status: 0 success, 1 failure, 2 usage or configuration
// error. Run `outbox help` for the commands and `outbox <command> --help` for their flags.
//
// Stability: the command line (commands, flags, environment variables, output marked as
// JSON, exit statuses) is the interface; this package's Go API is Main and Version only.
package outboxcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/outboxkit/outbox/internal/brokers"
)

// commands are the top-level commands, in the order `outbox help` lists them. A new
// command is a *command in a file of its own and one entry here (`outbox bench` is
// benchCommand, in bench.go).
var commands = []*command{
	demoCommand,
	relayCommand,
	migrateCommand,
	statusCommand,
	partitionsCommand,
	walCommand,
	deadCommand,
	replayCommand,
	consoleCommand,
	natsCommand,
	rabbitmqCommand,
	benchCommand,
	versionCommand,
}

// A command is a node of the command tree: a group (subs set, like `dead`) or a leaf
// that runs (setup set, like `dead list`).
type command struct {
	name    string
	args    string // positional arguments for the usage line, e.g. "ID"
	summary string // one line, for the parent's list
	help    string // paragraphs after the usage line in --help
	subs    []*command

	// setup defines the leaf's flags on fs and returns the function that runs the
	// command once every flag has its final value. It is called afresh for each run,
	// so the flag variables it closes over belong to that run.
	setup func(fs *flag.FlagSet) runFunc
}

type runFunc func(ctx context.Context, inv *invocation, args []string) error

// invocation is what a running command talks to instead of the process: its output
// streams (scrubbed of secrets) and its environment.
type invocation struct {
	stdout, stderr io.Writer
	env            func(string) string
	secrets        *secrets
	path           string // "outbox dead list"
	// args and config are the leaf command's arguments and config file, for a command
	// that reads its flags again per item (the relay's outboxes).
	args   []string
	config *configFile
}

// Main runs the command line args (without the program's name) and returns the exit
// status: 0 success, 1 failure, 2 usage or configuration error. getenv stands for
// os.Getenv; the output goes to stdout and stderr, scrubbed of the secrets found in the
// flags. Cancelling ctx (SIGTERM, Ctrl-C) stops a running relay gracefully.
func Main(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	return run(ctx, args, getenv, stdout, stderr)
}

// run runs the command line args and returns the exit status: 0 success, 1 failure, 2
// usage or configuration error. env stands for os.Getenv. It is main without the
// process, so that tests run commands in-process.
func run(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) int {
	sec := &secrets{}
	inv := &invocation{
		stdout:  &scrubWriter{w: stdout, secrets: sec},
		stderr:  &scrubWriter{w: stderr, secrets: sec},
		env:     env,
		secrets: sec,
		path:    "outbox",
	}
	root := &command{name: "outbox", subs: commands}
	err := dispatch(ctx, inv, root, args)
	if err == nil {
		return 0
	}
	// The library's errors start with their package ("outbox: ...", "outboxnats: ..."):
	// one "outbox: " is enough.
	fmt.Fprintf(inv.stderr, "outbox: %s\n", strings.TrimPrefix(err.Error(), "outbox: "))
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(inv.stderr, "Run '%s --help' for usage.\n", inv.path)
		return 2
	}
	return 1
}

func isHelp(arg string) bool { return arg == "-h" || arg == "-help" || arg == "--help" }

// dispatch walks args down the command tree and runs the leaf it reaches.
func dispatch(ctx context.Context, inv *invocation, cmd *command, args []string) error {
	if cmd.setup == nil {
		if len(args) == 0 {
			if cmd.name == "outbox" {
				printGroupHelp(inv.stderr, inv.path, cmd)
				return usageErrorf("no command given")
			}
			return usageErrorf("%s needs a command: %s", inv.path, subNames(cmd))
		}
		name := args[0]
		switch {
		case isHelp(name):
			printGroupHelp(inv.stdout, inv.path, cmd)
			return nil
		case name == "help" && cmd.name == "outbox":
			return helpCommand(inv, args[1:])
		}
		sub := findSub(cmd, name)
		if sub == nil {
			return usageErrorf("unknown command %q for %s: want %s", name, inv.path, subNames(cmd))
		}
		inv.path += " " + sub.name
		return dispatch(ctx, inv, sub, args[1:])
	}

	fs, runFn, configPath := leafFlags(inv.path, cmd)
	positional, err := parseArgs(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		printLeafHelp(inv.stdout, inv.path, cmd, fs)
		return nil
	}
	if err != nil {
		return &usageError{msg: err.Error()}
	}
	path := *configPath
	if path == "" && fs.Lookup("config") != nil {
		path = inv.env(envName("config"))
	}
	cf, err := loadConfig(path, knownFlags())
	if err != nil {
		return err
	}
	if err := applySources(fs, inv.env, cf); err != nil {
		return err
	}
	inv.args, inv.config = args, cf
	if f := fs.Lookup("outbox"); f != nil && f.Value.String() != "" {
		if err := selectOutbox(ctx, inv, fs, f.Value.String()); err != nil {
			return err
		}
	}
	// The connection strings are known now: keep their credentials out of all output.
	if f := fs.Lookup("database-url"); f != nil {
		inv.secrets.addDSN(f.Value.String())
	}
	if f := fs.Lookup("broker"); f != nil {
		inv.secrets.addBroker(f.Value.String())
	}
	fs.VisitAll(func(f *flag.Flag) {
		switch {
		case brokers.IsSecret(f.Name):
			inv.secrets.addOpaque(f.Name, f.Value.String())
		case strings.HasSuffix(f.Name, "-endpoint"): // --sqs-endpoint
			inv.secrets.addURL(f.Value.String())
		}
	})
	// A usage error about a flag the config file set names the file and line.
	return cf.locate(runFn(ctx, inv, positional))
}

// leafFlags defines cmd's flags, plus --config when it has any, and returns them with
// its run function.
func leafFlags(path string, cmd *command) (*flag.FlagSet, runFunc, *string) {
	fs := newFlagSet(path)
	runFn := cmd.setup(fs)
	configPath := new(string)
	hasFlags := false
	fs.VisitAll(func(*flag.Flag) { hasFlags = true })
	if hasFlags {
		fs.StringVar(configPath, "config", "", "read flag values from this YAML `file` (keys are flag names)")
	}
	return fs, runFn, configPath
}

func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned and printed once, by run
	fs.Usage = func() {}
	return fs
}

func findSub(cmd *command, name string) *command {
	for _, s := range cmd.subs {
		if s.name == name {
			return s
		}
	}
	return nil
}

func subNames(cmd *command) string {
	names := make([]string, len(cmd.subs))
	for i, s := range cmd.subs {
		names[i] = s.name
	}
	return strings.Join(names, ", ")
}

// knownFlags returns the flag names of every command: the keys a config file may hold.
func knownFlags() map[string]bool {
	known := map[string]bool{}
	var walk func(c *command)
	walk = func(c *command) {
		if c.setup != nil {
			fs := newFlagSet(c.name)
			c.setup(fs)
			fs.VisitAll(func(f *flag.Flag) {
				if aliasOf(f) == "" {
					known[f.Name] = true
				}
			})
		}
		for _, s := range c.subs {
			walk(s)
		}
	}
	for _, c := range commands {
		walk(c)
	}
	return known
}

// helpCommand is `outbox help [command...]`.
func helpCommand(inv *invocation, args []string) error {
	cmd := &command{name: "outbox", subs: commands}
	path := "outbox"
	for _, a := range args {
		sub := findSub(cmd, a)
		if sub == nil {
			return usageErrorf("no help for %q: %s has the commands %s", a, path, subNames(cmd))
		}
		cmd, path = sub, path+" "+a
	}
	if cmd.setup == nil {
		printGroupHelp(inv.stdout, path, cmd)
		return nil
	}
	fs, _, _ := leafFlags(path, cmd)
	printLeafHelp(inv.stdout, path, cmd, fs)
	return nil
}

const sourcesHelp = `Every flag can also be set in the environment, as OUTBOX_ and the flag name in upper
case with _ for - (--database-url is OUTBOX_DATABASE_URL), or in a YAML file given with
--config or OUTBOX_CONFIG, whose keys are the flag names (database-url: ..., batch-size:
500). A flag on the command line beats the environment, which beats the file, which
beats the default.

Exit status: 0 success, 1 failure, 2 usage or configuration error.
`

func printGroupHelp(w io.Writer, path string, cmd *command) {
	if cmd.name == "outbox" {
		fmt.Fprint(w, "outbox runs the transactional outbox relay and operates the outbox: schema, status,\ndead letters.\n\n")
	} else if cmd.help != "" {
		fmt.Fprintf(w, "%s\n\n", strings.TrimSpace(cmd.help))
	}
	fmt.Fprintf(w, "Usage:\n  %s <command> [flags]\n\nCommands:\n", path)
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	for _, s := range cmd.subs {
		fmt.Fprintf(tw, "  %s\t%s\n", s.name, s.summary)
	}
	if cmd.name == "outbox" {
		fmt.Fprintf(tw, "  help\tShow help for a command (outbox help dead replay)\n")
	}
	tw.Flush()
	fmt.Fprintf(w, "\nRun '%s <command> --help' for a command's flags.\n\n%s", path, sourcesHelp)
}

func printLeafHelp(w io.Writer, path string, cmd *command, fs *flag.FlagSet) {
	hasFlags := false
	fs.VisitAll(func(*flag.Flag) { hasFlags = true })
	fmt.Fprintf(w, "Usage:\n  %s\n\n", leafUsage(path, cmd, hasFlags))
	if cmd.help != "" {
		fmt.Fprintf(w, "%s\n\n", strings.TrimSpace(cmd.help))
	}
	if !hasFlags {
		return
	}
	fmt.Fprintf(w, "Flags:\n")
	short := aliases(fs)
	fs.VisitAll(func(f *flag.Flag) {
		if aliasOf(f) != "" {
			return // shown with its long flag
		}
		name, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		if s := short[f.Name]; s != "" {
			line += ", -" + s
			if name != "" {
				line += " " + name
			}
		}
		fmt.Fprintf(w, "%s\n", line)
		for _, l := range strings.Split(usage, "\n") {
			fmt.Fprintf(w, "        %s\n", l)
		}
		extra := "env " + envName(f.Name)
		if showDefault(f) {
			extra = fmt.Sprintf("default %s; %s", f.DefValue, extra)
		}
		fmt.Fprintf(w, "        (%s)\n", extra)
	})
	fmt.Fprintf(w, "\n%s", sourcesHelp)
}

// leafUsage is the usage line of a leaf command, as --help and docs/reference/cli.md
// show it: "outbox dead show [flags] ID".
func leafUsage(path string, cmd *command, hasFlags bool) string {
	usage := path
	if hasFlags {
		usage += " [flags]"
	}
	if cmd.args != "" {
		usage += " " + cmd.args
	}
	return usage
}

func showDefault(f *flag.Flag) bool {
	switch f.DefValue {
	case "", "false", "0", "[]":
		return false
	}
	return true
}
