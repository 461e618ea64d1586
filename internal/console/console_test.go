package console

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxtest"
)

const testToken = "console-test-token-0123456789"

// testBundle is a console over a fresh, migrated outbox, served by an httptest server,
// and a client that does not follow redirects.
type testBundle struct {
	db     *testdb.DB
	h      *Handler
	srv    *httptest.Server
	client *http.Client
}

func setup(t *testing.T, cfg Config) *testBundle {
	t.Helper()
	db := testdb.Migrated(t)
	return serve(t, db, cfg)
}

func serve(t *testing.T, db *testdb.DB, cfg Config) *testBundle {
	t.Helper()
	if cfg.Admin == nil {
		cfg.Admin = db.Driver
	}
	if cfg.Logger == nil {
		cfg.Logger = testdb.Logger()
	}
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b := serveHandler(t, h)
	b.db = db
	return b
}

// serveHandler serves h on an httptest server.
func serveHandler(t *testing.T, h *Handler) *testBundle {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := *srv.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &testBundle{h: h, srv: srv, client: &c}
}

type response struct {
	status int
	header http.Header
	body   string
}

// do sends a request; set adds headers (Authorization, Cookie, ...).
func (b *testBundle) do(t *testing.T, method, path string, form url.Values, set ...string) response {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(set); i += 2 {
		req.Header.Set(set[i], set[i+1])
	}
	resp, err := b.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{resp.StatusCode, resp.Header, string(raw)}
}

func (b *testBundle) get(t *testing.T, path string, set ...string) response {
	t.Helper()
	return b.do(t, http.MethodGet, path, nil, set...)
}

// mustGet gets path and fails the test unless the status is 200.
func (b *testBundle) mustGet(t *testing.T, path string, set ...string) string {
	t.Helper()
	r := b.get(t, path, set...)
	if r.status != http.StatusOK {
		t.Fatalf("GET %s: status %d:\n%s", path, r.status, r.body)
	}
	return r.body
}

func (b *testBundle) post(t *testing.T, path string, form url.Values, set ...string) response {
	t.Helper()
	return b.do(t, http.MethodPost, path, form, set...)
}

// deadFixture is three dead letters and one pending message whose error matches the
// filters, so that a filter reaching live rows shows.
type deadFixture struct {
	old, mid, recent, pending outbox.Message
}

func addDeadLetters(t *testing.T, db *testdb.DB) deadFixture {
	t.Helper()
	msg := func(topic, key string) outbox.Message {
		return outbox.Message{ID: outbox.NewID(), Topic: topic, Key: key, EventType: topic + ".event", Payload: []byte(`{"n":1}`)}
	}
	f := deadFixture{old: msg("orders", "k1"), mid: msg("orders", "k2"), recent: msg("billing", "k1"), pending: msg("orders", "k3")}
	f.recent.Payload = []byte{0xff, 0x00, 0xfe, '<', 'b', '>'}
	db.Write(t, f.old, f.mid, f.recent, f.pending)
	db.Kill(t, f.old.ID, 10, "nats: maximum payload exceeded\nsecond line", 3*time.Hour)
	db.Kill(t, f.mid.ID, 10, "publish timeout", time.Hour)
	db.Kill(t, f.recent.ID, 10, "schema mismatch <script>alert(1)</script>", 10*time.Minute)
	db.Exec(t, `UPDATE %[1]s.outbox SET attempts = 2, last_error = 'publish timeout' WHERE id = $1`, f.pending.ID.String())
	return f
}

var rowID = regexp.MustCompile(`<tr data-id="([0-9a-f-]{36})"`)

