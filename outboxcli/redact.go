package outboxcli

import (
	"errors"
	"io"
	"net/url"
	"sort"
	"strings"
	"sync"
)

// Connection strings carry passwords, so the CLI never prints one as given. Two layers:
//
//  1. What the CLI itself prints about a connection string is built by redactDSN and
//     redactBroker, which render only an allow-list of parts (scheme, user, hosts,
//     ports, database and harmless parameters); every other value shows as REDACTED.
//     Errors from pgx that could quote the string (parse errors) are replaced, not
//     wrapped.
//  2. Every byte the CLI writes goes through a scrubber that replaces the secret values
//     found in the configured connection strings (passwords, tokens, key material),
//     in case a library quotes one anyway.

const redacted = "REDACTED"

// safeDSNParams are PostgreSQL connection parameters whose values are not secret.
// Anything else (password, sslpassword, sslkey, passfile, options, unknown names) is
// shown as REDACTED.
var safeDSNParams = map[string]bool{
	"host": true, "hostaddr": true, "port": true, "user": true, "dbname": true, "database": true,
	"sslmode": true, "sslrootcert": true, "sslcert": true, "sslsni": true, "sslinline": true, "sslnegotiation": true,
	"channel_binding": true, "require_auth": true, "gssencmode": true, "krbsrvname": true,
	"application_name": true, "connect_timeout": true, "target_session_attrs": true, "search_path": true,
	"min_protocol_version": true, "max_protocol_version": true,
	"statement_cache_capacity": true, "description_cache_capacity": true, "default_query_exec_mode": true,
	"pool_max_conns": true, "pool_min_conns": true, "pool_min_idle_conns": true, "pool_max_conn_lifetime": true,
	"pool_max_conn_lifetime_jitter": true, "pool_max_conn_idle_time": true, "pool_health_check_period": true,
}

var errBadDSN = errors.New("unparseable connection string")

// parsedDSN is a PostgreSQL connection string in either form, split into its parts.
type parsedDSN struct {
	url    *url.URL          // URL form
	params map[string]string // key=value form, or the URL's query (first value of each)
}

func parseDSN(s string) (*parsedDSN, error) {
	s = strings.TrimSpace(s)
	if isURL(s) {
		u, err := url.Parse(s)
		if err != nil {
			return nil, errBadDSN // url's error quotes s
		}
		q, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			return nil, errBadDSN
		}
		p := &parsedDSN{url: u, params: map[string]string{}}
		for k, v := range q {
			p.params[k] = v[0]
		}
		return p, nil
	}
	params, err := parseKeyValues(s)
	if err != nil {
		return nil, err
	}
	return &parsedDSN{params: params}, nil
}

// isURL reports whether s is a connection URL (postgres://, postgresql://, mysql://,
// sqlite:) rather than libpq's key=value form.
func isURL(s string) bool {
	scheme, _, found := strings.Cut(s, ":")
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql", "mysql", "sqlite", "sqlite3":
		return found
	}
	return false
}

// parseKeyValues parses libpq's key=value form: pairs separated by white space, white
// space allowed around '=', values optionally in single quotes, backslash escaping the
// next character.
func parseKeyValues(s string) (map[string]string, error) {
	out := map[string]string{}
	i := 0
	skipSpace := func() {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
			i++
		}
	}
	for {
		skipSpace()
		if i >= len(s) {
			return out, nil
		}
		start := i
		for i < len(s) && s[i] != '=' && s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r' {
			i++
		}
		key := s[start:i]
		skipSpace()
		if key == "" || i >= len(s) || s[i] != '=' {
			return nil, errBadDSN
		}
		i++
		skipSpace()
		var b strings.Builder
		if i < len(s) && s[i] == '\'' {
			i++
			closed := false
			for i < len(s) {
				c := s[i]
				i++
				if c == '\\' && i < len(s) {
					b.WriteByte(s[i])
					i++
					continue
				}
				if c == '\'' {
					closed = true
					break
				}
				b.WriteByte(c)
			}
			if !closed {
				return nil, errBadDSN
			}
		} else {
			for i < len(s) && s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r' {
				c := s[i]
				i++
				if c == '\\' && i < len(s) {
					c = s[i]
					i++
				}
				b.WriteByte(c)
			}
		}
		out[key] = b.String()
	}
}

// redactDSN renders a connection string for logs and messages: scheme, user,
// hosts, ports, database and the parameters in safeDSNParams, with every other value
// (the password above all) replaced by REDACTED. A string it cannot parse is not shown.
func redactDSN(s string) string {
	p, err := parseDSN(s)
	if err != nil {
		return "(unparseable connection string, not shown)"
	}
	if p.url != nil {
		u := p.url
		out := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, Opaque: u.Opaque}
		if u.User != nil {
			if _, has := u.User.Password(); has {
				out.User = url.UserPassword(u.User.Username(), redacted)
			} else {
				out.User = url.User(u.User.Username())
			}
		}
		var q []string
		for _, k := range sortedKeys(p.params) {
			v := p.params[k]
			if !safeDSNParams[k] {
				v = redacted
			}
			q = append(q, url.QueryEscape(k)+"="+url.QueryEscape(v))
		}
		out.RawQuery = strings.Join(q, "&")
		return out.String()
	}
	var parts []string
	for _, k := range sortedKeys(p.params) {
		v := p.params[k]
		if !safeDSNParams[k] {
			v = redacted
		}
		if v == "" || strings.ContainsAny(v, " \t\r\n'\\") {
			v = "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
		}
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, " ")
}

