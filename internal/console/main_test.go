package console

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxtest"
)

// TestMain fails the package if a test leaves goroutines behind: a relay, a server or a
// browser connection that outlives its test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startRelay runs a relay with id on db that publishes to an in-memory publisher, and
// stops it when the test ends.
func startRelay(t *testing.T, db *testdb.DB, id string) (*outbox.Relay, *outboxtest.Publisher) {
	t.Helper()
	pub := &outboxtest.Publisher{}
	relay, err := outbox.NewRelay(db.Driver, pub, outbox.RelayConfig{ID: id, PollInterval: 50 * time.Millisecond, Logger: testdb.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := relay.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := relay.Stop(testenv.Context(t)); err != nil {
			t.Errorf("stop relay: %v", err)
		}
	})
	return relay, pub
}
