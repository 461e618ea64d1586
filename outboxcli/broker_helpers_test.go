package outboxcli

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

// brokerMessages are what the relay test of each broker writes: two messages of key o-1
// for topic q (JSON with a dedup key, then binary), and one for topic missing, whose
// destination does not exist.
func brokerMessages() []outbox.Message {
	return []outbox.Message{
		{ID: outbox.NewID(), Topic: "q", Key: "o-1", Payload: []byte(`{"n":1}`), DedupKey: "order-1-placed"},
		{ID: outbox.NewID(), Topic: "q", Key: "o-1", Payload: []byte{0xff, 0x00}},
		{ID: outbox.NewID(), Topic: "missing", Key: "m-1", Payload: []byte(`{"n":3}`)},
	}
}

// backgroundRelay runs `outbox` with args and env until stop, which returns its exit
// status (once the test ends at the latest); log is its standard error.
func backgroundRelay(t *testing.T, env map[string]string, args ...string) (log *syncBuffer, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	log = &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		var stdout syncBuffer
		done <- run(ctx, args, func(k string) string { return env[k] }, &stdout, log)
	}()
	var once sync.Once
	var code int
	stop = func() int {
		once.Do(func() {
			cancel()
			code = testenv.AwaitRecv(t, "the relay to stop after its context ended", done)
		})
		return code
	}
	t.Cleanup(func() { stop() })
	return log, stop
}

// stopClean stops a backgroundRelay and fails the test unless it exits 0.
func stopClean(t *testing.T, log *syncBuffer, stop func() int) {
	t.Helper()
	if code := stop(); code != 0 {
		t.Fatalf("relay exited %d after a graceful stop\nstderr:\n%s", code, log.String())
	}
}

// awaitMissingWarning waits for the relay's start-up warning that pending messages
// cannot be sent until their destination exists: the queue, topic or stream (what) dest.
func awaitMissingWarning(t *testing.T, log *syncBuffer, what, dest string) {
	t.Helper()
	testenv.AwaitCond(t, "the warning about "+dest, func() bool {
		return strings.Contains(log.String(), "until their "+what+" exists") && strings.Contains(log.String(), dest)
	})
}
