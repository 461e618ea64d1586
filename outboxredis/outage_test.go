package outboxredis_test

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxredis"
)

// The tests in this file put their server in a state a real deployment meets (killed,
// out of memory, busy, a replica, replication lagging): each runs its own private
// redis-server, never the shared one.

// The WAIT tests give replicas that should acknowledge a long WaitTimeout (WAIT returns
// as soon as they do), and a short one where none can (WAIT then returns 0 at its
// timeout whatever the load): their outcomes do not hang on how busy the machine is.
const (
	waitLong  = 30 * time.Second
	waitShort = 200 * time.Millisecond
)

// privatePublisher dials s with cfg, routing to the stream "events". Its reads time out
// after a minute, not the default seconds: on a loaded machine a slow reply must not turn
// into a timeout (and a retry) that the test did not mean.
func privatePublisher(t *testing.T, s *server, cfg outboxredis.Config) *outboxredis.Publisher {
	t.Helper()
	cfg.Route = "events"
	pub, err := outboxredis.Dial(testenv.Context(t), "redis://"+s.Addr+"?read_timeout=1m", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	return pub
}

// bothModes runs f for plain XADD and for the dedup script.
func bothModes(t *testing.T, f func(t *testing.T, cfg outboxredis.Config)) {
	t.Run("XADD", func(t *testing.T) { t.Parallel(); f(t, outboxredis.Config{}) })
	t.Run("DedupWindow", func(t *testing.T) { t.Parallel(); f(t, outboxredis.Config{DedupWindow: time.Minute}) })
}

func requireOutagesSaying(t *testing.T, errs []error, n int, code string) {
	t.Helper()
	requireAll(t, errs, n, true)
	for i, err := range errs {
		if err != nil && !strings.Contains(err.Error(), code) {
			t.Errorf("message %d: %v does not say %s", i, err, code)
		}
	}
}

func TestOutageKilledServerAndReconnect(t *testing.T) {
	t.Parallel()
	bothModes(t, func(t *testing.T, cfg outboxredis.Config) {
		s := startServer(t)
		pub := privatePublisher(t, s, cfg)
		testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batchOf("t", 3)))

		s.Kill()
		requireAll(t, pub.Publish(testenv.Context(t), batchOf("t", 5)), 5, true)
		if err := pub.Ping(testenv.Context(t)); !outbox.IsOutage(err) {
			t.Errorf("Ping with a killed server = %v, want an outage", err)
		}

		s.Start(t) // empty: the private server keeps nothing on disk
		testenv.Await(t, "Ping to succeed after the restart", func() (any, bool) {
			ctx, cancel := testenv.CallContext()
			defer cancel()
			err := pub.Ping(ctx)
			return err, err == nil
		})
		testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batchOf("t", 4)))
		if n := newClient(t, s.Addr).XLen(testenv.Context(t), "events").Val(); n != 4 {
			t.Errorf("the restarted server holds %d entries, want 4", n)
		}
	})
}

func TestOutageOutOfMemory(t *testing.T) {
	t.Parallel()
	bothModes(t, func(t *testing.T, cfg outboxredis.Config) {
		s := startServer(t, "--maxmemory", "1", "--maxmemory-policy", "noeviction")
		pub := privatePublisher(t, s, cfg)
		requireOutagesSaying(t, pub.Publish(testenv.Context(t), batchOf("t", 3)), 3, "OOM")

		// Backpressure ends when memory is freed (here: the limit raised).
		newClient(t, s.Addr).ConfigSet(testenv.Context(t), "maxmemory", "0")
		testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batchOf("t", 3)))
	})
}

func TestOutageBusyScript(t *testing.T) {
	t.Parallel()
	bothModes(t, func(t *testing.T, cfg outboxredis.Config) {
		s := startServer(t, "--busy-reply-threshold", "20")
		pub := privatePublisher(t, s, cfg)
		blocker, probe := newClient(t, s.Addr), newClient(t, s.Addr)
		done := make(chan error, 1)
		go func() { done <- blocker.Eval(testenv.Context(t), "while true do end", nil).Err() }()
		testenv.Await(t, "the server to answer BUSY", func() (any, bool) {
			ctx, cancel := testenv.CallContext()
			defer cancel()
			err := probe.Ping(ctx).Err()
			return err, redis.HasErrorPrefix(err, "BUSY")
		})

		requireOutagesSaying(t, pub.Publish(testenv.Context(t), batchOf("t", 3)), 3, "BUSY")

		if err := probe.ScriptKill(testenv.Context(t)).Err(); err != nil {
			t.Fatal(err)
		}
		testenv.AwaitRecv(t, "the killed script to return", done)
		testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batchOf("t", 3)))
	})
}

