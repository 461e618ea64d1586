package outboxcli

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestReadmeListsEveryCommand compares the command list of README.md's CLI feature with
// the command tree `outbox help` shows: every command, each group with its subcommands
// ("`dead list|show|replay|purge`"), and nothing that does not exist.
func TestReadmeListsEveryCommand(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, list, ok := strings.Cut(string(readme), "importable as `outboxcli`): ")
	if ok {
		list, _, ok = strings.Cut(list, " (the torture run")
	}
	if !ok {
		t.Fatal("README.md: no CLI command list (\"importable as `outboxcli`): `demo`, ... (the torture run\")")
	}
	var listed []string
	for _, span := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(list, -1) {
		words := strings.Fields(span[1])
		parent := strings.Join(words[:len(words)-1], " ")
		for _, leaf := range strings.Split(words[len(words)-1], "|") {
			listed = append(listed, strings.TrimSpace(parent+" "+leaf))
		}
	}
	want := []string{"help"} // help is not a command of the tree, but `outbox help` lists it
	var walk func(path string, cs []*command)
	walk = func(path string, cs []*command) {
		for _, c := range cs {
			p := strings.TrimSpace(path + " " + c.name)
			if len(c.subs) == 0 {
				want = append(want, p)
			}
			walk(p, c.subs)
		}
	}
	walk("", commands)
	slices.Sort(listed)
	slices.Sort(want)
	if !slices.Equal(listed, want) {
		t.Errorf("README.md lists the commands\n  %s\nwant, as `outbox help` has them,\n  %s", strings.Join(listed, ", "), strings.Join(want, ", "))
	}
}
