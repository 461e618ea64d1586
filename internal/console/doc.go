// Package console is the outbox's web console: an overview of the outbox (backlog,
// throughput, oldest pending age, topics, relays and their leases) and the dead letters,
// with filters, a detail view, and replay and purge behind a confirmation step. It is
// served by `outbox relay --http-addr` and by `outbox console`, over any outboxdriver.Admin.
// A fleet console (Config.Outboxes: a relay serving an outboxes list) lists its outboxes
// worst first and serves each one's pages under /o/NAME/, behind one login.
//
// The pages are rendered on the server with html/template from files embedded in the
// binary; there is no JavaScript and no build step. The overview refreshes itself with a
// meta refresh.
//
// # Security
//
// The console changes data (replay, purge), so:
//
//   - Without a token it answers only requests from a loopback address for a loopback
//     host name (localhost, 127.0.0.1, [::1]), which also defeats DNS rebinding; CheckAddr
//     and Listen refuse to listen beyond loopback without one.
//   - With a token every request needs it: as "Authorization: Bearer TOKEN", or through the
//     login form, which sets an HttpOnly, SameSite=Strict session cookie signed with the
//     token (so every relay that shares the token accepts it, and changing the token ends
//     every session). Tokens are compared in constant time.
//   - Every POST carries a CSRF token in a hidden field (an HMAC of the token, or of a
//     random per-process key when there is none) and must pass net/http's
//     CrossOriginProtection; requests authenticated by a Bearer header, which a browser
//     never sends on its own, are exempt from the hidden field.
//   - Replay and purge are two steps: a GET shows what would be acted on and how many,
//     and only its POST form acts.
//   - Pages never show configuration: no database URL, no token. Config.Scrub removes
//     known secrets from every page as a last line of defence. Payloads are escaped,
//     truncated, and shown as hex and base64 when they are not text. Responses carry a
//     Content-Security-Policy that allows no script and no framing.
//
// A Handler is safe for concurrent use.
package console
