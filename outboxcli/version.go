package outboxcli

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is what `outbox version` prints. The outbox command sets it from its own
// build-time variable (go build -ldflags "-X main.version=v1.2.3"). Empty, the module
// version from the build information is used ("(devel)" in a work tree).
var Version string

var versionCommand = &command{
	name:    "version",
	summary: "Print the version, commit and Go version",
	setup: func(fs *flag.FlagSet) runFunc {
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			v, commit := buildVersion()
			_, err := fmt.Fprintf(inv.stdout, "outbox %s\ncommit %s\ngo     %s\n", v, commit, runtime.Version())
			return err
		}
	},
}

// buildVersion returns the version and the VCS commit (with "-dirty" for a modified work
// tree) this binary was built from, "unknown" for what the build did not record.
func buildVersion() (v, commit string) {
	v, commit = Version, "unknown"
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		if v == "" {
			v = "unknown"
		}
		return v, commit
	}
	if v == "" {
		v = bi.Main.Version
	}
	if v == "" {
		v = "(devel)"
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			commit = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && commit != "unknown" {
		commit += "-dirty"
	}
	return v, commit
}