// listed returns the ids of the table rows of a page, in order.
func listed(body string) []outbox.ID {
	var ids []outbox.ID
	for _, m := range rowID.FindAllStringSubmatch(body, -1) {
		id, err := outbox.ParseID(m[1])
		if err != nil {
			panic(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func TestOverview(t *testing.T) {
	t.Parallel()
	stats := outbox.RelayStats{Published: 7, Rejected: 3, DeadLettered: 1, Shards: 64}
	b := setup(t, Config{RelayID: "relay-under-test", RelayStats: func() outbox.RelayStats { return stats }})
	addDeadLetters(t, b.db)
	b.db.Write(t, outbox.Message{Topic: "shipping", Key: "s1", Payload: []byte(`{}`), Priority: 7})

	body := b.mustGet(t, "/")
	for _, want := range []string{
		`<tr data-priority="7">`, `<tr data-priority="0">`,
		`data-stat="pending">2<`, `data-stat="dead">3<`, `data-stat="retrying">1<`, `data-stat="published">0<`,
		`<tr data-topic="orders">`, `<tr data-topic="billing">`, `<tr data-topic="shipping">`,
		`href="/dead?topic=orders"`, `data-stat="relay-published">7<`, `This relay`, `relay-under-test`,
		`<meta http-equiv="refresh" content="5">`,
		`data-stat="warnings"`, `are due and no relay holds a shard`, `1 message was dead-lettered in the last hour (3 dead letters in all)`, // the others 1 and 3 hours ago
	} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %s:\n%s", want, body)
		}
	}
	if body := b.mustGet(t, "/?refresh=off"); strings.Contains(body, `http-equiv="refresh"`) || !strings.Contains(body, "paused") {
		t.Errorf("?refresh=off still refreshes:\n%s", body)
	}
}

func TestOverviewShowsRelaysAndLeases(t *testing.T) {
	t.Parallel()
	db := testdb.Migrated(t)
	relay, _ := startRelay(t, db, "overview-relay")
	b := serve(t, db, Config{RelayID: relay.ID(), RelayStats: relay.Stats})
	testenv.Await(t, "the relay to lease every shard", func() (any, bool) {
		body := b.mustGet(t, "/")
		_, leased, _ := strings.Cut(body, `data-stat="shards-leased">`)
		leased, _, _ = strings.Cut(leased, "<")
		return "shards leased: " + leased, leased == "64"
	})
	body := b.mustGet(t, "/")
	for _, want := range []string{`<tr data-relay="overview-relay">`, `this relay</span>`, `<span class="ok">live</span>`} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %s:\n%s", want, body)
		}
	}
	if strings.Contains(body, "no relay holds a shard") {
		t.Errorf("overview warns of messages without a relay while one leases every shard:\n%s", body)
	}
}

// TestOverviewShowsRoutingAndDestinations: a relay's fingerprint and the state of each
// of its destinations, as its last heartbeat recorded them.
func TestOverviewShowsRoutingAndDestinations(t *testing.T) {
	t.Parallel()
	db := testdb.Migrated(t)
	down := time.Now().Add(-3 * time.Minute)
	if _, err := db.Driver.SyncLeases(testenv.Context(t), outboxdriver.LeaseRequest{RelayID: "routed-relay", Hostname: "h", PID: 1, TTL: time.Minute,
		Fingerprint: "0a1b2c3d4e5f", Destinations: []outboxdriver.DestinationState{
			{Name: "default", Up: true, Since: down}, {Name: "audit", Since: down}}}); err != nil {
		t.Fatal(err)
	}
	b := serve(t, db, Config{})
	body := b.mustGet(t, "/")
	for _, want := range []string{`0a1b2c3d4e5f`, `<span data-destination="default">default <span class="ok">up</span></span>`,
		`<span data-destination="audit">audit <span class="error-text">down</span> since 3m`} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %s:\n%s", want, body)
		}
	}
}

func TestSamplerRate(t *testing.T) {
	t.Parallel()
	var s sampler
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	check := func(at time.Duration, n int64, want float64, wantOK bool) {
		t.Helper()
		got, ok := s.add(t0.Add(at), n)
		if ok != wantOK || (ok && got != want) {
			t.Errorf("add(%s, %d) = %v, %v; want %v, %v", at, n, got, ok, want, wantOK)
		}
	}
	check(0, 100, 0, false)
	check(500*time.Millisecond, 150, 0, false) // under a second: no rate yet
	check(10*time.Second, 200, 10, true)       // (200-100)/10s
	check(70*time.Second, 800, 10, true)       // (800-200)/60s: the first sample left the window
	check(80*time.Second, 50, 0, false)        // the counter went down: start over
	check(90*time.Second, 150, 10, true)
}

