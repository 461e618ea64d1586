package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// ErrTokenRequired is returned by CheckAddr and Listen for an address beyond loopback
// when no token is set: the console replays and purges dead letters, so it is never
// served to the network without authentication.
var ErrTokenRequired = errors.New("console: serving beyond loopback needs a token")

// MinTokenLen is the shortest token New accepts: the token is the only thing between the
// network and the dead letters, so it must not be guessable.
const MinTokenLen = 16

// CheckAddr checks a listen address (host:port) against the loopback rule: without a
// token the host must be a loopback address (127.0.0.0/8, ::1) or a name that resolves
// only to loopback addresses (localhost). An empty host or an unspecified address
// (0.0.0.0, ::) listens on every interface and is beyond loopback.
func CheckAddr(ctx context.Context, addr, token string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("console: listen address %q: want host:port, e.g. 127.0.0.1:8080", addr)
	}
	if token != "" {
		return nil
	}
	if host == "" {
		return fmt.Errorf("%w: %q listens on every interface", ErrTokenRequired, addr)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if !ip.IsLoopback() {
			return fmt.Errorf("%w: %s is not a loopback address", ErrTokenRequired, host)
		}
		return nil
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("console: listen address %q: %w", addr, err)
	}
	for _, ip := range ips {
		if !ip.Unmap().IsLoopback() {
			return fmt.Errorf("%w: %s resolves to %s, which is not a loopback address", ErrTokenRequired, host, ip)
		}
	}
	return nil
}

// Listen listens on addr after CheckAddr, and checks the address actually bound as well:
// a name that CheckAddr saw resolve to loopback cannot end up on another interface.
func Listen(ctx context.Context, addr, token string) (net.Listener, error) {
	if err := CheckAddr(ctx, addr, token); err != nil {
		return nil, err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("console: listen on %s: %w", addr, err)
	}
	if tcp, ok := ln.Addr().(*net.TCPAddr); token == "" && (!ok || !tcp.IP.IsLoopback()) {
		ln.Close()
		return nil, fmt.Errorf("%w: %s is bound to %s", ErrTokenRequired, addr, ln.Addr())
	}
	return ln, nil
}

// isLoopbackHost reports whether a Host header names this machine by a loopback name or
// address. Without a token the console answers only such requests: a page from another
// site whose name was made to resolve to 127.0.0.1 (DNS rebinding) sends its own name.
func isLoopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// isLoopbackRemote reports whether a request's RemoteAddr is a loopback address.
func isLoopbackRemote(remote string) bool {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return false
	}
	return ap.Addr().Unmap().IsLoopback()
}

// sessionCookie is the name of the login cookie.
const sessionCookie = "outbox_console_session"

// mac returns the HMAC-SHA256 of msg under the handler's key, in hex.
func (h *Handler) mac(msg string) string {
	m := hmac.New(sha256.New, h.key)
	m.Write([]byte(msg))
	return hex.EncodeToString(m.Sum(nil))
}

// equal compares two secrets in constant time, whatever their lengths.
func equal(a, b string) bool {
	ha, hb := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return hmac.Equal(ha[:], hb[:])
}

// newSession returns a session cookie value that expires at exp:
// "v2.EXPIRY.NONCE.MAC". The random nonce sets each login apart: its CSRF token and its
// revocation at logout are its own.
func (h *Handler) newSession(exp time.Time) string {
	e := strconv.FormatInt(exp.Unix(), 10)
	var b [16]byte
	rand.Read(b[:])
	nonce := hex.EncodeToString(b[:])
	return "v2." + e + "." + nonce + "." + h.mac("session|"+e+"|"+nonce)
}

// validSession reports whether v is a session value of this token that has not expired
// and was not logged out here.
func (h *Handler) validSession(v string, now time.Time) bool {
	parts := strings.Split(v, ".")
	if len(parts) != 4 || parts[0] != "v2" {
		return false
	}
	e, nonce, sig := parts[1], parts[2], parts[3]
	exp, err := strconv.ParseInt(e, 10, 64)
	if err != nil || !equal(sig, h.mac("session|"+e+"|"+nonce)) {
		return false
	}
	h.mu.Lock()
	_, revoked := h.revoked[v]
	h.mu.Unlock()
	return now.Unix() < exp && !revoked
}

// csrfFor returns the CSRF token of r's forms: bound to r's session when it has one (a
// token captured from one session is worthless in another), else the handler's.
func (h *Handler) csrfFor(r *http.Request) string {
	if h.cfg.Token != "" {
		if c, err := r.Cookie(sessionCookie); err == nil && h.validSession(c.Value, h.now()) {
			return h.mac("csrf|" + c.Value)
		}
	}
	return h.csrf
}

// revoke refuses session v from now on, in this process (a console served by several
// relays behind one address keeps accepting it on the others until it expires), and
// forgets the revoked sessions that have expired anyway.
func (h *Handler) revoke(v string, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s, exp := range h.revoked {
		if !now.Before(exp) {
			delete(h.revoked, s)
		}
	}
	h.revoked[v] = now.Add(h.cfg.SessionTTL)
}

// Failed logins: from one remote host, loginFreeFailures in a row are answered at once;
// each one after that blocks the next attempt for twice as long as the last, from 1 s up
// to loginMaxBlock, the right token included. A successful login clears the count.
const (
	loginFreeFailures = 5
	loginMaxBlock     = 5 * time.Minute
	loginHostsMax     = 10_000 // remote hosts remembered; the map is cleared when full
)

type loginBackoff struct {
	failures int
	until    time.Time // no attempt from this host is checked before then
}

