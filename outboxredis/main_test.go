package outboxredis_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves goroutines behind: a Publish that outlives
// its call, a client Close does not stop.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