func TestDeadListFilters(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	f := addDeadLetters(t, b.db)
	cases := []struct {
		query string
		want  []outbox.ID
	}{
		{"", []outbox.ID{f.recent.ID, f.mid.ID, f.old.ID}},
		{"topic=orders", []outbox.ID{f.mid.ID, f.old.ID}},
		{"key=k1", []outbox.ID{f.recent.ID, f.old.ID}},
		{"error=TIMEOUT", []outbox.ID{f.mid.ID}},
		{"since=2h", []outbox.ID{f.recent.ID, f.mid.ID}},
		{"until=2h", []outbox.ID{f.old.ID}},
		{"since=" + url.QueryEscape(time.Now().Add(-2*time.Hour).UTC().Format(time.RFC3339)) + "&until=30m", []outbox.ID{f.mid.ID}},
		{"since=" + url.QueryEscape(time.Now().Add(-2*time.Hour).UTC().Format("2006-01-02 15:04")), []outbox.ID{f.recent.ID, f.mid.ID}},
		{"limit=1", []outbox.ID{f.recent.ID}},
		{"topic=nope", nil},
	}
	for _, tc := range cases {
		body := b.mustGet(t, "/dead?"+tc.query)
		if got := listed(body); !slices.Equal(got, tc.want) {
			t.Errorf("/dead?%s: got %v, want %v", tc.query, got, tc.want)
		}
	}
	if body := b.mustGet(t, "/dead?limit=2"); !strings.Contains(body, "3 dead letters; showing the newest 2") || !strings.Contains(body, `value="replay-shown"`) {
		t.Errorf("a limited list does not say it is limited:\n%s", body)
	}
	if body := b.mustGet(t, "/dead?topic=nope"); !strings.Contains(body, `No dead letters match topic=&#34;nope&#34;`) {
		t.Errorf("an empty result is not explained:\n%s", body)
	}
	for _, q := range []string{"since=yesterday", "limit=0", "limit=5000", "since=1h&until=2h", "topic=a%00b", "key=%FF", "error=%C3"} {
		r := b.get(t, "/dead?"+q)
		if r.status != http.StatusBadRequest || !strings.Contains(r.body, `class="error"`) {
			t.Errorf("/dead?%s: status %d, want 400 with the error:\n%s", q, r.status, r.body)
		}
	}
	// The last error is escaped, never markup.
	if body := b.mustGet(t, "/dead"); strings.Contains(body, "<script>") || !strings.Contains(body, "&lt;script&gt;") {
		t.Errorf("the last error is not escaped:\n%s", body)
	}
}

