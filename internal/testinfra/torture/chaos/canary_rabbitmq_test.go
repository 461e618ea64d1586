//go:build outbox_broken

package chaos

import (
	"fmt"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/broken"
)

// TestCanaryIgnoreReturns runs a relay whose RabbitMQ publisher counts a returned
// (unroutable) message as published, while the nemesis unbinds the queue now and then:
// the messages returned meanwhile are deleted from the outbox and reach no queue, and the
// checker must report them lost. The same run with a correct relay must pass, so that
// the loss is the bug's and not the fault's.
//
//	go test -tags outbox_broken -run TestCanaryIgnoreReturns ./internal/torture/chaos
func TestCanaryIgnoreReturns(t *testing.T) {
	for _, bug := range []bool{true, false} {
		name := "correct"
		if bug {
			name = string(broken.IgnoreReturns)
		}
		t.Run(name, func(t *testing.T) {
			cfg := Config{Broker: "rabbitmq", Relays: 1, Duration: 15 * time.Second,
				Kinds: []string{KindRabbitUnbind}, Seed: seed(t), Artifacts: artifacts(t)}
			if bug {
				cfg.RelayEnv = []string{broken.EnvVar + "=" + string(broken.IgnoreReturns)}
			}
			rep := Run(t, cfg)
			rep.Label = "canary " + name + " " + rep.Label
			t.Log(rep.String())
			fmt.Println(rep.String())
			switch {
			case bug && (rep.OK() || rep.Lost == 0):
				t.Errorf("canary %s not caught: want lost events (replay with OUTBOX_TORTURE_SEED=%d)", broken.IgnoreReturns, cfg.Seed)
			case !bug && !rep.OK():
				t.Errorf("the correct relay failed the canary's run (replay with OUTBOX_TORTURE_SEED=%d)", cfg.Seed)
			}
		})
	}
}
