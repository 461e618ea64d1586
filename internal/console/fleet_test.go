package console

import (
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/outboxkit/outbox/internal/testinfra/testdb"
)

// fleetBundle is a fleet console over two migrated outboxes, "a" (quiet) and "b" (dead
// letters and a backlog), and "c", not connected.
type fleetBundle struct {
	*testBundle
	a, b *testdb.DB
	mu   sync.Mutex
	list []Outbox
}

func fleetSetup(t *testing.T, token string) *fleetBundle {
	t.Helper()
	f := &fleetBundle{a: testdb.Migrated(t), b: testdb.Migrated(t)}
	f.list = []Outbox{
		{Name: "a", Admin: f.a.Driver, RelayID: "fleet-relay"},
		{Name: "b", Admin: f.b.Driver, RelayID: "fleet-relay"},
		{Name: "c", State: "not served: connection refused"},
	}
	outboxes := func() []Outbox {
		f.mu.Lock()
		defer f.mu.Unlock()
		return slices.Clone(f.list)
	}
	h, err := New(Config{Outboxes: outboxes, Token: token, Logger: testdb.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	f.testBundle = serveHandler(t, h)
	return f
}

var fleetRowRE = regexp.MustCompile(`<tr data-outbox="([^"]+)"`)

// TestFleetOverview: a fleet console lists its outboxes worst first (a status that
// could not be read, one not connected, then by health), each linked to its own pages;
// the name filter finds one; an outbox's pages and links are under /o/NAME/.
func TestFleetOverview(t *testing.T) {
	t.Parallel()
	f := fleetSetup(t, "")
	addDeadLetters(t, f.b)

	body := f.mustGet(t, "/")
	var rows []string
	for _, m := range fleetRowRE.FindAllStringSubmatch(body, -1) {
		rows = append(rows, m[1])
	}
	if !slices.Equal(rows, []string{"c", "b", "a"}) {
		t.Errorf("rows %v, want c (not connected), b (dead letters, backlog), a:\n%s", rows, body)
	}
	for _, want := range []string{`<a href="/o/b/">b</a>`, `<a href="/o/b/dead">3</a>`, `not served: connection refused`,
		`<meta http-equiv="refresh" content="15">`, `aria-current="page">Outboxes</a>`} {
		if !strings.Contains(body, want) {
			t.Errorf("fleet overview lacks %s:\n%s", want, body)
		}
	}
	if strings.Contains(body, `href="/o/c/"`) {
		t.Errorf("an outbox without a connection is linked:\n%s", body)
	}
	if body := f.mustGet(t, "/?q=b"); len(fleetRowRE.FindAllString(body, -1)) != 1 || !strings.Contains(body, `data-outbox="b"`) {
		t.Errorf("the filter q=b:\n%s", body)
	}

	body = f.mustGet(t, "/o/b/")
	for _, want := range []string{`data-stat="dead">3<`, `href="/o/b/dead?topic=orders"`, `href="/o/b/dead"`, `data-stat="outbox">b<`, `<a href="/">Outboxes</a>`} {
		if !strings.Contains(body, want) {
			t.Errorf("outbox b's overview lacks %s:\n%s", want, body)
		}
	}
	if body := f.mustGet(t, "/o/a/dead"); len(listed(body)) != 0 {
		t.Errorf("outbox a lists dead letters it has not:\n%s", body)
	}
	if r := f.get(t, "/o/b"); r.status != http.StatusMovedPermanently || r.header.Get("Location") != "/o/b/" {
		t.Errorf("GET /o/b: %d to %q", r.status, r.header.Get("Location"))
	}
	for path, want := range map[string]int{"/o/zz/": http.StatusNotFound, "/o/c/": http.StatusServiceUnavailable, "/dead": http.StatusNotFound} {
		if r := f.get(t, path); r.status != want {
			t.Errorf("GET %s: status %d, want %d", path, r.status, want)
		}
	}
}

// TestFleetReplay: a replay through an outbox's confirmation page acts on that outbox
// alone, and comes back to its list.
func TestFleetReplay(t *testing.T) {
	t.Parallel()
	f := fleetSetup(t, "")
	addDeadLetters(t, f.a)
	fb := addDeadLetters(t, f.b)

	body := f.mustGet(t, "/o/b/dead/confirm?do=replay-selected&topic=orders&id="+fb.mid.ID.String())
	m := regexp.MustCompile(`<form method="post" action="([^"]+)"`).FindStringSubmatch(body)
	if m == nil || m[1] != "/o/b/dead/replay" {
		t.Fatalf("confirmation page's form: %v\n%s", m, body)
	}
	form := url.Values{}
	for _, in := range regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`).FindAllStringSubmatch(body, -1) {
		form.Add(in[1], htmlUnescape(in[2]))
	}
	if !strings.Contains(body, `href="/o/b/dead?topic=orders"`) {
		t.Errorf("the confirmation's way back is not outbox b's list:\n%s", body)
	}
	r := f.post(t, m[1], form)
	if r.status != http.StatusSeeOther || r.header.Get("Location") != "/o/b/dead?done=replay&n=1&topic=orders" {
		t.Fatalf("POST %s: %d to %q:\n%s", m[1], r.status, r.header.Get("Location"), r.body)
	}
	if n := f.b.CountIn(t, "outbox_dead", "true"); n != 2 {
		t.Errorf("outbox b: %d dead letters after the replay, want 2", n)
	}
	if n := f.a.CountIn(t, "outbox_dead", "true"); n != 3 {
		t.Errorf("outbox a: %d dead letters after outbox b's replay, want 3", n)
	}
	// A form of one outbox's page does not act on another's.
	r = f.post(t, "/o/a/dead/replay", form)
	if n := f.a.CountIn(t, "outbox_dead", "true"); n != 3 || r.status == http.StatusSeeOther && strings.Contains(r.header.Get("Location"), "n=1") {
		t.Errorf("outbox a: %d dead letters after replaying b's id there (status %d)", n, r.status)
	}
}

// TestFleetToken: a fleet console with a token asks for it on every page, an outbox's
// included, and the login brings the browser back to the page it asked for.
func TestFleetToken(t *testing.T) {
	t.Parallel()
	f := fleetSetup(t, testToken)
	r := f.get(t, "/o/b/dead?topic=orders")
	if r.status != http.StatusSeeOther || r.header.Get("Location") != "/login?next="+url.QueryEscape("/o/b/dead?topic=orders") {
		t.Fatalf("GET an outbox's page without the token: %d to %q", r.status, r.header.Get("Location"))
	}
	if body := f.mustGet(t, "/o/b/", "Authorization", "Bearer "+testToken); !strings.Contains(body, `data-stat="outbox">b<`) {
		t.Errorf("outbox b's overview with the token:\n%s", body)
	}
	if r := f.post(t, "/o/b/dead/purge", url.Values{"do": {"purge-all"}}); r.status != http.StatusUnauthorized {
		t.Errorf("POST without the token: status %d", r.status)
	}
}