func TestDeadDetail(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	f := addDeadLetters(t, b.db)

	body := b.mustGet(t, "/dead/"+f.old.ID.String())
	for _, want := range []string{f.old.ID.String(), "orders.event", "nats: maximum payload exceeded\nsecond line", `&#34;n&#34;: 1`, "JSON, indented"} {
		if !strings.Contains(body, want) {
			t.Errorf("detail lacks %q:\n%s", want, body)
		}
	}
	// A binary payload shows as hex and base64, its bytes escaped.
	body = b.mustGet(t, "/dead/"+f.recent.ID.String())
	for _, want := range []string{"00000000  ff 00 fe 3c 62 3e", "|...&lt;b&gt;|", "/wD&#43;PGI&#43;", "binary"} {
		if !strings.Contains(body, want) {
			t.Errorf("binary detail lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "<b>") || strings.Contains(body, "<script>") {
		t.Errorf("detail renders payload or error markup:\n%s", body)
	}
	for _, path := range []string{"/dead/" + f.pending.ID.String(), "/dead/not-an-id", "/nowhere"} {
		if r := b.get(t, path); r.status != http.StatusNotFound {
			t.Errorf("GET %s: status %d, want 404", path, r.status)
		}
	}
}

func TestRenderPayload(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("é", textLimit) // 2 bytes each: cut inside a character
	v := renderPayload([]byte(big), "text/plain")
	if !v.Truncated || v.Shown > textLimit || !strings.HasPrefix(big, v.Text) || v.Size != len(big) {
		t.Errorf("large text: truncated %v, shown %d of %d", v.Truncated, v.Shown, v.Size)
	}
	bin := make([]byte, hexLimit+100)
	v = renderPayload(bin, "")
	if !v.Truncated || v.Shown != hexLimit || v.Text != "" || strings.Count(v.Hex, "\n") != hexLimit/16 {
		t.Errorf("large binary: truncated %v, shown %d, %d hex lines", v.Truncated, v.Shown, strings.Count(v.Hex, "\n"))
	}
	if v := renderPayload([]byte("a\x1bb"), "text/plain"); v.Hex == "" {
		t.Errorf("text with an escape character shown as text")
	}
	if v := renderPayload([]byte(`{"a":[1,2]}`), "application/json"); !v.JSON || !strings.Contains(v.Text, "\n  \"a\"") {
		t.Errorf("JSON not indented: %+v", v)
	}
}

// confirmForm gets the confirmation page for query and returns its POST form's action
// and fields, or fails the test.
func (b *testBundle) confirmForm(t *testing.T, query string, set ...string) (string, url.Values, string) {
	t.Helper()
	body := b.mustGet(t, "/dead/confirm?"+query, set...)
	m := regexp.MustCompile(`<form method="post" action="([^"]+)"`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("confirmation page for %s has no POST form:\n%s", query, body)
	}
	form := url.Values{}
	for _, in := range regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`).FindAllStringSubmatch(body, -1) {
		form.Add(in[1], htmlUnescape(in[2]))
	}
	return m[1], form, body
}

func htmlUnescape(s string) string {
	return strings.NewReplacer("&#43;", "+", "&#34;", `"`, "&#39;", "'", "&lt;", "<", "&gt;", ">", "&amp;", "&").Replace(s)
}

func TestReplayThroughConfirmation(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	f := addDeadLetters(t, b.db)

	action, form, body := b.confirmForm(t, "do=replay-selected&topic=orders&id="+f.mid.ID.String())
	if !strings.Contains(body, "You are about to replay 1 dead letter matching id="+f.mid.ID.String()) || action != "/dead/replay" {
		t.Fatalf("confirmation page (action %s):\n%s", action, body)
	}
	if got := listed(body); !slices.Equal(got, []outbox.ID{f.mid.ID}) {
		t.Errorf("preview lists %v", got)
	}
	// Looking at the confirmation changed nothing.
	if n := b.db.CountIn(t, "outbox_dead", "true"); n != 3 {
		t.Fatalf("%d dead letters after the confirmation page, want 3", n)
	}

	r := b.post(t, action, form)
	if r.status != http.StatusSeeOther {
		t.Fatalf("POST %s: status %d:\n%s", action, r.status, r.body)
	}
	loc := r.header.Get("Location")
	if loc != "/dead?done=replay&n=1&topic=orders" {
		t.Errorf("redirect to %q", loc)
	}
	if n := b.db.CountIn(t, "outbox_dead", "true"); n != 2 {
		t.Errorf("%d dead letters after the replay, want 2", n)
	}
	if n := b.db.CountIn(t, "outbox", "id = '"+f.mid.ID.String()+"' AND attempts = 0"); n != 1 {
		t.Errorf("the replayed message is not pending with its attempts reset")
	}
	body = b.mustGet(t, loc)
	if !strings.Contains(body, "Replayed 1 dead letter") || !slices.Equal(listed(body), []outbox.ID{f.old.ID}) {
		t.Errorf("the list after the replay:\n%s", body)
	}
}

func TestReplayAndPurgeScopes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, query string
		wantText    string
		wantLeft    func(f deadFixture) []outbox.ID
	}{
		{"replay the shown", "do=replay-shown&limit=2", "replay the newest 2 dead letters",
			func(f deadFixture) []outbox.ID { return []outbox.ID{f.old.ID} }},
		{"replay all matching", "do=replay-all&topic=orders&limit=1", "replay 2 dead letters matching topic=&#34;orders&#34;",
			func(f deadFixture) []outbox.ID { return []outbox.ID{f.recent.ID} }},
		{"purge matching error", "do=purge-all&error=timeout", "purge 1 dead letter matching error~&#34;timeout&#34;",
			func(f deadFixture) []outbox.ID { return []outbox.ID{f.recent.ID, f.old.ID} }},
		{"purge the shown without a filter", "do=purge-shown&limit=1", "purge the newest dead letter",
			func(f deadFixture) []outbox.ID { return []outbox.ID{f.mid.ID, f.old.ID} }},
		{"purge everything", "do=purge-all", "purge all 3 dead letters",
			func(f deadFixture) []outbox.ID { return nil }},
		{"purge selected", "do=purge-selected&id=%s&id=%s", "purge 2 dead letters matching id=",
			func(f deadFixture) []outbox.ID { return []outbox.ID{f.mid.ID} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{})
			f := addDeadLetters(t, b.db)
			query := tc.query
			if strings.Contains(query, "%s") {
				query = strings.Replace(strings.Replace(query, "%s", f.old.ID.String(), 1), "%s", f.recent.ID.String(), 1)
			}
			action, form, body := b.confirmForm(t, query)
			if !strings.Contains(body, "You are about to "+tc.wantText) {
				t.Errorf("confirmation page does not say %q:\n%s", tc.wantText, body)
			}
			if r := b.post(t, action, form); r.status != http.StatusSeeOther {
				t.Fatalf("POST %s: status %d:\n%s", action, r.status, r.body)
			}
			if got, want := listed(b.mustGet(t, "/dead")), tc.wantLeft(f); !slices.Equal(got, want) {
				t.Errorf("left %v, want %v", got, want)
			}
			if n := b.db.CountIn(t, "outbox", "id = '"+f.pending.ID.String()+"'"); n != 1 {
				t.Errorf("the pending message was touched")
			}
		})
	}
}

func TestConfirmationErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	addDeadLetters(t, b.db)
	for _, q := range []string{"do=replay-selected", "do=explode-all", "do=replay-everything", "do=purge-selected&id=nope", "do=purge-all&since=soon", "do=purge-all&topic=%00"} {
		if r := b.get(t, "/dead/confirm?"+q); r.status != http.StatusBadRequest || strings.Contains(r.body, `method="post" action="/dead`) {
			t.Errorf("/dead/confirm?%s: status %d, want 400 without a form:\n%s", q, r.status, r.body)
		}
	}
	body := b.mustGet(t, "/dead/confirm?do=replay-all&topic=nope")
	if !strings.Contains(body, "Nothing to replay: no dead letters match topic=&#34;nope&#34;") || strings.Contains(body, `method="post" action="/dead`) {
		t.Errorf("empty confirmation:\n%s", body)
	}
}

func TestCSRF(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	f := addDeadLetters(t, b.db)
	action, form, _ := b.confirmForm(t, "do=purge-all")

	attempts := []struct {
		name   string
		form   url.Values
		header []string
	}{
		{"no token", without(form, "csrf"), nil},
		{"wrong token", with(form, "csrf", strings.Repeat("0", 64)), nil},
		{"cross-site, right token", form, []string{"Sec-Fetch-Site", "cross-site"}},
		{"other origin, right token", form, []string{"Origin", "http://evil.example"}},
	}
	for _, a := range attempts {
		r := b.post(t, action, a.form, a.header...)
		if r.status != http.StatusForbidden {
			t.Errorf("%s: status %d, want 403:\n%s", a.name, r.status, r.body)
		}
	}
	// A token in the query string does not count: only the form body does.
	if r := b.post(t, action+"?csrf="+form.Get("csrf"), without(form, "csrf")); r.status != http.StatusForbidden {
		t.Errorf("token in the query: status %d, want 403", r.status)
	}
	if n := b.db.CountIn(t, "outbox_dead", "true"); n != 3 {
		t.Fatalf("%d dead letters after refused purges, want 3", n)
	}
	// A form for one action cannot be posted to the other.
	if r := b.post(t, "/dead/replay", form); r.status != http.StatusBadRequest {
		t.Errorf("purge form posted to replay: status %d, want 400", r.status)
	}
	// The same form, as sent by the browser from the page, goes through.
	if r := b.post(t, action, form, "Sec-Fetch-Site", "same-origin", "Origin", b.srv.URL); r.status != http.StatusSeeOther {
		t.Fatalf("same-origin POST: status %d:\n%s", r.status, r.body)
	}
	if n := b.db.CountIn(t, "outbox_dead", "true"); n != 0 {
		t.Errorf("%d dead letters after the purge, want 0", n)
	}
	_ = f
}

func without(v url.Values, key string) url.Values {
	out := url.Values{}
	for k, vs := range v {
		if k != key {
			out[k] = vs
		}
	}
	return out
}

func with(v url.Values, key, value string) url.Values {
	out := without(v, key)
	out.Set(key, value)
	return out
}

