package outboxcli

import (
	"context"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
)

// testMainEnv, set in the environment of this test binary's tests, makes the binary
// run as `outbox` when a test starts it with a command (`bench --outboxes` starts its
// relay processes with os.Executable()).
const testMainEnv = "OUTBOXCLI_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(testMainEnv) == "1" && len(os.Args) > 1 && !strings.HasPrefix(os.Args[1], "-test.") {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := Main(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	os.Setenv(testMainEnv, "1")
	os.Exit(m.Run())
}
