package outbox

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRootImportsStdlibOnly keeps the root package free of third-party imports, so that
// users compile only the drivers and brokers they import. internal/broken (the canaries'
// deliberate bugs) is the one module path allowed: it uses only the standard library.
func TestRootImportsStdlibOnly(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		af, err := parser.ParseFile(fset, f, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			path := strings.Trim(imp.Path.Value, `"`)
			first, _, _ := strings.Cut(path, "/")
			if strings.Contains(first, ".") && !strings.HasPrefix(path, "golang.org/x/sync") && path != "github.com/outboxkit/outbox/internal/broken" {
				t.Errorf("%s imports %s: the root package may import only the standard library", f, path)
			}
		}
	}
}