func TestTokenAuth(t *testing.T) {
	t.Parallel()
	var logs testenv.Buffer
	b := setup(t, Config{Token: testToken, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	addDeadLetters(t, b.db)
	bearer := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

	// Without the token: pages redirect to the login form, POSTs are refused.
	r := b.get(t, "/dead?topic=orders")
	if r.status != http.StatusSeeOther || r.header.Get("Location") != "/login?next="+url.QueryEscape("/dead?topic=orders") {
		t.Errorf("GET without a token: status %d, location %q", r.status, r.header.Get("Location"))
	}
	if r := b.post(t, "/dead/purge", url.Values{"do": {"purge-all"}, "csrf": {b.h.csrf}}); r.status != http.StatusUnauthorized {
		t.Errorf("POST without a token: status %d, want 401", r.status)
	}
	if r := b.get(t, "/", bearer(testToken+"x")...); r.status != http.StatusUnauthorized {
		t.Errorf("wrong bearer token: status %d, want 401", r.status)
	}
	if r := b.get(t, "/", "Cookie", sessionCookie+"=v1.99999999999.0000"); r.status != http.StatusSeeOther {
		t.Errorf("forged cookie: status %d, want a redirect to log in", r.status)
	}
	expired := b.h.newSession(time.Now().Add(-time.Minute))
	if r := b.get(t, "/", "Cookie", sessionCookie+"="+expired); r.status != http.StatusSeeOther {
		t.Errorf("expired session: status %d, want a redirect to log in", r.status)
	}
	other, _ := New(Config{Admin: b.db.Driver, Token: testToken + "-other"})
	if r := b.get(t, "/", "Cookie", sessionCookie+"="+other.newSession(time.Now().Add(time.Hour))); r.status != http.StatusSeeOther {
		t.Errorf("session of another token: status %d, want a redirect to log in", r.status)
	}
	if n := b.db.CountIn(t, "outbox_dead", "true"); n != 3 {
		t.Fatalf("%d dead letters, want 3", n)
	}

	// The bearer token opens every page, and a POST needs no CSRF field with it.
	b.mustGet(t, "/", bearer(testToken)...)
	if r := b.post(t, "/dead/replay", url.Values{"action": {"replay"}, "scope": {"all"}, "topic": {"billing"}}, bearer(testToken)...); r.status != http.StatusSeeOther {
		t.Errorf("POST with the bearer token: status %d:\n%s", r.status, r.body)
	}

	// The login form: a wrong token is refused, the right one sets a session cookie.
	if r := b.post(t, "/login", url.Values{"token": {"guess-guess-guess-guess"}, "next": {"/dead"}}); r.status != http.StatusUnauthorized || !strings.Contains(r.body, "not the console") {
		t.Errorf("login with a wrong token: status %d:\n%s", r.status, r.body)
	}
	r = b.post(t, "/login", url.Values{"token": {testToken}, "next": {"/dead?topic=orders"}})
	if r.status != http.StatusSeeOther || r.header.Get("Location") != "/dead?topic=orders" {
		t.Fatalf("login: status %d, location %q", r.status, r.header.Get("Location"))
	}
	cookies := (&http.Response{Header: r.header}).Cookies()
	if len(cookies) != 1 || !cookies[0].HttpOnly || cookies[0].SameSite != http.SameSiteStrictMode || cookies[0].Name != sessionCookie {
		t.Fatalf("login cookie: %+v", cookies)
	}
	session := []string{"Cookie", sessionCookie + "=" + cookies[0].Value}
	body := b.mustGet(t, "/dead", session...)
	if !strings.Contains(body, "Log out") {
		t.Errorf("logged-in page has no log-out button")
	}
	// With the cookie, a POST still needs the CSRF field.
	action, form, _ := b.confirmForm(t, "do=purge-all", session...)
	if r := b.post(t, action, without(form, "csrf"), session...); r.status != http.StatusForbidden {
		t.Errorf("cookie POST without CSRF: status %d, want 403", r.status)
	}
	if r := b.post(t, action, form, session...); r.status != http.StatusSeeOther {
		t.Errorf("cookie POST with CSRF: status %d:\n%s", r.status, r.body)
	}

	// The login form never sends anyone off the console.
	for _, next := range []string{"https://evil.example/", "//evil.example/", "/\\evil.example", "javascript:alert(1)"} {
		r := b.post(t, "/login", url.Values{"token": {testToken}, "next": {next}})
		if loc := r.header.Get("Location"); loc != "/" {
			t.Errorf("login with next=%q redirects to %q", next, loc)
		}
	}

	// Nothing ever shows the token: not the pages, not the log.
	for _, path := range []string{"/", "/dead", "/login", "/login?next=/dead", "/dead/confirm?do=replay-all"} {
		for _, set := range [][]string{nil, session} {
			if r := b.get(t, path, set...); strings.Contains(r.body, testToken) {
				t.Errorf("GET %s shows the token", path)
			}
		}
	}
	if strings.Contains(logs.String(), testToken) {
		t.Errorf("the log shows the token:\n%s", logs.String())
	}
	if b.h.csrf == testToken || strings.Contains(b.h.csrf, testToken) {
		t.Errorf("the CSRF token is the token")
	}
}

func TestNoTokenAnswersOnlyLoopback(t *testing.T) {
	t.Parallel()
	db := testdb.Migrated(t)
	h, err := New(Config{Admin: db.Driver, Logger: testdb.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		remote, host string
		want         int
	}{
		{"127.0.0.1:5000", "127.0.0.1:8080", http.StatusOK},
		{"[::1]:5000", "[::1]:8080", http.StatusOK},
		{"127.0.0.1:5000", "localhost:8080", http.StatusOK},
		{"192.0.2.7:5000", "127.0.0.1:8080", http.StatusForbidden},      // from another machine
		{"127.0.0.1:5000", "rebind.example:8080", http.StatusForbidden}, // DNS rebinding
		{"127.0.0.1:5000", "192.0.2.1:8080", http.StatusForbidden},
	}
	for _, tc := range cases {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr, req.Host = tc.remote, tc.host
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != tc.want {
			t.Errorf("remote %s, host %s: status %d, want %d", tc.remote, tc.host, w.Code, tc.want)
		}
	}
}

func TestCheckAddr(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, addr := range []string{"127.0.0.1:8080", "127.1.2.3:80", "[::1]:8080", "localhost:0"} {
		if err := CheckAddr(ctx, addr, ""); err != nil {
			t.Errorf("CheckAddr(%s) without a token: %v", addr, err)
		}
	}
	for _, addr := range []string{":8080", "0.0.0.0:8080", "[::]:8080", "192.0.2.1:8080"} {
		if err := CheckAddr(ctx, addr, ""); !errors.Is(err, ErrTokenRequired) {
			t.Errorf("CheckAddr(%s) without a token: %v, want ErrTokenRequired", addr, err)
		}
		if err := CheckAddr(ctx, addr, testToken); err != nil {
			t.Errorf("CheckAddr(%s) with a token: %v", addr, err)
		}
	}
	if err := CheckAddr(ctx, "8080", ""); err == nil || errors.Is(err, ErrTokenRequired) {
		t.Errorf("CheckAddr without a port separator: %v", err)
	}
	ln, err := Listen(ctx, "localhost:0", "")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if !isLoopbackRemote(ln.Addr().String()) {
		t.Errorf("Listen(localhost:0) bound %s", ln.Addr())
	}
	if _, err := Listen(ctx, "0.0.0.0:0", ""); !errors.Is(err, ErrTokenRequired) {
		t.Errorf("Listen(0.0.0.0:0) without a token: %v", err)
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	db := testdb.Migrated(t)
	for _, cfg := range []Config{
		{},
		{Admin: db.Driver, Token: "short"},
		{Admin: db.Driver, SessionTTL: -time.Second},
		{Admin: db.Driver, Refresh: -2 * time.Second},
	} {
		if _, err := New(cfg); !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("New(%+v): %v, want a ConfigError", cfg, err)
		}
	}
}

func TestSecurityHeadersAndScrub(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Scrub: func(s string) string { return strings.ReplaceAll(s, "orders", "REDACTED") }})
	addDeadLetters(t, b.db)
	r := b.get(t, "/dead")
	for k, want := range map[string]string{
		"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store",
		"Content-Type": "text/html; charset=utf-8",
	} {
		if got := r.header.Get(k); got != want {
			t.Errorf("%s: %q, want %q", k, got, want)
		}
	}
	if csp := r.header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("CSP %q", csp)
	}
	if strings.Contains(r.body, "orders") || !strings.Contains(r.body, "REDACTED") {
		t.Errorf("Scrub not applied to the page")
	}
	if r := b.get(t, "/static/console.css"); r.status != http.StatusOK || !strings.HasPrefix(r.header.Get("Content-Type"), "text/css") {
		t.Errorf("stylesheet: status %d, type %q", r.status, r.header.Get("Content-Type"))
	}
}

