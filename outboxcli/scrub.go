package outboxcli

import (
	"io"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// The scrubber: the second layer described in redact.go. It knows every credential of
// the configured connection strings in the places output could carry it, and replaces
// the secret there, whatever its length:
//
//   - a URL's user information, as written, percent-encoded as Go prints a URL, and
//     decoded: "app:pw@" becomes "app:REDACTED@"; a token in the user name (NATS token
//     authentication) after the "//": "//tok@" becomes "//REDACTED@";
//   - a parameter that carries a credential (every DSN parameter but the harmless ones
//     of safeDSNParams; a broker URL's password=, auth_token=, secret_key=...; every
//     parameter of a webhook URL, whose query often holds the receiver's token; one
//     whose value is itself a URL with user information), as written, encoded and
//     decoded: "password=pw" becomes "password=REDACTED"; the name followed by "=",
//     ": " or a space and the value, quoted or not ("password 'pw'");
//   - a webhook URL's path, which may hold a token (/services/T000/B000/XXXX), after its
//     host: "hooks.example/services/T000/B000/XXXX" becomes "hooks.example/REDACTED".
//
// An unquoted value counts only where it ends: "password=dead" is not found in
// "password=deadline", so REDACTED never stands where it would tell the secret's prefix.
// These are exact searches for credential-bearing text, which is what a library quoting
// a URL in its error prints (the output is not parsed: it is free text).

// A credential is a secret in one place output could carry it: find is the text
// ("app:pw@"), repl the same with the secret replaced by REDACTED ("app:REDACTED@").
// bounded says that find ends with an unquoted value, which must not go on past it.
type credential struct {
	find, repl string
	bounded    bool
}

// minBareSecretLen is the shortest opaque secret (see addOpaque) searched for as a whole
// string, anywhere: 16 bytes, the console's shortest token, cannot be a word of the
// output.
const minBareSecretLen = 16

// secrets is the set of credentials the scrubbers remove. It is safe for concurrent use.
type secrets struct {
	mu    sync.RWMutex
	creds []credential
}

// addDSN adds the credentials of a database connection string (--database-url).
func (s *secrets) addDSN(dsn string) { s.add(dsnSecrets(dsn)...) }

// addBroker adds the credentials of a broker URL, or of a comma-separated list of them
// (--broker).
func (s *secrets) addBroker(urls string) { s.add(brokerSecrets(urls)...) }

// addURL adds the credentials of another URL the CLI is given (--sqs-endpoint): its
// user information and its credential parameters.
func (s *secrets) addURL(u string) { s.add(urlSecrets(u, false)...) }

// addOpaque adds a secret that no structure carries (the webhook signing secrets, the
// console token, a SASL password, a secret read from a file), under the flag it was
// given with. It is removed where output could show it as that flag's value (--name=v,
// name: v, OUTBOX_NAME=v, name v). No library the CLI hands such a secret to prints it;
// as a last defence one of at least minBareSecretLen bytes is also removed wherever it
// appears, since a string that long is a credential, not a word of the output.
func (s *secrets) addOpaque(flagName, v string) {
	if s == nil || v == "" {
		return
	}
	var creds []credential
	for _, name := range []string{flagName, envName(flagName)} { // flagName covers --flagName too
		creds = append(creds, fieldSecrets(name, v)...)
	}
	if len(v) >= minBareSecretLen {
		creds = append(creds, credential{find: v, repl: redacted})
	}
	s.add(creds...)
}

func (s *secrets) add(creds ...credential) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range creds {
		if c.find != "" && c.find != c.repl && !slices.Contains(s.creds, c) {
			s.creds = append(s.creds, c)
		}
	}
	// Longest first, so that a credential containing another is replaced whole.
	slices.SortStableFunc(s.creds, func(a, b credential) int { return len(b.find) - len(a.find) })
}

