package chaos

import (
	"cmp"
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

// duration returns OUTBOX_TORTURE_DURATION (a longer run on demand), else def, or 12 s
// with -short. A run also goes on until every fault kind was injected.
func duration(t *testing.T, def time.Duration) time.Duration {
	if s := os.Getenv("OUTBOX_TORTURE_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("OUTBOX_TORTURE_DURATION=%q: want a positive duration (45s, 10m)", s)
		}
		return d
	}
	if testing.Short() {
		return 12 * time.Second
	}
	return def
}

// runAndCheck runs cfg (with the seed, duration and artifacts of the environment), prints
// its summary line and fails t on any anomaly.
func runAndCheck(t *testing.T, cfg Config) {
	cfg.Seed = seed(t)
	cfg.Artifacts = artifacts(t)
	cfg.Duration = duration(t, cmp.Or(cfg.Duration, 30*time.Second))
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
// with OUTBOX_TORTURE_SEED. The run with 1 relay is on demand (OUTBOX_TORTURE_FULL=1), to
// keep the test command's length: RabbitMQ and Kafka run with 1 relay, and NATS does in
// TestTortureWAL.
func TestTortureNATS(t *testing.T) {
	full, _ := strconv.ParseBool(os.Getenv("OUTBOX_TORTURE_FULL"))
	for _, relays := range []int{1, 3} {
		if relays == 1 && !full {
			continue
		}
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
// polling. NATS runs as long as TestTortureNATS, with 1 and 3 relays; RabbitMQ and Kafka
// run 20 s (and until every fault kind was injected), with 3 relays only, to keep the
// test command's length (OUTBOX_TORTURE_FULL=1 runs them with 1 relay too).
func TestTortureWAL(t *testing.T) {
	full, _ := strconv.ParseBool(os.Getenv("OUTBOX_TORTURE_FULL"))
	for _, broker := range []string{"nats", "rabbitmq", "kafka"} {
		for _, relays := range []int{1, 3} {
			if broker != "nats" && relays == 1 && !full {
				continue
			}
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

// TestTortureDestinations runs 3 relay processes that publish through routing rules to
// two destinations, a private NATS JetStream server (the even keys) and a private
// RabbitMQ node (the odd keys, by their aggregate type), while the nemesis injects each
// one's faults (restarts, cuts, RabbitMQ's unbind) besides the relays' and the
// database's. Besides the checks of every run: every copy is in the destination its
// key's rule names (misrouted=0). That one destination's outage holds back only its own
// messages is checked on the in-memory store (TestMemRelayRouterDestinationDown), where
// it does not depend on timing.
func TestTortureDestinations(t *testing.T) {
	runAndCheck(t, Config{Broker: "destinations", Relays: 3, PrivatePostgres: true, Duration: 20 * time.Second})
}

// TestTorturePubSub runs 3 relay processes publishing with ordering keys to the Pub/Sub
// client library's fake server (pstest, in the test process: in memory, so no restart
// fault), under the relays' and the database's faults and the broker proxy's cuts,
// latency and blackholes: a key paused after a failed publish must be resumed, its order
// kept. 20 s, and until every fault kind was injected.
func TestTorturePubSub(t *testing.T) {
	runAndCheck(t, Config{Broker: "pubsub", Relays: 3, Duration: 20 * time.Second})
}
