package bench

import (
	"testing"

	"github.com/outboxkit/outbox/internal/brokers"
)

// TestEveryBrokerHasATarget: `outbox bench --broker` takes every URL `outbox relay
// --broker` takes.
func TestEveryBrokerHasATarget(t *testing.T) {
	for _, b := range brokers.All() {
		if targets[b] == nil {
			t.Errorf("%s has no bench target: add target_%s.go", b.Name, b.Label)
		}
	}
}