// scrub returns text with every known credential's secret replaced by REDACTED.
func (s *secrets) scrub(text string) string {
	if s == nil {
		return text
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, c := range s.creds {
		text = c.replaceIn(text)
	}
	return text
}

func (c credential) replaceIn(text string) string {
	var b strings.Builder
	rest := text
	for {
		i := strings.Index(rest, c.find)
		if i < 0 {
			break
		}
		end := i + len(c.find)
		if c.bounded && end < len(rest) && continuesValue(rest[end]) {
			// "password=dead" inside "password=deadline": another value.
			b.WriteString(rest[:i+1])
			rest = rest[i+1:]
			continue
		}
		b.WriteString(rest[:i])
		b.WriteString(c.repl)
		rest = rest[end:]
	}
	if b.Len() == 0 {
		return text
	}
	b.WriteString(rest)
	return b.String()
}

// continuesValue reports whether c, right after an unquoted value, would make it a
// longer one: a letter, a digit, a byte of a UTF-8 sequence, or one of the characters
// URLs and DSNs leave unescaped inside a value.
func continuesValue(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= 0x80 ||
		strings.IndexByte("-._~%+*!$", c) >= 0
}

// fieldSecrets are the ways output can show v as the value of a field named name:
// name=v, name = v, name: v, name:v, name v, "name": v, each unquoted, in single or in
// double quotes, for the name as given and capitalized (Password).
func fieldSecrets(name, v string) []credential {
	if name == "" || v == "" {
		return nil
	}
	names := []string{name}
	if c := name[0]; c >= 'a' && c <= 'z' {
		names = append(names, string(c-'a'+'A')+name[1:])
	}
	var out []credential
	for _, n := range names {
		for _, sep := range []string{"=", " = ", ": ", ":", " ", `":`, `": `} {
			for _, q := range []string{"", "'", `"`} {
				out = append(out, credential{find: n + sep + q + v + q, repl: n + sep + q + redacted + q, bounded: q == ""})
			}
		}
	}
	return out
}

// dsnSecrets returns the credentials of a database connection string: the password of
// its user information and every parameter not in safeDSNParams. For a string it
// cannot parse it takes what is written where a password goes: the user information of
// "scheme://user:pw@" or "user:pw@tcp(...)" (MySQL), and password=, sslpassword=,
// sslkey= pairs.
func dsnSecrets(dsn string) []credential {
	p, err := parseDSN(dsn)
	if err != nil {
		return guessSecrets(dsn, func(name string) bool { return !safeDSNParams[name] }, false)
	}
	if p.url == nil {
		var out []credential
		for _, kv := range p.pairs {
			if safeDSNParams[kv.key] || kv.value == "" {
				continue
			}
			out = append(out, credential{find: kv.raw, repl: kv.key + "=" + redacted, bounded: !strings.HasSuffix(kv.raw, "'")})
			out = append(out, fieldSecrets(kv.key, kv.value)...)
		}
		return out
	}
	out := userinfoSecrets(rawUserinfo(dsn), p.url.User, false)
	return append(out, querySecrets(p.url.RawQuery, func(name, _ string) bool { return !safeDSNParams[name] })...)
}

// brokerSecrets returns the credentials of a broker URL, or of a comma-separated list
// of them: user information (with NATS token authentication the user name is the
// token), parameters that carry credentials, and for a webhook (http, https) every
// parameter and the path.
func brokerSecrets(urls string) []credential {
	var out []credential
	parts := strings.Split(urls, ",")
	if len(parts) > 1 && !strings.Contains(parts[len(parts)-1], "://") {
		// One URL whose user information or query holds a comma ("amqp://app:a,b@mq"),
		// or a list whose later entries are host:port (kafka://a:9092,b:9092): both.
		parts = append(parts, urls)
	}
	for _, p := range parts {
		p = strings.TrimSpace(p)
		if !strings.Contains(p, "://") { // host:port after the first URL (kafka://a:9092,u:pw@b:9092)
			hostport, _, _ := strings.Cut(p, "/")
			hostport, _, _ = strings.Cut(hostport, "?")
			if at := strings.LastIndex(hostport, "@"); at >= 0 {
				out = append(out, rawUserinfoSecrets(hostport[:at], true)...)
			}
			continue
		}
		scheme, _, _ := strings.Cut(p, "://")
		out = append(out, urlSecrets(p, scheme == "http" || scheme == "https")...)
	}
	return out
}

// urlSecrets returns the credentials of one URL: its user information and its
// credential parameters; with webhook, all its parameters and its path.
func urlSecrets(raw string, webhook bool) []credential {
	u, err := url.Parse(raw)
	if err != nil {
		return guessSecrets(raw, secretParam, true)
	}
	out := userinfoSecrets(rawUserinfo(raw), u.User, true)
	out = append(out, querySecrets(u.RawQuery, func(name, value string) bool {
		return webhook || secretParam(name)
	})...)
	if webhook && u.Path != "" && u.Path != "/" {
		// A webhook path may hold a token; the host before it is the structure.
		for _, path := range []string{rawPath(raw), u.EscapedPath(), u.Path} {
			out = append(out, credential{find: u.Host + path, repl: u.Host + "/" + redacted, bounded: true})
		}
	}
	return out
}

// rawUserinfo returns the user information of a URL as written ("app:s%40c@" gives
// "app:s%40c"), or "" when it has none. It reads the authority as url.Parse does: from
// "//" to the first '/', '?' or '#'.
func rawUserinfo(raw string) string {
	_, rest, ok := strings.Cut(raw, "//")
	if !ok {
		return ""
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		return rest[:at]
	}
	return ""
}

// rawPath returns the path of a URL as written, or "" when it has none.
func rawPath(raw string) string {
	_, rest, ok := strings.Cut(raw, "//")
	if !ok {
		return ""
	}
	i := strings.IndexAny(rest, "/?#")
	if i < 0 || rest[i] != '/' {
		return ""
	}
	rest = rest[i:]
	if j := strings.IndexAny(rest, "?#"); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

// userinfoSecrets returns the credentials of a URL's user information: the password
// with the user name before it, or, when there is no password and tokenUser is set, the
// user name itself (a token) after "//". raw is the user information as written.
func userinfoSecrets(raw string, ui *url.Userinfo, tokenUser bool) []credential {
	if ui == nil {
		return nil
	}
	user := ui.Username()
	pw, hasPassword := ui.Password()
	var out []credential
	if hasPassword {
		if pw == "" {
			return nil
		}
		rawUser, rawPw, _ := strings.Cut(raw, ":")
		encoded := url.UserPassword(user, pw).String()
		encUser, encPw, _ := strings.Cut(encoded, ":")
		for _, f := range [][2]string{{rawUser, rawPw}, {encUser, encPw}, {user, pw}} {
			if f[1] != "" {
				out = append(out, credential{find: f[0] + ":" + f[1] + "@", repl: f[0] + ":" + redacted + "@"})
			}
		}
		return append(out, fieldSecrets("password", pw)...)
	}
	if !tokenUser || user == "" {
		return nil
	}
	for _, tok := range []string{raw, url.User(user).String(), user} {
		if tok != "" {
			out = append(out, credential{find: "//" + tok + "@", repl: "//" + redacted + "@"})
		}
	}
	return append(out, fieldSecrets("token", user)...)
}

// rawUserinfoSecrets parses user information as written ("user:p%40ss") and returns
// its credentials.
func rawUserinfoSecrets(raw string, tokenUser bool) []credential {
	rawUser, rawPw, hasPassword := strings.Cut(raw, ":")
	user, err := url.PathUnescape(rawUser)
	if err != nil {
		user = rawUser
	}
	if !hasPassword {
		return userinfoSecrets(raw, url.User(user), tokenUser)
	}
	pw, err := url.PathUnescape(rawPw)
	if err != nil {
		pw = rawPw
	}
	return userinfoSecrets(raw, url.UserPassword(user, pw), tokenUser)
}

// querySecrets returns the credentials among the parameters of a URL's query (as
// written): those secret reports, and those whose value is a URL with user
// information (sqs://?endpoint=http://u:pw@host), whose own credentials come too.
func querySecrets(rawQuery string, secret func(name, value string) bool) []credential {
	var out []credential
	for _, pair := range strings.Split(rawQuery, "&") {
		rawName, rawValue, _ := strings.Cut(pair, "=")
		name, err := url.QueryUnescape(rawName)
		if err != nil {
			name = rawName
		}
		value, err := url.QueryUnescape(rawValue)
		if err != nil {
			value = rawValue
		}
		if value == "" {
			continue
		}
		var nested []credential
		if strings.Contains(value, "://") {
			nested = urlSecrets(value, false)
		}
		if !secret(name, value) && len(nested) == 0 {
			continue
		}
		out = append(out, nested...)
		out = append(out,
			credential{find: rawName + "=" + rawValue, repl: rawName + "=" + redacted, bounded: true},
			credential{find: url.QueryEscape(name) + "=" + url.QueryEscape(value), repl: url.QueryEscape(name) + "=" + redacted, bounded: true})
		out = append(out, fieldSecrets(name, value)...)
	}
	return out
}

// pairPattern finds name=value pairs in a string that does not parse: the value
// single-quoted (up to the closing quote, or the end) or up to white space or '&'.
var pairPattern = regexp.MustCompile(`([A-Za-z0-9_.-]+)[ \t]*=[ \t]*('(?:[^'\\]|\\.)*'?|[^\s&]*)`)

// guessSecrets returns the credentials of a connection string that does not parse,
// taken from where they are written: the user information before the last '@' (after
// "://", or from the start for "user:pw@tcp(db)/x"), and the name=value pairs whose
// name secret reports.
func guessSecrets(s string, secret func(name string) bool, tokenUser bool) []credential {
	var out []credential
	rest := s
	if _, r, ok := strings.Cut(s, "://"); ok {
		rest = r
	}
	if at := strings.LastIndex(rest, "@"); at >= 0 && (strings.Contains(s, "://") || strings.Contains(rest[:at], ":")) {
		out = append(out, rawUserinfoSecrets(rest[:at], tokenUser)...)
	}
	for _, m := range pairPattern.FindAllStringSubmatch(s, -1) {
		name, value := m[1], m[2]
		if !secret(name) || value == "" || value == "'" {
			continue
		}
		quoted := strings.HasPrefix(value, "'")
		out = append(out, credential{find: m[0], repl: name + "=" + redacted, bounded: !quoted})
		if quoted {
			value = strings.TrimSuffix(value[1:], "'")
		}
		out = append(out, fieldSecrets(name, value)...)
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

// scrubWriter writes through to w with every credential redacted. Loggers and fmt write
// a line or a record per call, so a credential is never split across two writes in
// practice.
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
