package outboxkafka_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testproxy"
	"github.com/outboxkit/outbox/outboxkafka"
	"github.com/outboxkit/outbox/outboxtest/conformance"
)

// testCluster is an in-process Kafka cluster (franz-go's kfake, which speaks the real
// protocol) whose brokers are each behind a toxiproxy. kfake advertises its listeners'
// addresses in metadata, so the listeners it is given claim the proxies' addresses:
// every client, whatever broker it learns of, connects through a proxy, and Cut cuts
// them all.
type testCluster struct {
	*kfake.Cluster
	seeds   []string // the proxies' addresses
	proxies []*testproxy.Proxy
	admin   *kgo.Client
}

// advertised is a listener that reports another address than the one it listens on.
type advertised struct {
	net.Listener
	addr net.Addr
}

func (l advertised) Addr() net.Addr { return l.addr }

// startCluster starts a one-broker cluster (more with kfake.NumBrokers) for t.
func startCluster(t *testing.T, opts ...kfake.Opt) *testCluster {
	t.Helper()
	tc := &testCluster{}
	listen := func(network, address string) (net.Listener, error) {
		ln, err := net.Listen(network, address)
		if err != nil {
			return nil, err
		}
		px := testproxy.New(t, ln.Addr().String())
		addr, err := net.ResolveTCPAddr("tcp", px.Addr())
		if err != nil {
			ln.Close()
			return nil, err
		}
		tc.proxies = append(tc.proxies, px)
		return advertised{Listener: ln, addr: addr}, nil
	}
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.ListenFn(listen)}, opts...)...)
	if err != nil {
		t.Fatalf("start kfake: %v", err)
	}
	t.Cleanup(c.Close)
	tc.Cluster = c
	tc.seeds = c.ListenAddrs()
	tc.admin = tc.client(t)
	return tc
}

// client returns a plain client of the cluster, closed when t ends.
func (tc *testCluster) client(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(tc.seeds...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// Cut resets every connection to the cluster and refuses new ones until Restore.
func (tc *testCluster) Cut() {
	for _, p := range tc.proxies {
		p.Cut()
	}
}

func (tc *testCluster) Restore(t *testing.T) {
	for _, p := range tc.proxies {
		p.Restore(t)
	}
}

var topicSeq atomic.Int64

// createTopic creates a fresh topic with partitions partitions and the given topic
// configs (max.message.bytes, ...), and returns its name.
func (tc *testCluster) createTopic(t *testing.T, partitions int32, configs map[string]string) string {
	t.Helper()
	name := fmt.Sprintf("topic-%d", topicSeq.Add(1))
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = name, partitions, 1
	for k, v := range configs {
		c := kmsg.NewCreateTopicsRequestTopicConfig()
		c.Name, c.Value = k, kmsg.StringPtr(v)
		rt.Configs = append(rt.Configs, c)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(testenv.Context(t), tc.admin)
	if err == nil {
		err = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	return name
}

// dial returns a publisher of the cluster, closed when t ends.
func (tc *testCluster) dial(t *testing.T, cfg outboxkafka.Config, opts ...kgo.Opt) *outboxkafka.Publisher {
	t.Helper()
	pub, err := outboxkafka.Dial(testenv.Context(t), tc.seeds, cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	return pub
}

// read reads topic from the start over all partitions with a client of its own,
// waiting until n records are there, then returning every record there is. It stops
// waiting early only when no new record has come for testenv.Stall(), and then returns
// what it has, for the caller to say what is missing. Records come in partition order:
// per key, in the order Kafka stored them.
func (tc *testCluster) read(t *testing.T, topic string, n int) []*kgo.Record {
	t.Helper()
	cl := tc.client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond))
	defer cl.Close()
	var out []*kgo.Record
	// poll fetches for up to d: the records that came within it, the rest at the next.
	poll := func(d time.Duration) int {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		fs := cl.PollFetches(ctx)
		for _, fe := range fs.Errors() {
			if ctx.Err() == nil {
				t.Fatalf("read %s: partition %d: %v", topic, fe.Partition, fe.Err)
			}
		}
		got := 0
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r); got++ })
		return got
	}
	err := testenv.Progress(context.Background(), fmt.Sprintf("%d records in %s", n, topic), testenv.Stall(), func() (any, bool) {
		for len(out) < n && poll(time.Second) > 0 {
		}
		return fmt.Sprintf("%d of %d records", len(out), n), len(out) >= n
	})
	if err != nil {
		t.Logf("read %s: %v", topic, err)
		return out
	}
	// Whatever came after the n-th, duplicates included. A slow machine may leave some
	// for no one to see: that only weakens a check for extra records, never fails one.
	for poll(300*time.Millisecond) > 0 {
	}
	return out
}

// received turns records into what the conformance suite checks.
func received(rs []*kgo.Record) []conformance.Received {
	out := make([]conformance.Received, len(rs))
	for i, r := range rs {
		h := headerMap(r)
		out[i] = conformance.Received{
			DedupID:     h[outbox.HeaderDedupKey],
			Key:         string(r.Key),
			ContentType: h[outbox.HeaderContentType],
			Headers:     h,
			Payload:     r.Value,
		}
	}
	return out
}

func headerMap(r *kgo.Record) map[string]string {
	h := make(map[string]string, len(r.Headers))
	for _, rh := range r.Headers {
		h[rh.Key] = string(rh.Value)
	}
	return h
}

// ctxT returns a context that ends after d, for a deadline that is itself the input
// under test (a Publish while the broker is cut off gives up at it). A context that only
// bounds a hang is testenv.Context(t).
func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
