package outboxwebhook

import "time"

// SetNow replaces p's clock, for tests of Retry-After.
func SetNow(p *Publisher, now func() time.Time) { p.now = now }
