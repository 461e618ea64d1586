package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testproxy"
	"github.com/outboxkit/outbox/internal/testinfra/torture"
	"github.com/outboxkit/outbox/internal/testinfra/torture/nemesis"
	"github.com/outboxkit/outbox/outboxkafka"
)

const (
	// kafkaTopic is the one destination of every event: the route is the fixed topic
	// name, and the publisher's client spreads events over its partitions by key, so
	// each key's order is one partition's order.
	kafkaTopic      = "torture"
	kafkaPartitions = 8
	kafkaBrokers    = 3
)

// Fault kinds of the Kafka broker only.
const (
	// KindKafkaErrors answers produce requests with retriable Kafka errors for the
	// hold, some of them after the records were appended.
	KindKafkaErrors = "kafka-errors"
	// KindKafkaLeaderMove moves the leadership of one broker's partitions to the
	// others.
	KindKafkaLeaderMove = "kafka-leader-move"
)

// kafkaProduceErrors are the errors of KindKafkaErrors, all retriable, so that the
// client retries them by itself and the relay sees an outage at worst. kfake answers
// REQUEST_TIMED_OUT and NOT_ENOUGH_REPLICAS_AFTER_APPEND after appending the records,
// as a broker does when the followers do not confirm in time: the outcome is ambiguous,
// and only the idempotent producer's sequence numbers (a retry is recognised and not
// appended again) or, once a Publish gave up, a bounded duplicate keep it from being a
// loss. The others refuse the records before any is appended.
var kafkaProduceErrors = []*kerr.Error{
	kerr.RequestTimedOut,
	kerr.NotEnoughReplicasAfterAppend,
	kerr.NotLeaderForPartition,
	kerr.NotEnoughReplicas,
}

func init() {
	register("kafka", brokerKind{
		new: func() Broker { return &kafkaBroker{} },
		dial: func(ctx context.Context, url, route string) (Publisher, error) {
			return outboxkafka.Dial(ctx, strings.Split(url, ","), outboxkafka.Config{Route: route})
		},
	})
}

// kafkaBroker is a kfake cluster of three brokers in the run's own process (kfake speaks
// the real Kafka protocol; there is no Kafka server here), each behind a proxy of its
// own. kfake advertises its listeners' addresses in metadata, so each listener claims
// its proxy's address: a client goes through the proxies for every broker it learns of,
// and the proxy faults reach every connection.
//
// Being in this process, kfake has no broker process to kill, and it keeps every record
// in memory. It also persists them to a data directory, which makes KindBrokerRestart a
// real restart, if a clean one: the whole cluster shuts down (every connection closed,
// its state written out) and a new cluster on the same ports loads the topic, its records
// and the idempotent producers' sequence state back from disk. A crash losing writes the
// broker had not synced is not simulated: a Kafka cluster answers for those with
// replication, and the three kfake brokers share one copy of the data. For the same
// reason KindKafkaLeaderMove moves only the leadership, as a controlled leader election
// does: clients get NOT_LEADER_FOR_PARTITION from the old leader and must find the new
// one, while the records stay where they are.
type kafkaBroker struct {
	tb      testenv.TB
	dir     string
	started bool // the first cluster is up: restarts reuse its ports and proxies

	nodes []kafkaNode // in node order; fixed once started

	mu      sync.Mutex
	cluster *kfake.Cluster // nil while restarting
}

// kafkaNode is one broker's listener, kept over restarts, and its proxy.
type kafkaNode struct {
	addr  string // "127.0.0.1:port"
	port  int
	proxy *testproxy.Proxy
}

func (b *kafkaBroker) Start(tb testenv.TB) {
	b.tb = tb
	b.dir = tb.TempDir()
	c, err := b.newCluster(kfake.NumBrokers(kafkaBrokers), kfake.SeedTopics(kafkaPartitions, kafkaTopic))
	if err != nil {
		tb.Fatalf("start kfake: %v", err)
	}
	b.cluster = c
	b.started = true
	tb.Cleanup(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.cluster != nil {
			b.cluster.Close()
			b.cluster = nil
		}
	})
}

