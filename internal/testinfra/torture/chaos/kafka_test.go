package chaos

import (
	"fmt"
	"testing"
)

// TestTortureKafka runs the workload against 1 and 3 relay processes publishing to a
// three-broker kfake cluster behind proxies, while the nemesis kills and pauses relays,
// cuts, slows down and blackholes their broker and database connections, terminates
// their database sessions, restarts the cluster, moves partition leaders and answers
// produce requests with retriable errors (some after appending the records); then it
// checks the complete read-back of every partition. Replay a failure with
// OUTBOX_TORTURE_SEED.
func TestTortureKafka(t *testing.T) {
	for _, relays := range []int{1, 3} {
		t.Run(fmt.Sprintf("relays=%d", relays), func(t *testing.T) {
			runAndCheck(t, Config{Broker: "kafka", Relays: relays, PrivatePostgres: true})
		})
	}
}
