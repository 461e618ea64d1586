package console

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// browserTarget is what a browser makes of a Location header value, in the parts that
// decide where it goes (WHATWG URL parsing): C0 controls and spaces at either end are
// dropped, tabs and newlines anywhere are removed, and a backslash is a slash in an
// http(s) URL.
func browserTarget(location string) string {
	s := strings.TrimFunc(location, func(r rune) bool { return r <= ' ' })
	s = strings.NewReplacer("\t", "", "\n", "", "\r", "").Replace(s)
	return strings.ReplaceAll(s, `\`, "/")
}

// redirectLocation is the Location header the login handler sends for target (after
// http.Redirect's own cleaning).
func redirectLocation(target string) string {
	rec := httptest.NewRecorder()
	http.Redirect(rec, httptest.NewRequest(http.MethodPost, "/login", nil), target, http.StatusSeeOther)
	return rec.Header().Get("Location")
}

// FuzzLocalRedirect: what localRedirect lets through is, as the browser reads the
// Location header sent for it, a path on this server: it starts with one slash, never
// two (//host, \\host, /\host, a tab between them), and has no scheme. Percent-encoded
// slashes (/%2F%2Fhost) stay in the path, where they are harmless.
func FuzzLocalRedirect(f *testing.F) {
	for _, seed := range []string{
		"/dead?topic=orders", "/", "", "dead", "https://evil.example/", "//evil.example/", "/\\evil.example",
		"\\\\evil.example", "javascript:alert(1)", "/\t/evil.example", "/\n/evil.example", " //evil.example",
		"/%2F%2Fevil.example", "/%5C%5Cevil.example", "/./\\evil", "/.//evil.example", "/..//evil.example",
		"http:/evil.example", "/dead/../../\\evil", "\x00//evil.example", "/\x7f/evil", "/\u3000/evil", "/%09/evil.example",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, next string) {
		got := localRedirect(next)
		if got != next && got != "/" {
			t.Fatalf("localRedirect(%q) = %q: neither the target nor /", next, got)
		}
		target := browserTarget(redirectLocation(got))
		if !strings.HasPrefix(target, "/") || strings.HasPrefix(target, "//") {
			t.Fatalf("localRedirect(%q) = %q: the browser goes to %q, off this server", next, got, target)
		}
	})
}
