package console

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
)

const (
	// RefreshDefault is the overview's default auto-refresh interval.
	RefreshDefault = 5 * time.Second
	// SessionTTLDefault is how long a login lasts by default.
	SessionTTLDefault = 12 * time.Hour
)

// Config configures a console. Only Admin (or, for a fleet, Outboxes) is required.
type Config struct {
	// Admin is the outbox the console shows and acts on (an *outboxpgx.Driver, ...).
	// Required, unless Outboxes is set.
	Admin outboxdriver.Admin

	// Outboxes, set instead of Admin, makes a fleet console: its overview lists the
	// outboxes Outboxes returns, worst first, and each one's pages (its overview and
	// dead letters, as a console of that outbox alone has them) are under /o/NAME/. It
	// is called on every overview and outbox page, and must be safe for concurrent use.
	// An outbox's charts fill while its page is open: a fleet console samples no outbox
	// in the background.
	Outboxes func() []Outbox

	// RelayStats returns the counters of the relay that serves the console: the overview
	// shows them and derives this relay's throughput from them. Nil (the default) for a
	// console served without a relay, such as `outbox console`.
	RelayStats func() outbox.RelayStats

	// RelayID is the id of the relay that serves the console, marked in the relays
	// table. Optional.
	RelayID string

	// Token is required on every request when set: as "Authorization: Bearer TOKEN", or
	// typed into the login form, which sets a session cookie. It must be at least
	// MinTokenLen characters. Empty (the default) means no authentication, and then the
	// console answers only requests from loopback addresses to a loopback host name; serve
	// it with Listen, which refuses an address beyond loopback without a token.
	Token string

	// SessionTTL is how long a login lasts. Defaults to SessionTTLDefault (12h).
	SessionTTL time.Duration

	// Refresh is the overview's auto-refresh interval. Defaults to RefreshDefault (5s);
	// -1 turns auto-refresh off.
	Refresh time.Duration

	// Logger gets a line for every replay, purge, login, refused request and failed
	// store call. Defaults to slog.Default().
	Logger *slog.Logger

	// Scrub, when set, is applied to every page before it is sent. The CLI passes its
	// secret scrubber, so that no password from its configuration can reach a page even
	// if an error message quotes one.
	Scrub func(string) string
}

// Handler is the console, an http.Handler meant to be served at the root of its own
// address. It is safe for concurrent use.
type Handler struct {
	cfg   Config
	mux   *http.ServeMux
	pages map[string]*template.Template
	css   []byte

	*access // shared by a fleet console with the consoles of its outboxes
	now     func() time.Time
	base    string // the path the outbox's pages are under: "" at the root, "/o/NAME" in a fleet console
	outbox  string // the outbox's name in a fleet console
	fleet   *fleet // nil but in a fleet console's root handler

	storeRate, relayRate sampler
	history              history // the overview's charts
}

// access is what authenticates requests and forms.
type access struct {
	key  []byte // signs sessions and the CSRF token: the token, or random bytes without one
	csrf string // the CSRF token of requests without a session (no token configured)
	cop  *http.CrossOriginProtection

	mu       sync.Mutex
	revoked  map[string]time.Time     // sessions logged out here -> their expiry
	failures map[string]*loginBackoff // remote host -> its failed logins
}

//go:embed templates/*.html static/console.css
var files embed.FS

// New returns a console for cfg.
func New(cfg Config) (*Handler, error) {
	switch {
	case cfg.Admin == nil && cfg.Outboxes == nil:
		return nil, &outbox.ConfigError{Field: "Admin", Reason: "required: the store to show (an *outboxpgx.Driver, ...)"}
	case cfg.Admin != nil && cfg.Outboxes != nil:
		return nil, &outbox.ConfigError{Field: "Outboxes", Reason: "a console shows one outbox (Admin) or a fleet (Outboxes), not both"}
	}
	if cfg.Token != "" && len(cfg.Token) < MinTokenLen {
		return nil, &outbox.ConfigError{Field: "Token", Reason: fmt.Sprintf("must be at least %d characters (openssl rand -hex 32 makes a good one)", MinTokenLen)}
	}
	if cfg.SessionTTL < 0 {
		return nil, &outbox.ConfigError{Field: "SessionTTL", Reason: "must not be negative"}
	}
	if cfg.Refresh < 0 && cfg.Refresh != -1 {
		return nil, &outbox.ConfigError{Field: "Refresh", Reason: "must be positive, 0 for the default, or -1 for no refresh"}
	}
	cfg.SessionTTL = cmp.Or(cfg.SessionTTL, SessionTTLDefault)
	cfg.Refresh = cmp.Or(cfg.Refresh, RefreshDefault)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	h := &Handler{cfg: cfg, now: time.Now, access: &access{cop: http.NewCrossOriginProtection(),
		revoked: map[string]time.Time{}, failures: map[string]*loginBackoff{}}}
	if cfg.Token != "" {
		// Derived from the token, the CSRF token and sessions hold across every relay
		// that serves the console behind one address.
		h.key = []byte(cfg.Token)
	} else {
		h.key = make([]byte, 32)
		rand.Read(h.key)
	}
	h.csrf = h.mac("csrf")

	var err error
	if h.pages, err = parsePages(); err != nil {
		return nil, err
	}
	if h.css, err = fs.ReadFile(files, "static/console.css"); err != nil {
		return nil, err
	}

	if cfg.Outboxes != nil {
		h.fleet = &fleet{members: map[string]*Handler{}}
	}
	h.routes(true)
	return h, nil
}

