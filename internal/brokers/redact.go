package brokers

import (
	"net/url"
	"strings"
)

// Redact renders a broker URL, or a comma-separated list of them, for logs and errors:
// scheme and host; user information shows as REDACTED, because with NATS token
// authentication the "user" is the token. The path and query, which carry a webhook
// receiver's token and an SQS endpoint's parameters, are left out.
func Redact(s string) string {
	const redacted = "REDACTED"
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
