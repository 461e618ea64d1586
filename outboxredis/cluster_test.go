package outboxredis_test

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxredis"
)

// startCluster starts a private Redis Cluster of three masters with one replica each,
// and waits until every slot is served and every master's replica is online.
func startCluster(t *testing.T) (masters, replicas []*server) {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatalf("redis-cli is not installed (apt-get install redis-tools): %v", err)
	}
	var nodes []*server
	args := []string{"--cluster", "create"}
	for range 6 {
		s := startServer(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", freePort(t), "--cluster-node-timeout", "5000", "--repl-diskless-sync-delay", "0")
		nodes = append(nodes, s)
		args = append(args, s.Addr)
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	for _, s := range nodes {
		c := newClient(t, s.Addr)
		testenv.Await(t, "cluster_state:ok on "+s.Addr, func() (any, bool) {
			ctx, cancel := testenv.CallContext() // per poll
			defer cancel()
			clusterInfo, err := c.ClusterInfo(ctx).Result()
			if err != nil {
				return err, false
			}
			for line := range strings.SplitSeq(clusterInfo, "\r\n") {
				if state, ok := strings.CutPrefix(line, "cluster_state:"); ok {
					return state, state == "ok"
				}
			}
			return clusterInfo, false
		})
		if info(t, c, "replication", "role") == "master" {
			masters = append(masters, s)
			testenv.Await(t, "the replica of "+s.Addr+" online", func() (any, bool) {
				replica := info(t, c, "replication", "slave0")
				return replica, strings.Contains(replica, "state=online")
			})
		} else {
			replicas = append(replicas, s)
		}
	}
	if len(masters) != 3 {
		t.Fatalf("cluster has %d masters, want 3", len(masters))
	}
	return masters, replicas
}

// spread returns one message per stream "prefix0" ... "prefix<n-1>": streams in slots
// of every master.
func spread(prefix string, n int) []*outbox.Message {
	batch := make([]*outbox.Message, n)
	for i := range batch {
		batch[i] = newMsg(fmt.Sprintf("%s%d", prefix, i), "k", []byte("x"))
	}
	return batch
}

func TestCluster(t *testing.T) {
	t.Parallel()
	masters, replicas := startCluster(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{masters[0].Addr}, ContextTimeoutEnabled: true, ReadTimeout: time.Minute})
	t.Cleanup(func() { _ = cc.Close() })
	requireLen := func(t *testing.T, batch []*outbox.Message, want int64) {
		t.Helper()
		ctx := testenv.Context(t)
		for _, m := range batch {
			if n, err := cc.XLen(ctx, m.Topic).Result(); err != nil || n != want {
				t.Errorf("stream %s holds %d entries (%v), want %d", m.Topic, n, err, want)
			}
		}
	}

	t.Run("Pipelined", func(t *testing.T) {
		pub, err := outboxredis.New(cc, outboxredis.Config{})
		if err != nil {
			t.Fatal(err)
		}
		batch := spread("pipelined-", 60)
		testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batch))
		requireLen(t, batch, 1)
	})

	t.Run("DedupWindow", func(t *testing.T) {
		pub, err := outboxredis.New(cc, outboxredis.Config{DedupWindow: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		// Plain names, names with a hash tag, and a "{" without a tag.
		batch := append(spread("dedup-", 30), spread("tag{dedup}-", 5)...)
		batch = append(batch, spread("open{-", 5)...)
		testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batch))
		testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batch)) // the retry: no second entries
		requireLen(t, batch, 1)

		// A "}" without a hash tag: the marker cannot share the stream's slot.
		var odd *outbox.Message
		ctx := testenv.Context(t)
		for _, m := range spread("close}-", 20) {
			marker := m.Topic + outboxredis.DedupMarkerInfix + m.DedupKey
			if cc.ClusterKeySlot(ctx, m.Topic).Val() != cc.ClusterKeySlot(ctx, marker).Val() {
				odd = m
				break
			}
		}
		if odd == nil {
			t.Fatal("no stream name whose marker is in another slot")
		}
		errs := pub.Publish(testenv.Context(t), []*outbox.Message{odd})
		if len(errs) != 1 || errs[0] == nil || outbox.IsOutage(errs[0]) || !strings.Contains(errs[0].Error(), "CROSSSLOT") {
			t.Errorf("stream %q: %v, want a CROSSSLOT rejection", odd.Topic, errs)
		}
	})

	t.Run("WaitReplicas", func(t *testing.T) {
		// A long WaitTimeout (and read timeout): replicas that can acknowledge must, however
		// loaded the machine. The master without a replica makes the second Publish wait
		// it out.
		url := "redis://" + masters[0].Addr + "?addr=" + masters[1].Addr + "&read_timeout=1m"
		pub, err := outboxredis.Dial(testenv.Context(t), url, outboxredis.Config{Cluster: true, WaitReplicas: 1, WaitTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pub.Close)
		batch := spread("wait-", 60)
		testenv.RequirePublishedAll(t, pub.Publish(testenv.Context(t), batch))
		requireLen(t, batch, 1)

		// One master loses its replica: only its streams fail, as outages.
		var lonely string
		for _, r := range replicas[:1] {
			c := newClient(t, r.Addr)
			host := info(t, c, "replication", "master_host")
			lonely = host + ":" + info(t, c, "replication", "master_port")
			r.Kill()
		}
		lc := newClient(t, lonely)
		awaitNoReplica(t, lc)
		batch = spread("wait-", 60)
		errs := pub.Publish(testenv.Context(t), batch)
		if errs == nil {
			t.Fatal("every message was confirmed, though one master has no replica")
		}
		for i, m := range batch {
			master, err := cc.MasterForKey(testenv.Context(t), m.Topic)
			if err != nil {
				t.Fatal(err)
			}
			onLonely := master.Options().Addr == lonely
			switch {
			case onLonely && !errors.Is(errs[i], outboxredis.ErrNotReplicated):
				t.Errorf("stream %s on %s: %v, want ErrNotReplicated", m.Topic, lonely, errs[i])
			case onLonely && !outbox.IsOutage(errs[i]):
				t.Errorf("stream %s: %v is not an outage", m.Topic, errs[i])
			case !onLonely && errs[i] != nil:
				t.Errorf("stream %s on %s, which has its replica: %v", m.Topic, master.Options().Addr, errs[i])
			}
		}
	})
}