// routes sets h's mux: an outbox's pages (a single outbox's console, or one outbox's in a
// fleet console) or the fleet's overview, and with root the pages every console has at
// its root (login, logout, the style sheet).
func (h *Handler) routes(root bool) {
	mux := http.NewServeMux()
	if h.fleet != nil {
		mux.HandleFunc("GET /{$}", h.fleetOverview)
		mux.HandleFunc("GET /o/{name}", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, outboxPath(r.PathValue("name"))+"/", http.StatusMovedPermanently)
		})
		mux.HandleFunc("/o/{name}/{rest...}", h.outboxPage)
	} else {
		mux.HandleFunc("GET /{$}", h.overview)
		mux.HandleFunc("GET /dead", h.deadList)
		mux.HandleFunc("GET /dead/confirm", h.deadConfirm)
		mux.HandleFunc("GET /dead/{id}", h.deadShow)
		mux.HandleFunc("POST /dead/replay", h.deadAct)
		mux.HandleFunc("POST /dead/purge", h.deadAct)
	}
	if root {
		mux.HandleFunc("GET /login", h.loginPage)
		mux.HandleFunc("POST /login", h.login)
		mux.HandleFunc("POST /logout", h.logout)
		mux.HandleFunc("GET /static/console.css", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/css; charset=utf-8")
			w.Write(h.css)
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, http.StatusNotFound, "There is no such page.")
	})
	h.mux = mux
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
	h.guard(h.mux).ServeHTTP(w, r)
}

// page is what every template gets: the page's own data and the layout's.
type page struct {
	Title   string
	Nav     string // "overview", "dead" or "outboxes": the highlighted tab
	Base    string // the path of the outbox's pages: "" but in a fleet console
	Outbox  string // the outbox's name in a fleet console; "" on its overview
	Fleet   bool   // a fleet console's page
	CSRF    string
	Logout  bool // logged in with a session cookie: show the log-out button
	Refresh int  // seconds; 0 for no meta refresh
	Data    any
}

// pageTitles are the titles of the templates, by name.
var pageTitles = map[string]string{
	"overview": "Overview", "dead": "Dead letters", "detail": "Dead letter", "confirm": "Confirm",
	"login": "Log in", "error": "Error", "fleet": "Outboxes",
}

func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for name := range pageTitles {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(files, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: parse %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// render renders the template name with data, scrubbed, and sends it with status.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, name string, data any) {
	h.renderPage(w, r, status, name, page{Data: data})
}

func (h *Handler) renderPage(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	p.Title = pageTitles[name]
	p.Base, p.Outbox, p.Fleet = h.base, h.outbox, h.fleet != nil || h.base != ""
	p.CSRF = h.csrfFor(r)
	if h.cfg.Token != "" {
		if c, err := r.Cookie(sessionCookie); err == nil && h.validSession(c.Value, h.now()) {
			p.Logout = true
		}
	}
	var b bytes.Buffer
	if err := h.pages[name].Execute(&b, p); err != nil {
		h.cfg.Logger.Error("console: render", "page", name, "err", err)
		http.Error(w, "the console could not render this page; see the log", http.StatusInternalServerError)
		return
	}
	out := b.String()
	if h.cfg.Scrub != nil {
		out = h.cfg.Scrub(out)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		w.Write([]byte(out))
	}
}

type errorData struct {
	Status  int
	Message string
}

// fail sends an error page.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	h.render(w, r, status, "error", errorData{Status: status, Message: msg})
}

// storeFailed sends the error page for a failed store call, and logs it.
func (h *Handler) storeFailed(w http.ResponseWriter, r *http.Request, what string, err error) {
	h.cfg.Logger.Error("console: "+what, "err", err)
	h.fail(w, r, http.StatusServiceUnavailable, fmt.Sprintf("Could not %s: %v", what, err))
}