// newCluster starts a cluster persisting to b.dir, its listeners advertising their
// proxies.
func (b *kafkaBroker) newCluster(opts ...kfake.Opt) (*kfake.Cluster, error) {
	return kfake.NewCluster(append([]kfake.Opt{kfake.DataDir(b.dir), kfake.ListenFn(b.listen)}, opts...)...)
}

// listen is kfake's listen function: it listens on address and returns a listener that
// reports its proxy's address, starting the proxy the first time.
func (b *kafkaBroker) listen(network, address string) (net.Listener, error) {
	ln, err := net.Listen(network, address)
	if err != nil {
		return nil, err
	}
	at := ln.Addr().String()
	i := slices.IndexFunc(b.nodes, func(n kafkaNode) bool { return n.addr == at })
	if i < 0 {
		if b.started { // a restart listens on the ports it had
			ln.Close()
			return nil, fmt.Errorf("kfake listened on %s, not on one of its own addresses", at)
		}
		port, _ := strconv.Atoi(at[strings.LastIndexByte(at, ':')+1:])
		b.nodes = append(b.nodes, kafkaNode{addr: at, port: port, proxy: testproxy.New(b.tb, at)})
		i = len(b.nodes) - 1
	}
	addr, err := net.ResolveTCPAddr("tcp", b.nodes[i].proxy.Addr())
	if err != nil {
		ln.Close()
		return nil, err
	}
	return advertisedListener{Listener: ln, addr: addr}, nil
}

// advertisedListener is a listener that reports another address than the one it
// listens on.
type advertisedListener struct {
	net.Listener
	addr net.Addr
}

func (l advertisedListener) Addr() net.Addr { return l.addr }

// proxyAddrs returns the addresses clients dial: the proxies.
func (b *kafkaBroker) proxyAddrs() []string {
	var addrs []string
	for _, n := range b.nodes {
		addrs = append(addrs, n.proxy.Addr())
	}
	return addrs
}

func (b *kafkaBroker) RelayURL() string { return strings.Join(b.proxyAddrs(), ",") }
func (b *kafkaBroker) Route() string    { return kafkaTopic }

// current returns the running cluster, or an error while it restarts (or failed to).
func (b *kafkaBroker) current() (*kfake.Cluster, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cluster == nil {
		return nil, errors.New("kfake is not running")
	}
	return b.cluster, nil
}

func (b *kafkaBroker) Faults(tb testenv.TB) []nemesis.Fault {
	return append([]nemesis.Fault{
		{Kind: KindBrokerRestart, MinHold: 200 * time.Millisecond, MaxHold: 1500 * time.Millisecond, Inject: b.restart},
		{Kind: KindKafkaErrors, MinHold: time.Second, MaxHold: 8 * time.Second, Inject: b.produceErrors},
		{Kind: KindKafkaLeaderMove, Inject: b.moveLeaders},
	}, b.proxyFaults(tb)...)
}

// proxyFaults are the broker proxy faults (brokerProxyFaults: cut, latency, blackhole),
// each on every broker's proxy at once, as the one proxy of a single-server broker.
func (b *kafkaBroker) proxyFaults(tb testenv.TB) []nemesis.Fault {
	per := make([][]nemesis.Fault, len(b.nodes))
	for i, n := range b.nodes {
		per[i] = brokerProxyFaults(tb, n.proxy)
	}
	target := "proxies " + b.RelayURL()
	all := make([]nemesis.Fault, len(per[0]))
	for k := range all {
		all[k] = per[0][k]
		all[k].Inject = func(rnd *rand.Rand) (string, func() error, error) {
			var heals []func() error
			heal := func() error {
				var errs []error
				for _, h := range heals {
					errs = append(errs, h())
				}
				return errors.Join(errs...)
			}
			for i := range per {
				_, h, err := per[i][k].Inject(rnd)
				if err != nil {
					return target, nil, errors.Join(err, heal())
				}
				if h != nil {
					heals = append(heals, h)
				}
			}
			return target, heal, nil
		}
	}
	return all
}

