package outboxtest_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves goroutines behind: a relay that does not
// stop cleanly, or a writer still waiting for a dedup key.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
