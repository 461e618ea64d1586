package outbox

import (
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRootImportsStdlibOnly keeps the root package and the two it is made with
// (outboxdriver, outboxtype) free of third-party imports, so that users compile only the
// drivers and brokers they import. The module paths allowed are those three packages and
// internal/broken (the canaries' deliberate bugs), which use only the standard library.
func TestRootImportsStdlibOnly(t *testing.T) {
	t.Parallel()
	allowed := []string{
		"github.com/outboxkit/outbox/internal/broken",
		"github.com/outboxkit/outbox/outboxdriver",
		"github.com/outboxkit/outbox/outboxtype",
	}
	fset := token.NewFileSet()
	for _, dir := range []string{".", "outboxdriver", "outboxtype"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
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
				if strings.Contains(first, ".") && !slices.Contains(allowed, path) {
					t.Errorf("%s imports %s: the root package, outboxdriver and outboxtype may import only the standard library and each other", f, path)
				}
			}
		}
	}
}

// testInfra are the packages only tests and the torture tool may link: private servers,
// fixtures, the torture harness, fakes of brokers.
var testInfra = []string{
	"github.com/outboxkit/outbox/internal/testinfra", // test servers, fixtures, the torture harness
	"github.com/outboxkit/outbox/outboxtest",         // test helpers for users' tests
	"github.com/outboxkit/outbox/cmd/outbox-torture",
	"github.com/Shopify/toxiproxy",
	"github.com/chromedp",
	// Not nats-server, which `outbox demo` runs in process as its broker, nor kfake, the
	// in-process Kafka that `outbox bench --broker kafka://kfake` measures against.
}

func isTestInfra(pkg string) bool {
	for _, p := range testInfra {
		if strings.HasPrefix(pkg, p) {
			return true
		}
	}
	return strings.HasPrefix(pkg, "github.com/outboxkit/outbox/") && strings.HasSuffix(pkg, "test") // sqlstoretest, ...
}

// TestProductionLinksNoTestInfra keeps test servers, the torture harness and fakes out of
// the outbox command and every package an application imports.
func TestProductionLinksNoTestInfra(t *testing.T) {
	t.Parallel()
	goList := func(format string, pkgs ...string) []string {
		t.Helper()
		out, err := exec.Command("go", append([]string{"list", "-f", format}, pkgs...)...).Output()
		if err != nil {
			t.Fatalf("go list: %v", err)
		}
		return strings.Split(strings.TrimSpace(string(out)), "\n")
	}
	var prod []string
	for _, p := range goList("{{.ImportPath}}", "github.com/outboxkit/outbox/...") {
		if !isTestInfra(p) {
			prod = append(prod, p)
		}
	}
	if !slices.Contains(prod, "github.com/outboxkit/outbox/cmd/outbox") {
		t.Fatalf("the outbox command is not among the production packages: %v", prod)
	}
	// One line a package: its path, then everything it links.
	for _, line := range goList("{{.ImportPath}}{{range .Deps}} {{.}}{{end}}", prod...) {
		pkg, deps, _ := strings.Cut(line, " ")
		for _, dep := range strings.Fields(deps) {
			if isTestInfra(dep) {
				t.Errorf("%s links %s, a test-only package", pkg, dep)
			}
		}
	}
}