func TestStoreErrorsArePages(t *testing.T) {
	t.Parallel()
	b := serve(t, nil, Config{Admin: failingAdmin{}, Logger: testdb.Logger()})
	for _, path := range []string{"/", "/dead", "/dead/confirm?do=replay-all"} {
		r := b.get(t, path)
		if r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "database is down") {
			t.Errorf("GET %s: status %d:\n%s", path, r.status, r.body)
		}
	}
}

type failingAdmin struct{}

var errDown = errors.New("database is down")

func (failingAdmin) Status(context.Context) (outboxdriver.Status, error) {
	return outboxdriver.Status{}, errDown
}
func (failingAdmin) DeadList(context.Context, outboxdriver.DeadFilter) ([]outboxdriver.DeadLetter, error) {
	return nil, errDown
}
func (failingAdmin) DeadCount(context.Context, outboxdriver.DeadFilter) (int, error) {
	return 0, errDown
}
func (failingAdmin) DeadReplay(context.Context, outboxdriver.DeadFilter) (int, error) {
	return 0, errDown
}
func (failingAdmin) DeadPurge(context.Context, outboxdriver.DeadFilter) (int, error) {
	return 0, errDown
}
func (failingAdmin) DeadPurgeAll(context.Context) (int, error) { return 0, errDown }

