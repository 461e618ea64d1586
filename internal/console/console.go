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

// Config configures a console. Only Admin is required.
type Config struct {
	// Admin is the outbox the console shows and acts on (an *outboxpgx.Driver, ...).
	// Required.
	Admin outboxdriver.Admin

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

	key  []byte // signs sessions and the CSRF token: the token, or random bytes without one
	csrf string // the CSRF token of requests without a session (no token configured)
	cop  *http.CrossOriginProtection
	now  func() time.Time

	mu       sync.Mutex
	revoked  map[string]time.Time     // sessions logged out here -> their expiry
	failures map[string]*loginBackoff // remote host -> its failed logins

	storeRate, relayRate sampler
	history              history // the overview's charts
}

//go:embed templates/*.html static/console.css
var files embed.FS

// New returns a console for cfg.
func New(cfg Config) (*Handler, error) {
	if cfg.Admin == nil {
		return nil, &outbox.ConfigError{Field: "Admin", Reason: "required: the store to show (an *outboxpgx.Driver, ...)"}
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
	h := &Handler{cfg: cfg, cop: http.NewCrossOriginProtection(), now: time.Now,
		revoked: map[string]time.Time{}, failures: map[string]*loginBackoff{}}
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

	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", h.overview)
	mux.HandleFunc("GET /dead", h.deadList)
	mux.HandleFunc("GET /dead/confirm", h.deadConfirm)
	mux.HandleFunc("GET /dead/{id}", h.deadShow)
	mux.HandleFunc("POST /dead/replay", h.deadAct)
	mux.HandleFunc("POST /dead/purge", h.deadAct)
	mux.HandleFunc("GET /login", h.loginPage)
	mux.HandleFunc("POST /login", h.login)
	mux.HandleFunc("POST /logout", h.logout)
	mux.HandleFunc("GET /static/console.css", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
		w.Write(h.css)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, http.StatusNotFound, "There is no such page.")
	})
	h.mux = mux
	return h, nil
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
	h.guard(h.mux).ServeHTTP(w, r)
}

// page is what every template gets: the page's own data and the layout's.
type page struct {
	Title   string
	Nav     string // "overview" or "dead": the highlighted tab
	CSRF    string
	Logout  bool // logged in with a session cookie: show the log-out button
	Refresh int  // seconds; 0 for no meta refresh
	Data    any
}

// pageTitles are the titles of the templates, by name.
var pageTitles = map[string]string{
	"overview": "Overview", "dead": "Dead letters", "detail": "Dead letter", "confirm": "Confirm",
	"login": "Log in", "error": "Error",
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
