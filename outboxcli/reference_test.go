package outboxcli

import (
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/brokers"
	"github.com/outboxkit/outbox/internal/refdocs"
)

var update = flag.Bool("update", false, "rewrite docs/reference/cli.md and config.md from the command tree")

// TestReferenceDocs renders docs/reference/cli.md and config.md from the flag sets the
// commands parse, as --help does, and fails when the checked-in pages differ: a flag
// added, renamed or redescribed without regenerating would leave the reference wrong.
func TestReferenceDocs(t *testing.T) {
	root, err := referenceTree()
	if err != nil {
		t.Fatal(err)
	}
	for name, page := range map[string][]byte{
		"docs/reference/cli.md":    refdocs.CLI(root),
		"docs/reference/config.md": refdocs.Config(root, notInConfigFile, sortedKeys(fleetKeys)),
	} {
		if err := refdocs.Check("..", name, page, *update); err != nil {
			t.Error(err)
		}
	}
}

// referenceTree describes the command tree for refdocs, each leaf with the flags
// leafFlags defines for a run, so that the docs show what --help shows.
func referenceTree() (*refdocs.Command, error) {
	var build func(path string, c *command) (*refdocs.Command, error)
	build = func(path string, c *command) (*refdocs.Command, error) {
		rc := &refdocs.Command{Path: path, Summary: c.summary, Help: strings.TrimSpace(c.help)}
		if c.setup == nil {
			rc.Synopsis = path + " <command> [flags]"
			for _, s := range c.subs {
				sub, err := build(path+" "+s.name, s)
				if err != nil {
					return nil, err
				}
				rc.Subs = append(rc.Subs, sub)
			}
			return rc, nil
		}
		fs, _, _ := leafFlags(path, c)
		var err error
		short := aliases(fs)
		fs.VisitAll(func(f *flag.Flag) {
			if aliasOf(f) != "" {
				return // a row of its long flag
			}
			typ, e := flagType(f)
			if e != nil && err == nil {
				err = fmt.Errorf("%s --%s: %w", path, f.Name, e)
			}
			placeholder, usage := flag.UnquoteUsage(f)
			rf := refdocs.Flag{Name: f.Name, Placeholder: placeholder, Type: typ, Usage: usage,
				Env: envName(f.Name), Short: short[f.Name], Secret: brokers.IsSecret(f.Name)}
			if showDefault(f) {
				rf.Default = f.DefValue
			}
			rc.Flags = append(rc.Flags, rf)
		})
		rc.Synopsis = leafUsage(path, c, len(rc.Flags) > 0)
		return rc, err
	}
	root, err := build("outbox", &command{name: "outbox", subs: commands})
	if err != nil {
		return nil, err
	}
	root.Help = sourcesHelp
	return root, nil
}

// flagType names what a flag's value must be. A value type it does not know is an
// error, so that a new one is described here rather than shown as nothing.
func flagType(f *flag.Flag) (string, error) {
	switch v := f.Value.(type) {
	case listValue: // by the interface, as applySources tells lists, whoever defines them
		return "string, repeatable", nil
	case *intList:
		return "integers, comma-separated", nil
	case durationValue:
		if v.allowForever {
			return "duration or -1", nil
		}
		return "duration", nil
	case *optionalInt:
		return "int", nil
	case *pointInTime:
		return "RFC 3339 time or duration ago", nil
	case flag.Getter:
		switch v.Get().(type) {
		case bool:
			return "bool", nil
		case int, int64:
			return "int", nil
		case uint, uint64:
			return "uint", nil
		case float64:
			return "float", nil
		case string:
			return "string", nil
		case time.Duration:
			return "duration", nil
		}
	}
	return "", fmt.Errorf("flagType does not know the value type %T: add it", f.Value)
}
