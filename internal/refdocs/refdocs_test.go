package refdocs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheck: -update writes the page; an equal page passes; a different or missing one
// is an error that names the page, the first differing line and the command to run.
func TestCheck(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	const name = "docs/reference/x.md"
	if err := Check(root, name, []byte("a\nb\n"), false); err == nil || !strings.Contains(err.Error(), name+" is missing: run "+Regenerate) {
		t.Errorf("missing page: got %v", err)
	}
	if err := Check(root, name, []byte("a\nb\n"), true); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, name)); err != nil || string(b) != "a\nb\n" {
		t.Fatalf("written page: %q, %v", b, err)
	}
	if err := Check(root, name, []byte("a\nb\n"), false); err != nil {
		t.Errorf("equal page: %v", err)
	}
	err := Check(root, name, []byte("a\nc\n"), false)
	if err == nil {
		t.Fatal("a different page passed")
	}
	for _, want := range []string{name, Regenerate, "line 2 is\n\tb\nand should be\n\tc"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if err := Check(root, name, []byte("a\nb\nextra\n"), false); err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("a longer page: got %v", err)
	}
}

func TestAnchorAndCell(t *testing.T) {
	t.Parallel()
	if got := anchor("outbox rabbitmq dead list"); got != "outbox-rabbitmq-dead-list" {
		t.Errorf("anchor: %q", got)
	}
	if got := cell("a | b\n  OTEL_*  <x>"); got != `a \| b OTEL_\* &lt;x>` {
		t.Errorf("cell: %q", got)
	}
}

// TestSecretDefaultHidden: a secret flag's default never reaches the page.
func TestSecretDefaultHidden(t *testing.T) {
	t.Parallel()
	root := &Command{Path: "outbox", Subs: []*Command{{Path: "outbox relay", Synopsis: "outbox relay [flags]", Flags: []Flag{
		{Name: "http-token", Type: "string", Default: "s3cr3t", Env: "OUTBOX_HTTP_TOKEN", Secret: true},
	}}}}
	for _, page := range [][]byte{CLI(root), Config(root, nil, nil)} {
		if strings.Contains(string(page), "s3cr3t") {
			t.Errorf("a secret default appears:\n%s", page)
		}
	}
}
