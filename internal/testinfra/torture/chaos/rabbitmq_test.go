package chaos

import (
	"fmt"
	"testing"
)

// TestTortureRabbitMQ runs the workload against 1 and 3 relay processes publishing to a
// private RabbitMQ node, while the nemesis kills, pauses and cuts off relays, restarts
// the node, unbinds its queue (so that publishes come back unroutable) and terminates
// the relays' database sessions; then it checks the complete read-back of the queue.
// Replay a failure with OUTBOX_TORTURE_SEED.
func TestTortureRabbitMQ(t *testing.T) {
	for _, relays := range []int{1, 3} {
		t.Run(fmt.Sprintf("relays=%d", relays), func(t *testing.T) {
			runAndCheck(t, Config{Broker: "rabbitmq", Relays: relays, PrivatePostgres: true})
		})
	}
}