// restart shuts the cluster down; the heal starts a new one on the same ports, which
// loads what the old one persisted.
func (b *kafkaBroker) restart(*rand.Rand) (string, func() error, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cluster == nil {
		return "", nil, errors.New("kfake is not running")
	}
	b.cluster.Close()
	b.cluster = nil
	var target []string
	ports := make([]int, len(b.nodes))
	for i, n := range b.nodes {
		target, ports[i] = append(target, n.addr), n.port
	}
	return "kfake " + strings.Join(target, ","), func() error {
		b.mu.Lock()
		defer b.mu.Unlock()
		// A port may linger a moment after the close: retry until the error has stayed
		// the same for testenv.Stall().
		err := testenv.Progress(context.Background(), "kfake to listen again on its ports", testenv.Stall(), func() (any, bool) {
			c, err := b.newCluster(kfake.Ports(ports...))
			if err != nil {
				return err, false
			}
			b.cluster = c
			return nil, true
		})
		if err != nil {
			return fmt.Errorf("restart kfake: %w", err)
		}
		return nil
	}, nil
}

// produceErrors answers the produce requests of every partition, or of one, with one of
// kafkaProduceErrors until the heal.
func (b *kafkaBroker) produceErrors(rnd *rand.Rand) (string, func() error, error) {
	c, err := b.current()
	if err != nil {
		return "", nil, err
	}
	code := kafkaProduceErrors[rnd.IntN(len(kafkaProduceErrors))]
	f := kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: kafkaTopic, Err: code, Count: -1}
	target := fmt.Sprintf("%s %s", kafkaTopic, code.Message)
	if rnd.IntN(2) == 0 {
		p := rnd.Int32N(kafkaPartitions)
		f.Partitions = []int32{p}
		target = fmt.Sprintf("%s[%d] %s", kafkaTopic, p, code.Message)
	}
	h := c.Fault(f)
	return target, func() error {
		h.Remove()
		b.tb.Logf("kafka-errors: %s answered %d produce requests", target, h.Hits())
		return nil
	}, nil
}

// moveLeaders moves the leadership of every partition one broker leads to the other
// brokers.
func (b *kafkaBroker) moveLeaders(rnd *rand.Rand) (string, func() error, error) {
	c, err := b.current()
	if err != nil {
		return "", nil, err
	}
	from := rnd.Int32N(kafkaBrokers)
	var moved []string
	for p := range int32(kafkaPartitions) {
		if c.LeaderFor(kafkaTopic, p) != from {
			continue
		}
		to := (from + 1 + rnd.Int32N(kafkaBrokers-1)) % kafkaBrokers
		if err := c.MoveTopicPartition(kafkaTopic, p, to); err != nil {
			return "", nil, fmt.Errorf("move %s[%d] to node %d: %w", kafkaTopic, p, to, err)
		}
		moved = append(moved, fmt.Sprintf("%d->%d", p, to))
	}
	return fmt.Sprintf("node %d partitions [%s]", from, strings.Join(moved, " ")), nil, nil
}