// loginBlocked returns how long host must still wait before its next login attempt.
func (h *Handler) loginBlocked(host string, now time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if b := h.failures[host]; b != nil && now.Before(b.until) {
		return b.until.Sub(now)
	}
	return 0
}

// loginFailed counts a failed login from host.
func (h *Handler) loginFailed(host string, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	b := h.failures[host]
	if b == nil {
		if len(h.failures) >= loginHostsMax {
			clear(h.failures)
		}
		b = &loginBackoff{}
		h.failures[host] = b
	}
	b.failures++
	if n := b.failures - loginFreeFailures; n > 0 {
		b.until = now.Add(min(time.Second<<min(n-1, 20), loginMaxBlock))
	}
}

// remoteHost is the host part of a request's remote address.
func remoteHost(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// authorize reports how r is authenticated: bearer when it carries the token in an
// Authorization header, session when it carries a valid session cookie. With no token
// configured every request is let through (the loopback checks stand in).
func (h *Handler) authorize(r *http.Request) (ok, bearer bool) {
	if h.cfg.Token == "" {
		return true, false
	}
	if auth := r.Header.Get("Authorization"); auth != "" {
		scheme, tok, _ := strings.Cut(auth, " ")
		return strings.EqualFold(scheme, "Bearer") && equal(strings.TrimSpace(tok), h.cfg.Token), true
	}
	if c, err := r.Cookie(sessionCookie); err == nil {
		return h.validSession(c.Value, h.now()), false
	}
	return false, false
}

// guard is the console's outer layer: security headers on every response, the loopback
// rule without a token, authentication with one, and the CSRF checks on every POST.
func (h *Handler) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("Cache-Control", "no-store")

		if h.cfg.Token == "" && (!isLoopbackRemote(r.RemoteAddr) || !isLoopbackHost(r.Host)) {
			h.cfg.Logger.Warn("console: refused a request without a token from beyond loopback", "remote", r.RemoteAddr, "host", r.Host)
			h.fail(w, r, http.StatusForbidden, "This console has no token, so it answers only requests from this machine addressed to localhost, 127.0.0.1 or [::1]. Set a token to serve it to the network.")
			return
		}
		public := r.URL.Path == "/login" || r.URL.Path == "/static/console.css"
		ok, bearer := h.authorize(r)
		if !ok && !public {
			if bearer {
				w.Header().Set("WWW-Authenticate", `Bearer realm="outbox console", error="invalid_token"`)
				h.fail(w, r, http.StatusUnauthorized, "The bearer token is not this console's token.")
				return
			}
			if r.Method == http.MethodGet || r.Method == http.MethodHead {
				http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="outbox console"`)
			h.fail(w, r, http.StatusUnauthorized, "Log in first.")
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if err := h.cop.Check(r); err != nil {
				h.cfg.Logger.Warn("console: refused a cross-origin request", "remote", r.RemoteAddr, "path", r.URL.Path)
				h.fail(w, r, http.StatusForbidden, "Cross-origin requests are refused.")
				return
			}
			if r.URL.Path != "/login" && !bearer && !equal(r.PostFormValue("csrf"), h.csrfFor(r)) {
				h.cfg.Logger.Warn("console: refused a POST without a valid CSRF token", "remote", r.RemoteAddr, "path", r.URL.Path)
				h.fail(w, r, http.StatusForbidden, "The form's security token is missing or stale: go back, reload the page and try again.")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// localRedirect returns next when it is a path on this server, and "/" otherwise, so that
// the login form cannot be made to send anyone elsewhere.
func localRedirect(next string) string {
	u, err := url.Parse(next)
	if err != nil || next == "" || u.Scheme != "" || u.Host != "" || u.User != nil ||
		!strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") || strings.ContainsAny(next, "\\\r\n") {
		return "/"
	}
	return next
}

func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Token == "" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	h.render(w, r, http.StatusOK, "login", loginData{Next: localRedirect(r.URL.Query().Get("next"))})
}

type loginData struct {
	Next  string
	Error string
}

func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	next := localRedirect(r.PostFormValue("next"))
	if h.cfg.Token == "" {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	host, now := remoteHost(r), h.now()
	if wait := h.loginBlocked(host, now); wait > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(wait.Round(time.Second).Seconds())+1))
		h.render(w, r, http.StatusTooManyRequests, "login", loginData{Next: next,
			Error: fmt.Sprintf("Too many failed logins from your address: try again in %s.", wait.Round(time.Second)+time.Second)})
		return
	}
	if !equal(r.PostFormValue("token"), h.cfg.Token) {
		h.loginFailed(host, now)
		h.cfg.Logger.Warn("console: failed login", "remote", r.RemoteAddr)
		h.render(w, r, http.StatusUnauthorized, "login", loginData{Next: next, Error: "That is not the console's token."})
		return
	}
	h.mu.Lock()
	delete(h.failures, host)
	h.mu.Unlock()
	exp := h.now().Add(h.cfg.SessionTTL)
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: h.newSession(exp), Path: "/", Expires: exp, MaxAge: int(h.cfg.SessionTTL.Seconds()),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: isHTTPS(r),
	})
	h.cfg.Logger.Info("console: login", "remote", r.RemoteAddr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(sessionCookie); err == nil && h.validSession(c.Value, h.now()) {
		h.revoke(c.Value, h.now())
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: isHTTPS(r)})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// isHTTPS reports whether the browser reached the console over HTTPS: directly, or
// through a reverse proxy that says so. Trusting the header can only make the cookie
// stricter (Secure), never weaker.
func isHTTPS(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}