// startReplica starts a replica of primary and waits until it is in sync.
func startReplica(t *testing.T, primary *server) *server {
	t.Helper()
	// Start the full sync at once, not after the default 5 s wait for more replicas.
	if err := newClient(t, primary.Addr).ConfigSet(testenv.Context(t), "repl-diskless-sync-delay", "0").Err(); err != nil {
		t.Fatal(err)
	}
	r := startServer(t, "--replicaof", "127.0.0.1", primary.Port)
	pc := newClient(t, primary.Addr)
	testenv.Await(t, "the replica to sync", func() (any, bool) {
		replica := info(t, pc, "replication", "slave0")
		return replica, strings.Contains(replica, "state=online")
	})
	return r
}

// awaitNoReplica waits until the primary behind c has noticed that its replica is gone.
func awaitNoReplica(t *testing.T, c redis.Cmdable) {
	t.Helper()
	testenv.Await(t, "the primary to lose its replica", func() (any, bool) {
		n := info(t, c, "replication", "connected_slaves")
		return n, n == "0"
	})
}

func TestOutageReadOnlyReplica(t *testing.T) {
	t.Parallel()
	bothModes(t, func(t *testing.T, cfg outboxredis.Config) {
		primary := startServer(t)
		replica := startReplica(t, primary)
		// A failover moved the primary away: the address now reaches a replica.
		pub := privatePublisher(t, replica, cfg)
		requireOutagesSaying(t, pub.Publish(testenv.Context(t), batchOf("t", 3)), 3, "READONLY")
	})
}

func TestWaitReplicas(t *testing.T) {
	t.Parallel()
	bothModes(t, func(t *testing.T, cfg outboxredis.Config) {
		primary := startServer(t)
		replica := startReplica(t, primary)
		cfg.WaitReplicas = 1
		cfg.WaitTimeout = waitLong
		pub := privatePublisher(t, primary, cfg)

		batch := batchOf("t", 10)
		testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batch))
		// WAIT returned, so the replica has every confirmed entry.
		if n := newClient(t, replica.Addr).XLen(testenv.Context(t), "events").Val(); n != 10 {
			t.Errorf("the replica holds %d entries after a confirmed WAIT, want 10", n)
		}

		replica.Kill()
		pc := newClient(t, primary.Addr)
		awaitNoReplica(t, pc)
		cfg.WaitTimeout = waitShort
		pub = privatePublisher(t, primary, cfg)
		errs := pub.Publish(testenv.Context(t), batchOf("t", 3))
		requireAll(t, errs, 3, true)
		for i, err := range errs {
			if !errors.Is(err, outboxredis.ErrNotReplicated) {
				t.Errorf("message %d: %v, want ErrNotReplicated", i, err)
			}
		}
		// The primary has them: the relay's retry adds second copies (or, with a dedup
		// window, confirms the first ones).
		if n := pc.XLen(testenv.Context(t), "events").Val(); n != 13 {
			t.Errorf("the primary holds %d entries, want 13", n)
		}
	})
}

// TestWaitCoversDuplicate checks that the dedup script confirms a duplicate only once a
// replica has the first copy, which another connection added and WAIT never confirmed.
func TestWaitCoversDuplicate(t *testing.T) {
	t.Parallel()
	primary := startServer(t)
	replica := startReplica(t, primary)
	cfg := outboxredis.Config{DedupWindow: time.Minute, WaitReplicas: 1, WaitTimeout: waitShort}
	first := privatePublisher(t, primary, cfg)
	retry := privatePublisher(t, primary, cfg) // its own client, so its own connection
	cfg.WaitTimeout = waitLong
	last := privatePublisher(t, primary, cfg)
	m := newMsg("t", "k", []byte("x"))

	// The replica stalls (it stays connected, but acknowledges nothing).
	replica.Signal(t, syscall.SIGSTOP)
	t.Cleanup(func() { replica.Signal(t, syscall.SIGCONT) })
	errs := first.Publish(testenv.Context(t), []*outbox.Message{m})
	if len(errs) != 1 || !errors.Is(errs[0], outboxredis.ErrNotReplicated) {
		t.Fatalf("first attempt: %v, want ErrNotReplicated", errs)
	}
	// The relay retries: the script finds the marker. WAIT must still wait for the first
	// copy, which the replica has not acknowledged.
	errs = retry.Publish(testenv.Context(t), []*outbox.Message{m})
	if len(errs) != 1 || !errors.Is(errs[0], outboxredis.ErrNotReplicated) {
		t.Fatalf("retry while the replica stalls: %v, want ErrNotReplicated", errs)
	}

	replica.Signal(t, syscall.SIGCONT)
	testenv.RequirePublishedAll(t, last.Publish(testenv.Context(t), []*outbox.Message{m}))
	if n := newClient(t, replica.Addr).XLen(testenv.Context(t), "events").Val(); n != 1 {
		t.Errorf("the replica holds %d entries, want the first copy only", n)
	}
}