// dsnSecrets returns the secret values of a connection string: the password
// and every parameter not in safeDSNParams. For a string it cannot parse it guesses:
// whatever stands between "://user:" and "@", and after password= or sslpassword=.
func dsnSecrets(s string) []string {
	p, err := parseDSN(s)
	if err != nil {
		return guessSecrets(s)
	}
	var out []string
	if p.url != nil && p.url.User != nil {
		if pw, ok := p.url.User.Password(); ok {
			out = append(out, pw)
		}
	}
	for k, v := range p.params {
		if !safeDSNParams[k] {
			out = append(out, v)
		}
	}
	return out
}

func guessSecrets(s string) []string {
	var out []string
	if _, rest, ok := strings.Cut(s, "://"); ok {
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
				out = append(out, pw)
			}
		}
	}
	for _, key := range []string{"password=", "sslpassword=", "sslkey="} {
		for rest := s; ; {
			i := strings.Index(rest, key)
			if i < 0 {
				break
			}
			rest = rest[i+len(key):]
			v := rest
			if j := strings.IndexAny(v, " &\t\n"); j >= 0 {
				v = v[:j]
			}
			out = append(out, strings.Trim(v, "'"))
		}
	}
	return out
}

// redactBroker renders a broker URL, or a comma-separated list of them, for logs: scheme
// and host; user information shows as REDACTED, because with NATS token authentication
// the "user" is the token.
func redactBroker(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if !strings.Contains(p, "://") { // host:port after the first URL (kafka://a:9092,b:9092)
			p, _, _ = strings.Cut(p, "/")
			p, _, _ = strings.Cut(p, "?")
			if at := strings.LastIndex(p, "@"); at >= 0 {
				p = redacted + p[at:]
			}
			parts[i] = p
			continue
		}
		u, err := url.Parse(p)
		if err != nil || (u.Host == "" && u.Scheme != "sqs") { // sqs://?region=... has no host
			parts[i] = "(unparseable URL, not shown)"
			continue
		}
		out := url.URL{Scheme: u.Scheme, Host: u.Host}
		if u.User != nil {
			if _, has := u.User.Password(); has {
				out.User = url.UserPassword(u.User.Username(), redacted)
			} else {
				out.User = url.User(redacted)
			}
		}
		parts[i] = out.String()
		if u.Host == "" {
			parts[i] = u.Scheme + "://" // sqs:// takes its region from the query or the environment
		}
	}
	return strings.Join(parts, ",")
}

// brokerSecrets returns the user information of every URL in s: passwords and tokens.
func brokerSecrets(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil {
			out = append(out, guessSecrets(p)...)
			continue
		}
		for name, values := range u.Query() {
			if secretParam(name) {
				out = append(out, values...)
			}
		}
		if (u.Scheme == "http" || u.Scheme == "https") && u.Path != "" && u.Path != "/" {
			out = append(out, u.Path, u.EscapedPath()) // a webhook path may hold a token
		}
		if u.User == nil {
			continue
		}
		if pw, ok := u.User.Password(); ok {
			out = append(out, pw)
		} else {
			out = append(out, u.User.Username())
		}
	}
	return out
}

// secretParam reports whether a broker URL's query parameter name looks like it carries
// a credential (password=, auth_token=, secret_key=, ...).
func secretParam(name string) bool {
	name = strings.ToLower(name)
	for _, word := range []string{"pass", "pwd", "token", "secret", "key", "auth", "cred", "sig", "session"} {
		if strings.Contains(name, word) {
			return true
		}
	}
	return false
}

// minSecretLen is the shortest secret the scrubber replaces: shorter ones would blank
// out ordinary words of the output, and are no protection anyway.
const minSecretLen = 4

// secrets is the set of strings the scrubbers remove. It is safe for concurrent use.
type secrets struct {
	mu   sync.RWMutex
	list []string
}

// add1 adds one secret; it fits brokerSettings.secret.
func (s *secrets) add1(v string) { s.add(v) }

func (s *secrets) add(values ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range values {
		// Also the spellings a library might print: percent-encoded as in a URL's query,
		// path or user information.
		userinfo := strings.TrimPrefix(url.UserPassword("", v).String(), ":")
		for _, form := range []string{v, url.QueryEscape(v), url.PathEscape(v), userinfo} {
			if len(form) >= minSecretLen && !contains(s.list, form) {
				s.list = append(s.list, form)
			}
		}
	}
	// Longest first, so that a secret containing another is replaced whole.
	sort.Slice(s.list, func(i, j int) bool { return len(s.list[i]) > len(s.list[j]) })
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

func (s *secrets) scrub(text string) string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, v := range s.list {
		text = strings.ReplaceAll(text, v, redacted)
	}
	return text
}

// scrubWriter writes through to w with every secret replaced. Loggers and fmt write a
// line or a record per call, so a secret is never split across two writes in practice.
type scrubWriter struct {
	mu      sync.Mutex
	w       io.Writer
	secrets *secrets
}

func (sw *scrubWriter) Write(p []byte) (int, error) {
	clean := sw.secrets.scrub(string(p))
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if _, err := io.WriteString(sw.w, clean); err != nil {
		return 0, err
	}
	return len(p), nil
}