// ReadBack reads every partition from offset 0 to its high watermark, each partition
// consumed directly (no group), in partition order. A partition whose log does not
// start at 0 lost records, and a read that stops short of a high watermark (no record
// for testenv.Stall()) or skips an offset is incomplete: either makes the run invalid.
func (b *kafkaBroker) ReadBack(tb testenv.TB, log *torture.DeliveryLog) {
	tb.Helper()
	if _, err := b.current(); err != nil {
		tb.Fatalf("invalid run: %v", err)
	}
	ctx := context.Background()
	seeds := b.proxyAddrs()
	admin, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		tb.Fatal(err)
	}
	defer admin.Close()
	starts, err := listOffsets(ctx, admin, -2) // earliest
	if err != nil {
		tb.Fatalf("invalid run: list the start offsets: %v", err)
	}
	ends, err := listOffsets(ctx, admin, -1) // the high watermarks
	if err != nil {
		tb.Fatalf("invalid run: list the high watermarks: %v", err)
	}
	offsets := map[int32]kgo.Offset{}
	next := map[int32]int64{} // per partition, the offset the read expects next
	for p := range int32(kafkaPartitions) {
		if starts[p] != 0 {
			tb.Fatalf("invalid run: %s[%d] starts at offset %d, not 0: records were lost", kafkaTopic, p, starts[p])
		}
		if ends[p] > 0 {
			offsets[p] = kgo.NewOffset().At(0)
			next[p] = 0
		}
	}
	if len(offsets) == 0 {
		return // nothing to read; Run reports that nothing was delivered
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.FetchMaxWait(500*time.Millisecond),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{kafkaTopic: offsets}))
	if err != nil {
		tb.Fatal(err)
	}
	defer cl.Close()
	short := func() string {
		var s []string
		for p := range int32(kafkaPartitions) {
			if next[p] < ends[p] {
				s = append(s, fmt.Sprintf("[%d] %d of %d", p, next[p], ends[p]))
			}
		}
		return strings.Join(s, ", ")
	}
	progress := time.Now()
	for {
		if short() == "" {
			return
		}
		if time.Since(progress) > testenv.Stall() { // a stall detector, not a budget
			tb.Fatalf("invalid run: read-back of %s stalled at %s: no record for %v", kafkaTopic, short(), testenv.Stall())
		}
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second) // one poll's window: the loop polls again
		fs := cl.PollFetches(pctx)
		pcancel()
		for _, fe := range fs.Errors() {
			if !errors.Is(fe.Err, context.DeadlineExceeded) {
				tb.Fatalf("invalid run: read-back of %s[%d] at %s: %v", fe.Topic, fe.Partition, short(), fe.Err)
			}
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset != next[r.Partition] {
				tb.Fatalf("invalid run: %s[%d] returned offset %d, expected %d", r.Topic, r.Partition, r.Offset, next[r.Partition])
			}
			next[r.Partition] = r.Offset + 1
			progress = time.Now()
			d, err := torture.ParseDelivery(recordHeaders(r), r.Value)
			if err != nil {
				tb.Fatalf("%s[%d] offset %d: %v", r.Topic, r.Partition, r.Offset, err)
			}
			log.Add(d)
		})
	}
}

// listOffsets returns every partition's offset at timestamp (-2 the log start, -1 the
// high watermark), retrying the partitions whose leader does not answer yet, until no
// more partitions have answered for testenv.Stall().
func listOffsets(ctx context.Context, cl *kgo.Client, timestamp int64) (map[int32]int64, error) {
	out := map[int32]int64{}
	var last error
	err := testenv.Progress(ctx, "the partitions' offsets", testenv.Stall(), func() (any, bool) {
		req := kmsg.NewPtrListOffsetsRequest()
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = kafkaTopic
		for p := range int32(kafkaPartitions) {
			if _, ok := out[p]; !ok {
				rp := kmsg.NewListOffsetsRequestTopicPartition()
				rp.Partition, rp.Timestamp = p, timestamp
				rt.Partitions = append(rt.Partitions, rp)
			}
		}
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			last = err
		} else {
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
						last = fmt.Errorf("%s[%d]: %w", kafkaTopic, p.Partition, err)
						continue
					}
					out[p.Partition] = p.Offset
				}
			}
		}
		return fmt.Sprintf("%d of %d partitions answered", len(out), kafkaPartitions), len(out) == kafkaPartitions
	})
	if err != nil {
		return nil, fmt.Errorf("%w (last error: %v)", err, last)
	}
	return out, nil
}

// recordHeaders returns the first value of each of r's headers.
func recordHeaders(r *kgo.Record) map[string]string {
	out := make(map[string]string, len(r.Headers))
	for _, h := range r.Headers {
		if _, ok := out[h.Key]; !ok {
			out[h.Key] = string(h.Value)
		}
	}
	return out
}
