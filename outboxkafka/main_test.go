package outboxkafka_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves goroutines behind: a Publish that outlives
// its ctx or Close, a client Dial made and Close did not close, a kfake cluster or proxy
// a test did not stop.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
