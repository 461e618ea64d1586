package outbox_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves goroutines behind: a relay that does not
// stop cleanly, a publish or lease call that outlives Stop.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
