package outboxcli

import (
	"errors"
	"net/url"
	"strings"
)

// Connection strings carry passwords, so the CLI never prints one as given. Two layers:
//
//  1. What the CLI itself prints about a connection string is built by redactDSN and
//     brokers.Redact, which render only an allow-list of parts (scheme, user, hosts,
//     ports, database and harmless parameters); every other value shows as REDACTED.
//     Errors from pgx that could quote the string (parse errors) are replaced, not
//     wrapped.
//  2. Every byte the CLI writes (and every console page) goes through a scrubber, in
//     case a library quotes a connection string anyway. It redacts by structure: it
//     knows each credential in the place output could carry it (the userinfo
//     "app:pw@", the pair "password=pw", a webhook URL's "host/path") and replaces the
//     secret there only, whatever its length. It does not search for the bare secret:
//     a password "dead" would otherwise turn every "dead" of the output (links to
//     /dead, a payload) into REDACTED and so reveal itself by where REDACTED stands.
//     The one exception is a secret that no structure carries (a signing secret, a
//     token read from a file): see secrets.addOpaque.

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
	pairs  []dsnPair         // key=value form: the pairs as written
}

// dsnPair is one key=value pair of libpq's key=value form, with raw the text it was
// written as ("password = 'p w'").
type dsnPair struct{ key, value, raw string }

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
	pairs, err := parseKeyValues(s)
	if err != nil {
		return nil, err
	}
	p := &parsedDSN{params: map[string]string{}, pairs: pairs}
	for _, kv := range pairs {
		p.params[kv.key] = kv.value
	}
	return p, nil
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
// next character. Keys are identifiers: "user:pw@tcp(db)/x?parseTime=true" (a MySQL
// DSN) is not mistaken for a key "user:pw@tcp(db)/x?parseTime".
func parseKeyValues(s string) ([]dsnPair, error) {
	var out []dsnPair
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
		if !isIdentifier(key) || i >= len(s) || s[i] != '=' {
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
		out = append(out, dsnPair{key: key, value: b.String(), raw: s[start:i]})
	}
}

// isIdentifier reports whether s is a non-empty run of ASCII letters, digits and '_'.
func isIdentifier(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return s != ""
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
