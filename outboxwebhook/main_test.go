package outboxwebhook_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves goroutines behind: a request that outlives
// Publish, a connection that Close did not close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
