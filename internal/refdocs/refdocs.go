// Package refdocs renders the reference pages in docs/reference from models the code
// itself provides: the outbox command's flag sets give cli.md and config.md, and the
// collectors outboxprom registers give metrics.md. The models are built by tests beside
// the code they describe, which can reach its unexported parts (outboxcli's command
// tree) and compare the rendered pages with the checked-in ones, so that a flag or
// metric added without regenerating fails a test instead of leaving the reference wrong.
//
// Regenerate every page with:
//
//	go test ./outboxcli ./outboxprom -run TestReferenceDocs -update
//
// or go generate ./internal/refdocs, which runs the same.
package refdocs

//go:generate go test ../../outboxcli ../../outboxprom -run TestReferenceDocs -update

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Regenerate is the command that rewrites every page; Check's errors name it.
const Regenerate = "go test ./outboxcli ./outboxprom -run TestReferenceDocs -update"

// Check compares got with the page name (docs/reference/cli.md) under the repository's
// root and, when update is set, writes got there instead. A difference is an error that
// names the page, its first differing line and the command to regenerate it, since the
// page is only ever written by that command.
func Check(root, name string, got []byte, update bool) error {
	path := filepath.Join(root, filepath.FromSlash(name))
	if update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		return os.WriteFile(path, got, 0o644)
	}
	have, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s is missing: run %s", name, Regenerate)
	}
	if err != nil {
		return err
	}
	if bytes.Equal(have, got) {
		return nil
	}
	n, h, g := firstDiff(string(have), string(got))
	return fmt.Errorf("%s is not what the code generates: run %s and commit the result\n"+
		"line %d is\n\t%s\nand should be\n\t%s", name, Regenerate, n, h, g)
}

// firstDiff returns the first line (1-based) at which a and b differ, and that line of
// each ("" past the end).
func firstDiff(a, b string) (int, string, string) {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range max(len(la), len(lb)) {
		var x, y string
		if i < len(la) {
			x = la[i]
		}
		if i < len(lb) {
			y = lb[i]
		}
		if x != y || i >= len(la) || i >= len(lb) {
			return i + 1, x, y
		}
	}
	return 0, "", ""
}

// header starts every page: what it is, and that it is generated, so that nobody edits it
// by hand only to see the edit fail the test.
func header(b *strings.Builder, title, source string) {
	fmt.Fprintf(b, "# %s\n\n", title)
	fmt.Fprintf(b, "<!-- Generated from %s by `%s`. Do not edit: edit the code and regenerate. -->\n\n", source, Regenerate)
}

// cell makes text safe for one cell of a Markdown table: one line, no column breaks, and
// no characters that GitHub would read as markup where the text means them literally.
func cell(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	r := strings.NewReplacer(`\`, `\\`, "|", `\|`, "*", `\*`, "<", "&lt;")
	return r.Replace(s)
}

// code is s as inline code, or empty when s is.
func code(s string) string {
	if s == "" {
		return ""
	}
	fence := "`"
	if strings.Contains(s, "`") {
		fence = "`` "
		return fence + strings.ReplaceAll(s, "|", `\|`) + " ``"
	}
	return fence + strings.ReplaceAll(s, "|", `\|`) + fence
}

// anchor is the id GitHub gives a heading: lower case, spaces as dashes, most
// punctuation dropped.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}
