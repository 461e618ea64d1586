// Package tutorial holds the programs of docs/tutorial.md: orders (writes events in the
// order's transaction) and shipping (consumes them with the inbox). This test keeps the
// tutorial's code and the programs the same, so the code a reader copies compiles.
package tutorial

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// TestTutorialShowsThePrograms checks that every Go block of docs/tutorial.md that
// follows a line naming "NAME/main.go" is that program's file, byte for byte.
func TestTutorialShowsThePrograms(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "tutorial.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)`(\\w+)/main\\.go`:\n\n```go\n(.*?)```\n").FindAllSubmatch(doc, -1)
	seen := map[string]bool{}
	for _, b := range blocks {
		name, code := string(b[1]), b[2]
		seen[name] = true
		want, err := os.ReadFile(filepath.Join(name, "main.go"))
		if err != nil {
			t.Errorf("docs/tutorial.md shows %s/main.go, which examples/tutorial lacks: %v", name, err)
			continue
		}
		if string(code) != string(want) {
			t.Errorf("docs/tutorial.md's %s/main.go differs from examples/tutorial/%s/main.go: copy the file into the tutorial", name, name)
		}
	}
	for _, name := range []string{"orders", "shipping"} {
		if !seen[name] {
			t.Errorf("docs/tutorial.md does not show %s/main.go", name)
		}
	}
	if n := len(regexp.MustCompile("(?m)^```go$").FindAll(doc, -1)); n != len(blocks) {
		t.Errorf("docs/tutorial.md has %d Go blocks, %d of them programs of examples/tutorial: every Go block must be one", n, len(blocks))
	}
}
