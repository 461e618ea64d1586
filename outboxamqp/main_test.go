package outboxamqp_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves goroutines behind: a publisher's channels,
// connection watcher and reconnect loop must all end with Close. Toxiproxy's own link
// goroutines are exempt: after a Stop (testproxy's Cut) with data in transit, they can
// stay blocked on their internal channels for good.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).read"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
	)
}
