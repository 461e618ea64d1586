package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	if IsRelay() {
		os.Exit(RelayMain())
	}
	os.Exit(m.Run())
}

// seed returns OUTBOX_TORTURE_SEED, or a random seed.
func seed(t *testing.T) uint64 {
	if s := os.Getenv("OUTBOX_TORTURE_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("OUTBOX_TORTURE_SEED=%q: %v", s, err)
		}
		return v
	}
	return RandomSeed()
}

// artifacts returns the run's directory under OUTBOX_TORTURE_ARTIFACTS, or "" for a
// temporary one.
func artifacts(t *testing.T) string {
	dir := os.Getenv("OUTBOX_TORTURE_ARTIFACTS")
	if dir == "" {
		return ""
	}
	return filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+time.Now().UTC().Format("20060102T150405"))
}

// runAndCheck runs cfg (with the seed and artifacts of the environment), prints its summary
// line and fails t on any anomaly.
func runAndCheck(t *testing.T, cfg Config) {
	cfg.Seed = seed(t)
	cfg.Artifacts = artifacts(t)
	if cfg.Duration == 0 {
		cfg.Duration = 45 * time.Second
		if testing.Short() {
			cfg.Duration = 12 * time.Second
		}
	}
	rep := Run(t, cfg)
	t.Log("timing (figures, not checked):\n" + rep.Timing.Table())
	t.Log(rep.String())
	fmt.Println(rep.String())
	if !rep.OK() {
		t.Errorf("run failed (replay with OUTBOX_TORTURE_SEED=%d)", cfg.Seed)
	}
}

// TestTortureNATS runs the workload against 1 and 3 relay processes publishing to a
// private NATS JetStream server, with a private PostgreSQL server, while the nemesis
// injects every fault kind: relays killed, paused past their lease, cut off from the
// broker and the database or slowed down, their database sessions terminated, the broker
// and the database restarted; then it checks the complete read-back. Replay a failure
// with OUTBOX_TORTURE_SEED.
func TestTortureNATS(t *testing.T) {
	for _, relays := range []int{1, 3} {
		t.Run(fmt.Sprintf("relays=%d", relays), func(t *testing.T) {
			runAndCheck(t, Config{Broker: "nats", Relays: relays, PrivatePostgres: true})
		})
	}
}

// TestTortureFleet runs five outboxes in two databases, every one served by each of
// three relay processes running `outbox relay` with the outboxes list (the relays park
// an outbox after a second without work, and the quietest one parks and wakes all
// through the run), under every fault kind, with a private PostgreSQL server. Besides
// the checks of every run, per outbox: no copy may reach another outbox's destination.
func TestTortureFleet(t *testing.T) {
	runAndCheck(t, Config{Broker: "nats", Relays: 3, Outboxes: 5, PrivatePostgres: true})
}

// TestTortureWAL is the torture with the relays in WAL mode (a private server with
// wal_level=logical and the slot set up), on every broker with 1 and 3 relays: one relay
// reads the slot, the others stand by; on top of every broker's and the database's
// faults, the stream is cut, its connections terminated, the database restarted, and the
// slot dropped and invalidated under load. Nothing lost, nothing reordered, as when
// polling. NATS runs as long as TestTortureNATS; RabbitMQ and Kafka run 20 s (and until
// every fault kind was injected), to keep the test command's length.
func TestTortureWAL(t *testing.T) {
	for _, broker := range []string{"nats", "rabbitmq", "kafka"} {
		for _, relays := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s/relays=%d", broker, relays), func(t *testing.T) {
				cfg := Config{Broker: broker, Relays: relays, WAL: true}
				if broker != "nats" {
					cfg.Duration = 20 * time.Second
				}
				runAndCheck(t, cfg)
			})
		}
	}
}