// TestLoginSessions: failed logins from one address slow down, the right token
// included; each login's CSRF token is its own; a logged-out session is refused.
func TestLoginSessions(t *testing.T) {
	t.Parallel()
	db := testdb.Migrated(t)
	h, err := New(Config{Admin: db.Driver, Token: testToken, Logger: testdb.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	h.now = func() time.Time { return time.Unix(0, clock.Load()) }
	advance := func(d time.Duration) { clock.Add(int64(d)) }
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := *srv.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	b := &testBundle{db: db, h: h, srv: srv, client: &c}
	addDeadLetters(t, db)

	login := func() []string {
		t.Helper()
		r := b.post(t, "/login", url.Values{"token": {testToken}, "next": {"/"}})
		cookies := (&http.Response{Header: r.header}).Cookies()
		if r.status != http.StatusSeeOther || len(cookies) != 1 {
			t.Fatalf("login: status %d, cookies %v:\n%s", r.status, cookies, r.body)
		}
		return []string{"Cookie", sessionCookie + "=" + cookies[0].Value}
	}

	// Five wrong tokens are answered; the sixth blocks the address for a second, even
	// for the right token, then two, ...
	for i := range loginFreeFailures + 1 {
		if r := b.post(t, "/login", url.Values{"token": {"guess"}}); r.status != http.StatusUnauthorized {
			t.Fatalf("wrong login %d: status %d", i+1, r.status)
		}
	}
	r := b.post(t, "/login", url.Values{"token": {testToken}})
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" {
		t.Fatalf("login while blocked: status %d, Retry-After %q", r.status, r.header.Get("Retry-After"))
	}
	advance(time.Second)
	if r := b.post(t, "/login", url.Values{"token": {"guess"}}); r.status != http.StatusUnauthorized {
		t.Fatalf("login after the block: status %d", r.status)
	}
	if r := b.post(t, "/login", url.Values{"token": {testToken}}); r.status != http.StatusTooManyRequests {
		t.Fatalf("login right after the seventh failure: status %d, want 429 (2 s)", r.status)
	}
	advance(2 * time.Second)
	one := login() // clears the count
	if r := b.post(t, "/login", url.Values{"token": {"guess"}}); r.status != http.StatusUnauthorized {
		t.Fatalf("a failure after a login is blocked: status %d", r.status)
	}

	// Two sessions, two CSRF tokens: one session's does not work with the other's cookie.
	two := login()
	action, formOne, _ := b.confirmForm(t, "do=replay-all&topic=orders", one...)
	_, formTwo, _ := b.confirmForm(t, "do=replay-all&topic=orders", two...)
	if formOne.Get("csrf") == formTwo.Get("csrf") || formOne.Get("csrf") == h.csrf {
		t.Fatalf("the sessions share a CSRF token")
	}
	if r := b.post(t, action, formOne, two...); r.status != http.StatusForbidden {
		t.Errorf("session one's form with session two's cookie: status %d, want 403", r.status)
	}

	// Logging out ends the session: its cookie no longer opens a page.
	b.mustGet(t, "/", one...)
	if r := b.post(t, "/logout", url.Values{"csrf": {formOne.Get("csrf")}}, one...); r.status != http.StatusSeeOther {
		t.Fatalf("logout: status %d:\n%s", r.status, r.body)
	}
	if r := b.get(t, "/", one...); r.status != http.StatusSeeOther {
		t.Errorf("a logged-out session: status %d, want a redirect to log in", r.status)
	}
	b.mustGet(t, "/", two...)
}

// The throughput card spans the last minute from the console's own readings, with no page
// loaded in that minute: the relay published 100 messages every 10 s, so 10/s.
func TestThroughputFromBackgroundSamples(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var published atomic.Int64
		h, err := New(Config{Admin: outboxtest.NewStore(outboxtest.StoreConfig{}), Logger: slog.New(slog.DiscardHandler),
			RelayID: "r", RelayStats: func() outbox.RelayStats { return outbox.RelayStats{Published: published.Load()} }})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); h.Sample(ctx) }()
		for range 7 {
			synctest.Wait()
			published.Add(100)
			time.Sleep(sampleEvery)
		}
		synctest.Wait()
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "http://127.0.0.1/", nil)
		req.RemoteAddr = "127.0.0.1:40000" // a console without a token answers only this machine
		h.ServeHTTP(rec, req)
		if body := rec.Body.String(); !strings.Contains(body, `data-stat="relay-rate">10/s<`) {
			t.Errorf("overview after a minute of background readings lacks relay-rate 10/s:\n%s", body)
		}
		cancel()
		<-done
	})
}
