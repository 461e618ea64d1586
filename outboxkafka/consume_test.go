package outboxkafka_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxkafka"
)

// seqRecords returns perPartition records for each of partitions partitions of topic,
// valued "p/i" (partition p, i-th of it), with Outbox-Id "id-p-i" and key "k<p>".
func seqRecords(topic string, partitions, perPartition int) []*kgo.Record {
	var out []*kgo.Record
	for i := range perPartition {
		for p := range partitions {
			out = append(out, &kgo.Record{
				Topic: topic, Partition: int32(p), Key: []byte("k" + strconv.Itoa(p)),
				Value: fmt.Appendf(nil, "%d/%d", p, i),
				Headers: []kgo.RecordHeader{
					{Key: outbox.HeaderID, Value: fmt.Appendf(nil, "id-%d-%d", p, i)},
					{Key: outbox.HeaderEventType, Value: []byte("placed")},
					{Key: outbox.HeaderTopic, Value: []byte("orders")},
				},
			})
		}
	}
	return out
}

// produce writes records to the partitions they name.
func (tc *testCluster) produce(t *testing.T, records ...*kgo.Record) {
	t.Helper()
	cl := tc.client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	defer cl.Close()
	for chunk := range slices.Chunk(records, 1000) {
		if err := cl.ProduceSync(testenv.Context(t), chunk...).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
}

// seq parses a "p/i" payload.
func seq(t *testing.T, payload []byte) (p, i int) {
	t.Helper()
	if _, err := fmt.Sscanf(string(payload), "%d/%d", &p, &i); err != nil {
		t.Errorf("payload %q: %v", payload, err)
	}
	return p, i
}

// consumer is a Consume call running in the background.
type consumer struct {
	cancel context.CancelFunc
	errc   chan error
	once   sync.Once
	err    error
}

// startConsumer runs Consume on tc until stop (or the end of the test). Its client
// heartbeats every 100 ms, so that rebalances start quickly.
func (tc *testCluster) startConsumer(t *testing.T, cfg outboxkafka.ConsumerConfig, h outbox.Handler, opts ...kgo.Opt) *consumer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &consumer{cancel: cancel, errc: make(chan error, 1)}
	opts = append([]kgo.Opt{kgo.HeartbeatInterval(100 * time.Millisecond)}, opts...)
	go func() { c.errc <- outboxkafka.Consume(ctx, tc.seeds, cfg, h, opts...) }()
	t.Cleanup(func() {
		if err := c.stop(t); err != nil {
			t.Errorf("Consume: %v", err)
		}
	})
	return c
}

// stop cancels the consumer's ctx and returns what Consume returned.
func (c *consumer) stop(t *testing.T) error {
	t.Helper()
	c.once.Do(func() {
		c.cancel()
		c.err = testenv.AwaitRecv(t, "Consume to return once its ctx was cancelled", c.errc)
	})
	return c.err
}

// committedAll waits until the group has committed offset at on every partition of
// topic, failing the test when the offsets stop moving for testenv.Stall().
func (tc *testCluster) committedAll(t *testing.T, what, group, topic string, partitions int, at int64) {
	t.Helper()
	testenv.Await(t, what, func() (any, bool) {
		offsets := tc.committed(t, group, topic, partitions)
		for _, o := range offsets {
			if o != at {
				return fmt.Sprint("committed ", offsets), false
			}
		}
		return nil, true
	})
}

// committed returns the group's committed offset per partition of topic (-1: none).
func (tc *testCluster) committed(t *testing.T, group, topic string, partitions int) map[int32]int64 {
	t.Helper()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic = topic
	for p := range partitions {
		rt.Partitions = append(rt.Partitions, int32(p))
	}
	req.Topics = append(req.Topics, rt)
	out := map[int32]int64{}
	for p := range partitions {
		out[int32(p)] = -1
	}
	ctx, cancel := testenv.CallContext() // committed is polled
	defer cancel()
	resp, err := req.RequestWith(ctx, tc.admin)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if errors.Is(err, kerr.GroupIDNotFound) {
		return out
	}
	if err != nil {
		t.Fatalf("offset fetch: %v", err)
	}
	for _, rt := range resp.Topics {
		for _, p := range rt.Partitions {
			out[p.Partition] = p.Offset
		}
	}
	return out
}

// describeGroup returns the group's state and member count.
func (tc *testCluster) describeGroup(t *testing.T, group string) (string, int) {
	t.Helper()
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Groups = []string{group}
	resp, err := req.RequestWith(testenv.Context(t), tc.admin)
	if err == nil {
		err = kerr.ErrorForCode(resp.Groups[0].ErrorCode)
	}
	if err != nil {
		t.Fatalf("describe group: %v", err)
	}
	return resp.Groups[0].State, len(resp.Groups[0].Members)
}

// crashDialer lets a test kill a client as a crash would: every connection drops and
// none can be made again, so the client can neither commit nor leave its group.
type crashDialer struct {
	mu      sync.Mutex
	conns   []net.Conn
	crashed bool
}

func (d *crashDialer) dial(ctx context.Context, network, host string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.crashed {
		return nil, errors.New("crashed")
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, host)
	if err == nil {
		d.conns = append(d.conns, c)
	}
	return c, err
}

func (d *crashDialer) crash() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.crashed = true
	for _, c := range d.conns {
		c.Close()
	}
}

// crashOpts are the options of a consumer a test kills: it is removed from the group
// session after its crash (the cluster must allow so short a session timeout). Until the
// crash it heartbeats every 100 ms: a session of a second is lost only if the process
// stalls for most of one, which a loaded machine can do; a test that a lost session would
// fail takes a longer one, and waits that long after the crash.
func crashOpts(d *crashDialer, session time.Duration) []kgo.Opt {
	return []kgo.Opt{kgo.Dialer(d.dial), kgo.SessionTimeout(session), kgo.RequestRetries(2)}
}

var groupSeq atomic.Int64

func newGroup() string { return fmt.Sprintf("group-%d", groupSeq.Add(1)) }

// TestConsumePartitionOrder: records of one partition are handled one at a time in
// offset order, partitions in parallel, every record once, with its metadata; then the
// group's offsets are at the end of every partition.
func TestConsumePartitionOrder(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	const partitions, per = 4, 250
	topic := tc.createTopic(t, partitions, nil)
	tc.produce(t, seqRecords(topic, partitions, per)...)

	var mu sync.Mutex
	next := make([]int, partitions)
	handled := 0
	// The first record of every partition waits for the first records of all the
	// others: the test hangs (and fails) unless partitions run in parallel.
	var firsts sync.WaitGroup
	firsts.Add(partitions)
	h := func(ctx context.Context, d *outbox.Delivery) error {
		p, i := seq(t, d.Payload)
		if i == 0 {
			firsts.Done()
			firsts.Wait()
		}
		mu.Lock()
		defer mu.Unlock()
		if i != next[p] {
			t.Errorf("partition %d: record %d handled, want %d", p, i, next[p])
		}
		next[p] = i + 1
		handled++
		if d.ID != fmt.Sprintf("id-%d-%d", p, i) || d.Key != "k"+strconv.Itoa(p) || d.EventType != "placed" ||
			d.Topic != "orders" || d.Destination != topic || d.Attempt != 1 {
			t.Errorf("delivery %+v", d)
		}
		return nil
	}
	group := newGroup()
	c := tc.startConsumer(t, outboxkafka.ConsumerConfig{Group: group, Topics: []string{topic}, QueueSize: 16}, h)
	tc.committedAll(t, "every record handled and committed", group, topic, partitions, per)
	if err := c.stop(t); err != nil {
		t.Fatal(err)
	}
	if handled != partitions*per {
		t.Fatalf("%d records handled, want %d", handled, partitions*per)
	}
}

// TestConsumeCommitsOnlyHandled kills a consumer while the record at offset k of each
// partition is in its handler and the records behind it are fetched: the group's offsets
// stand at k, and a new member resumes there, redelivering only the records that were
// in flight.
func TestConsumeCommitsOnlyHandled(t *testing.T) {
	t.Parallel()
	tc := startCluster(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	const partitions, per, k = 3, 60, 20
	topic := tc.createTopic(t, partitions, nil)
	tc.produce(t, seqRecords(topic, partitions, per)...)
	group := newGroup()
	cfg := outboxkafka.ConsumerConfig{Group: group, Topics: []string{topic}, ShutdownTimeout: time.Second}

	var mu sync.Mutex
	seen := map[string][][]int{"a": make([][]int, partitions), "b": make([][]int, partitions)}
	record := func(who string, d *outbox.Delivery) (p, i int) {
		p, i = seq(t, d.Payload)
		mu.Lock()
		defer mu.Unlock()
		seen[who][p] = append(seen[who][p], i)
		return p, i
	}
	var inFlight sync.WaitGroup
	inFlight.Add(partitions)
	release := make(chan struct{})
	a := func(ctx context.Context, d *outbox.Delivery) error {
		if _, i := record("a", d); i == k {
			inFlight.Done()
			<-release // the crash comes while this record is in the handler
		}
		return nil
	}
	dialer := &crashDialer{}
	// A session lost before the crash would make the first member handle record k
	// again: 10 s, far beyond any stall of its heartbeats.
	ca := tc.startConsumer(t, cfg, a, crashOpts(dialer, 10*time.Second)...)
	inFlightDone := make(chan struct{})
	go func() { inFlight.Wait(); close(inFlightDone) }()
	testenv.AwaitChan(t, "record k of every partition in the first member's handler", inFlightDone, func() any {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprint("handled per partition ", seen["a"])
	})
	testenv.Await(t, "offsets committed up to the records in flight", func() (any, bool) {
		offsets := tc.committed(t, group, topic, partitions)
		for p, o := range offsets {
			if o > k {
				t.Fatalf("partition %d: offset %d committed while record %d is in its handler", p, o, k)
			}
		}
		for _, o := range offsets {
			if o < k {
				return fmt.Sprint("committed ", offsets), false
			}
		}
		return nil, true
	})
	dialer.crash()

	b := func(ctx context.Context, d *outbox.Delivery) error {
		record("b", d)
		return nil
	}
	cb := tc.startConsumer(t, cfg, b)
	testenv.Await(t, "the new member to handle every record", func() (any, bool) {
		mu.Lock()
		defer mu.Unlock()
		last := make([]int, partitions) // per partition, the last record b handled
		done := true
		for p, s := range seen["b"] {
			last[p] = -1
			if len(s) > 0 {
				last[p] = s[len(s)-1]
			}
			done = done && last[p] == per-1
		}
		return fmt.Sprint("last handled per partition ", last), done
	})
	if err := cb.stop(t); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := ca.stop(t); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for p := range partitions {
		var wantA, wantB []int
		for i := range k + 1 {
			wantA = append(wantA, i)
		}
		for i := k; i < per; i++ {
			wantB = append(wantB, i)
		}
		if !slices.Equal(seen["a"][p], wantA) || !slices.Equal(seen["b"][p], wantB) {
			t.Errorf("partition %d: first member handled %v, second %v; want %v and %v",
				p, seen["a"][p], seen["b"][p], wantA, wantB)
		}
	}
}

// TestConsumeRetryInPlace: a failing record is retried in place with its attempt
// number, and the records behind it wait for it.
func TestConsumeRetryInPlace(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 1, nil)
	tc.produce(t, seqRecords(topic, 1, 5)...)
	var mu sync.Mutex
	var calls []string
	done := make(chan struct{})
	h := func(ctx context.Context, d *outbox.Delivery) error {
		_, i := seq(t, d.Payload)
		mu.Lock()
		calls = append(calls, fmt.Sprintf("%d#%d", i, d.Attempt))
		mu.Unlock()
		switch {
		case i == 1 && d.Attempt == 1:
			return outbox.Retry(errors.New("not yet"), time.Millisecond)
		case i == 1 && d.Attempt == 2:
			return errors.New("still not") // the default delay
		case i == 4:
			close(done)
		}
		return nil
	}
	group := newGroup()
	c := tc.startConsumer(t, outboxkafka.ConsumerConfig{Group: group, Topics: []string{topic}, RetryDelay: time.Millisecond}, h)
	testenv.AwaitChan(t, "the last record to be handled", done, func() any {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(calls, " ")
	})
	if err := c.stop(t); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(calls, " "); got != "0#1 1#1 1#2 1#3 2#1 3#1 4#1" {
		t.Fatalf("handler calls %s", got)
	}
	if o := tc.committed(t, group, topic, 1)[0]; o != 5 {
		t.Fatalf("committed offset %d, want 5", o)
	}
}

// TestConsumeDeadLetter: a record that keeps failing is dead-lettered after MaxAttempts
// while the other partitions flow, a permanent error at once; the dead letters carry
// where they came from and why, and the records behind them are handled.
func TestConsumeDeadLetter(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	const partitions, per = 3, 30
	topic := tc.createTopic(t, partitions, nil)
	dlt := tc.createTopic(t, 2, nil)
	tc.produce(t, seqRecords(topic, partitions, per)...)

	var mu sync.Mutex
	attempts := map[string][]int{}
	handled := make([][]int, partitions)
	othersDone := make(chan struct{})
	var closeOnce sync.Once
	progress := func() {
		if len(handled[1]) == per-1 && len(handled[2]) == per {
			closeOnce.Do(func() { close(othersDone) })
		}
	}
	h := func(ctx context.Context, d *outbox.Delivery) error {
		p, i := seq(t, d.Payload)
		id := fmt.Sprintf("%d/%d", p, i)
		mu.Lock()
		attempts[id] = append(attempts[id], d.Attempt)
		mu.Unlock()
		switch id {
		case "0/5": // poison: holds partition 0 until it is dead-lettered
			if d.Attempt == 1 {
				<-othersDone // partitions 1 and 2 are handled meanwhile
			}
			return errors.New("always")
		case "1/3":
			return outbox.Permanent(errors.New("bad payload"))
		}
		mu.Lock()
		defer mu.Unlock()
		handled[p] = append(handled[p], i)
		progress()
		return nil
	}
	group := newGroup()
	cfg := outboxkafka.ConsumerConfig{Group: group, Topics: []string{topic}, DeadLetterTopic: dlt,
		MaxAttempts: 3, RetryDelay: time.Millisecond, QueueSize: 4}
	c := tc.startConsumer(t, cfg, h)
	tc.committedAll(t, "every partition committed", group, topic, partitions, per)
	if err := c.stop(t); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(attempts["0/5"]) != "[1 2 3]" || fmt.Sprint(attempts["1/3"]) != "[1]" {
		t.Fatalf("attempts of the poison %v, of the permanent failure %v", attempts["0/5"], attempts["1/3"])
	}
	for p := range partitions {
		var want []int
		for i := range per {
			if !(p == 0 && i == 5 || p == 1 && i == 3) {
				want = append(want, i)
			}
		}
		if !slices.Equal(handled[p], want) {
			t.Errorf("partition %d handled %v, want %v", p, handled[p], want)
		}
	}

	dead := tc.read(t, dlt, 2)
	if len(dead) != 2 {
		t.Fatalf("%d dead letters, want 2", len(dead))
	}
	byValue := map[string]map[string]string{}
	for _, r := range dead {
		byValue[string(r.Value)] = headerMap(r)
		if p, _ := seq(t, r.Value); string(r.Key) != "k"+strconv.Itoa(p) {
			t.Errorf("dead letter %s has key %q", r.Value, r.Key)
		}
	}
	for value, want := range map[string]map[string]string{
		"0/5": {outboxkafka.HeaderDeadReason: "always", outboxkafka.HeaderDeadAttempts: "3",
			outboxkafka.HeaderDeadPartition: "0", outboxkafka.HeaderDeadOffset: "5", outbox.HeaderID: "id-0-5"},
		"1/3": {outboxkafka.HeaderDeadReason: "permanent: bad payload", outboxkafka.HeaderDeadAttempts: "1",
			outboxkafka.HeaderDeadPartition: "1", outboxkafka.HeaderDeadOffset: "3", outbox.HeaderID: "id-1-3"},
	} {
		got := byValue[value]
		want[outboxkafka.HeaderDeadTopic] = topic
		want[outboxkafka.HeaderDeadGroup] = group
		want[outbox.HeaderEventType] = "placed"
		for k, v := range want {
			if got[k] != v {
				t.Errorf("dead letter %s: header %s = %q, want %q (headers %v)", value, k, got[k], v, got)
			}
		}
	}
}

// TestConsumeNoDeadLetterTopic: without a dead-letter topic, a dead letter is logged
// with its identity and skipped.
func TestConsumeNoDeadLetterTopic(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 1, nil)
	tc.produce(t, seqRecords(topic, 1, 3)...)
	var logs syncBuffer
	var mu sync.Mutex
	var handled []string
	done := make(chan struct{})
	h := func(ctx context.Context, d *outbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		switch string(d.Payload) {
		case "0/1":
			if d.Attempt < 2 {
				return errors.New("flaky")
			}
			return outbox.Permanent(errors.New("poison"))
		case "0/2":
			close(done)
		}
		handled = append(handled, string(d.Payload))
		return nil
	}
	group := newGroup()
	cfg := outboxkafka.ConsumerConfig{Group: group, Topics: []string{topic}, RetryDelay: time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	c := tc.startConsumer(t, cfg, h)
	testenv.AwaitChan(t, "the last record to be handled", done, func() any {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprint("handled ", handled)
	})
	if err := c.stop(t); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(handled) != "[0/0 0/2]" {
		t.Fatalf("handled %v", handled)
	}
	out := logs.String()
	for _, want := range []string{
		`level=WARN msg="handler failed; retrying in place" group=` + group + ` event_id=id-0-1 aggregate_id=k0 event_type=placed topic=` + topic + ` partition=0 offset=1 attempt=1 retry_in=1ms err=flaky`,
		`level=ERROR msg="record skipped: the handler failed and no dead-letter topic is set; it stays in its topic at its offset" group=` + group + ` event_id=id-0-1 aggregate_id=k0 event_type=placed topic=` + topic + ` partition=0 offset=1 attempt=2 err="permanent: poison"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s\nlog:\n%s", want, out)
		}
	}
}

// syncBuffer is the output of a command the test reads while it is written.
type syncBuffer = testenv.Buffer

// TestConsumeGracefulShutdown: a handler in progress when ctx is cancelled finishes with
// a live context, its offset is committed, the records behind it are left to the next
// member, and the member leaves the group.
func TestConsumeGracefulShutdown(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 1, nil)
	tc.produce(t, seqRecords(topic, 1, 3)...)
	group := newGroup()
	cfg := outboxkafka.ConsumerConfig{Group: group, Topics: []string{topic}}
	started, proceed := make(chan struct{}), make(chan struct{})
	var handled []string
	h := func(ctx context.Context, d *outbox.Delivery) error {
		handled = append(handled, string(d.Payload))
		close(started)
		<-proceed // the shutdown has begun
		if ctx.Err() != nil {
			t.Error("the handler's context was cancelled by the shutdown")
		}
		return nil
	}
	c := tc.startConsumer(t, cfg, h)
	testenv.AwaitChan(t, "the first record to reach the handler", started, func() any { return "not yet" })
	c.cancel()
	close(proceed)
	if err := c.stop(t); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(handled) != "[0/0]" {
		t.Fatalf("handled %v during the shutdown, want the record in progress only", handled)
	}
	if o := tc.committed(t, group, topic, 1)[0]; o != 1 {
		t.Fatalf("committed offset %d after the shutdown, want 1", o)
	}
	if state, members := tc.describeGroup(t, group); state != "Empty" || members != 0 {
		t.Fatalf("group %s with %d members after the shutdown, want Empty", state, members)
	}

	var rest []string
	done := make(chan struct{})
	c2 := tc.startConsumer(t, cfg, func(ctx context.Context, d *outbox.Delivery) error {
		if rest = append(rest, string(d.Payload)); len(rest) == 2 {
			close(done)
		}
		return nil
	})
	testenv.AwaitChan(t, "the next member to handle the other two records", done, func() any { return "not yet" })
	if err := c2.stop(t); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(rest) != "[0/1 0/2]" {
		t.Fatalf("the next member handled %v, want [0/1 0/2]", rest)
	}
}

// TestConsumeConcurrency: Concurrency caps the handlers running at once over all
// partitions.
func TestConsumeConcurrency(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	const partitions, per = 4, 50
	topic := tc.createTopic(t, partitions, nil)
	tc.produce(t, seqRecords(topic, partitions, per)...)
	var running, peak, handled atomic.Int64
	done := make(chan struct{})
	h := func(ctx context.Context, d *outbox.Delivery) error {
		n := running.Add(1)
		defer running.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(100 * time.Microsecond) // pacing: lets handlers overlap, so that a missing cap shows
		if handled.Add(1) == partitions*per {
			close(done)
		}
		return nil
	}
	c := tc.startConsumer(t, outboxkafka.ConsumerConfig{Group: newGroup(), Topics: []string{topic}, Concurrency: 2}, h)
	testenv.AwaitChan(t, "every record to be handled", done, func() any { return fmt.Sprintf("%d of %d handled", handled.Load(), partitions*per) })
	if err := c.stop(t); err != nil {
		t.Fatal(err)
	}
	if p := peak.Load(); p > 2 {
		t.Fatalf("%d handlers ran at once, want at most 2", p)
	}
}

func TestConsumeConfig(t *testing.T) {
	t.Parallel()
	h := func(context.Context, *outbox.Delivery) error { return nil }
	seeds := []string{"127.0.0.1:1"}
	valid := outboxkafka.ConsumerConfig{Group: "g", Topics: []string{"t"}}
	with := func(f func(*outboxkafka.ConsumerConfig)) outboxkafka.ConsumerConfig {
		c := valid
		f(&c)
		return c
	}
	for _, c := range []struct {
		field string
		cfg   outboxkafka.ConsumerConfig
	}{
		{"Group", outboxkafka.ConsumerConfig{Topics: []string{"t"}}},
		{"Topics", outboxkafka.ConsumerConfig{Group: "g"}},
		{"Topics", with(func(c *outboxkafka.ConsumerConfig) { c.Topics = []string{"t", "bad topic"} })},
		{"MaxAttempts", with(func(c *outboxkafka.ConsumerConfig) { c.MaxAttempts = -2 })},
		{"RetryDelay", with(func(c *outboxkafka.ConsumerConfig) { c.RetryDelay = -1 })},
		{"Concurrency", with(func(c *outboxkafka.ConsumerConfig) { c.Concurrency = -1 })},
		{"QueueSize", with(func(c *outboxkafka.ConsumerConfig) { c.QueueSize = -1 })},
		{"ShutdownTimeout", with(func(c *outboxkafka.ConsumerConfig) { c.ShutdownTimeout = -1 })},
		{"DeadLetterTopic", with(func(c *outboxkafka.ConsumerConfig) { c.DeadLetterTopic = "t" })},
		{"DeadLetterTopic", with(func(c *outboxkafka.ConsumerConfig) { c.DeadLetterTopic = ".." })},
	} {
		err := outboxkafka.Consume(context.Background(), seeds, c.cfg, h)
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field || !errors.Is(err, outbox.ErrInvalidConfig) {
			t.Errorf("Consume(%+v) = %v, want a ConfigError on %s", c.cfg, err, c.field)
		}
	}
	var ce *outbox.ConfigError
	if err := outboxkafka.Consume(context.Background(), nil, valid, h); !errors.As(err, &ce) || ce.Field != "seeds" {
		t.Errorf("Consume without seeds = %v", err)
	}
	if err := outboxkafka.Consume(context.Background(), seeds, valid, nil); !errors.As(err, &ce) || ce.Field != "handler" {
		t.Errorf("Consume without a handler = %v", err)
	}

	tc := startCluster(t)
	topic := tc.createTopic(t, 1, nil)
	for _, cfg := range []outboxkafka.ConsumerConfig{
		{Group: "g", Topics: []string{topic, "missing-topic"}},
		{Group: "g", Topics: []string{topic}, DeadLetterTopic: "missing-dead-letters"},
	} {
		err := outboxkafka.Consume(testenv.Context(t), tc.seeds, cfg, h)
		if !errors.Is(err, outboxkafka.ErrNoTopic) || !strings.Contains(err.Error(), "missing-") {
			t.Errorf("Consume(%+v) = %v, want ErrNoTopic naming the topic", cfg, err)
		}
	}
}

// TestConsumeMalformed: records without outbox headers, with repeated, binary or
// nameless headers, null keys and values, a broken trace context or a handler that
// panics never stop the consumer; each gets the documented id.
func TestConsumeMalformed(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 1, nil)
	dlt := tc.createTopic(t, 1, nil)
	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	hdr := func(kv ...string) []kgo.RecordHeader {
		var hs []kgo.RecordHeader
		for i := 0; i < len(kv); i += 2 {
			hs = append(hs, kgo.RecordHeader{Key: kv[i], Value: []byte(kv[i+1])})
		}
		return hs
	}
	tc.produce(t,
		&kgo.Record{Topic: topic}, // 0: nothing at all
		&kgo.Record{Topic: topic, Value: []byte("x"), Headers: hdr("Outbox-Id", "first", "Outbox-Id", "second")},              // 1
		&kgo.Record{Topic: topic, Key: []byte{0xff, 0}, Value: []byte{0xfe}, Headers: hdr("", "nameless", "bin", "\xff\x00")}, // 2
		&kgo.Record{Topic: topic, Headers: hdr(outbox.HeaderDedupKey, "dedup-1", outbox.HeaderKey, "from-header")},            // 3
		&kgo.Record{Topic: topic, Headers: hdr("traceparent", "garbage\x00")},                                                 // 4
		&kgo.Record{Topic: topic, Headers: hdr("Traceparent", traceparent, outbox.HeaderID, "traced")},                        // 5
		&kgo.Record{Topic: topic, Headers: hdr(outbox.HeaderID, "panics")},                                                    // 6
		&kgo.Record{Topic: topic, Headers: hdr(outbox.HeaderID, "last")},                                                      // 7
	)
	var got []string
	done := make(chan struct{})
	h := func(ctx context.Context, d *outbox.Delivery) error {
		got = append(got, fmt.Sprintf("%s|%q|%q|%s", d.ID, d.Key, d.Payload, outbox.TraceparentFromContext(ctx)))
		switch d.ID {
		case "panics":
			panic("boom")
		case "last":
			close(done)
		}
		return nil
	}
	c := tc.startConsumer(t, outboxkafka.ConsumerConfig{Group: newGroup(), Topics: []string{topic}, DeadLetterTopic: dlt}, h)
	testenv.AwaitChan(t, "the last record to be handled", done, func() any { return "not yet" })
	if err := c.stop(t); err != nil {
		t.Fatal(err)
	}
	want := []string{
		topic + `/0/0|""|""|`,
		`first|""|"x"|`,
		topic + `/0/2|"\xff\x00"|"\xfe"|`,
		`dedup-1|"from-header"|""|`,
		topic + `/0/4|""|""|garbage` + "\x00",
		`traced|""|""|` + traceparent,
		`panics|""|""|`,
		`last|""|""|`,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("deliveries\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	dead := tc.read(t, dlt, 1)
	if len(dead) != 1 || !strings.Contains(headerMap(dead[0])[outboxkafka.HeaderDeadReason], "handler panicked: boom") {
		t.Fatalf("dead letters %v", dead)
	}
}

// FuzzNewDelivery: any record gives a Delivery with an id, the same for the same record.
func FuzzNewDelivery(f *testing.F) {
	f.Add("Outbox-Id", []byte("id"), "Outbox-Id", []byte("id2"), []byte("key"), []byte("value"), int64(3))
	f.Add("", []byte{0xff}, "traceparent", []byte("00-x"), []byte(nil), []byte(nil), int64(-1))
	f.Fuzz(func(t *testing.T, k1 string, v1 []byte, k2 string, v2 []byte, key, value []byte, offset int64) {
		r := &kgo.Record{Topic: "t", Partition: 2, Offset: offset, Key: key, Value: value,
			Headers: []kgo.RecordHeader{{Key: k1, Value: v1}, {Key: k2, Value: v2}}}
		d := outboxkafka.NewDelivery(r, 0)
		if d.ID == "" || d.Attempt != 1 || d.Destination != "t" || !bytes.Equal(d.Payload, value) {
			t.Fatalf("delivery %+v", d)
		}
		if again := outboxkafka.NewDelivery(r, 0); again.ID != d.ID {
			t.Fatalf("ids %q and %q for one record", d.ID, again.ID)
		}
		if key != nil && d.Key != string(key) {
			t.Fatalf("key %q, want the record key %q", d.Key, key)
		}
	})
}

// inboxEffects sets up an effects table and returns a handler that inserts one effect
// row per new delivery through the inbox, and a function counting rows and distinct ids.
func inboxEffects(t *testing.T) (outbox.Handler, func() (rows, distinct int)) {
	t.Helper()
	db := testdb.Migrated(t)
	effects := `"` + db.Schema + `".effects`
	if _, err := db.Pool.Exec(context.Background(), `CREATE TABLE `+effects+` (id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	in, err := outbox.NewInbox[pgx.Tx](db.Driver, outbox.InboxConfig{Consumer: "effects"})
	if err != nil {
		t.Fatal(err)
	}
	inTx := func(ctx context.Context, fn func(pgx.Tx) error) error { return pgx.BeginFunc(ctx, db.Pool, fn) }
	h := outbox.InboxHandler(in, inTx, func(ctx context.Context, tx pgx.Tx, d *outbox.Delivery) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+effects+` VALUES ($1)`, d.ID)
		return err
	})
	count := func() (rows, distinct int) {
		if err := db.Pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT id) FROM `+effects).Scan(&rows, &distinct); err != nil {
			t.Fatal(err)
		}
		return rows, distinct
	}
	return h, count
}

// TestConsumeInboxExactlyOnce runs a consumer that is killed five times, each time just
// after a handler's transaction committed and before Kafka got the record's offset:
// every next consumer handles again the records since the last commit, and the inbox
// makes every effect happen exactly once. OUTBOX_TEST_INBOX_MESSAGES sets the number of
// records (default 10,000).
func TestConsumeInboxExactlyOnce(t *testing.T) {
	t.Parallel()
	n := 10_000
	if v, err := strconv.Atoi(os.Getenv("OUTBOX_TEST_INBOX_MESSAGES")); err == nil && v > 0 {
		n = v
	}
	const partitions, crashes = 8, 5
	tc := startCluster(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	topic := tc.createTopic(t, partitions, nil)
	tc.produce(t, seqRecords(topic, partitions, n/partitions)...)
	n = n / partitions * partitions
	work, count := inboxEffects(t)
	group := newGroup()
	cfg := outboxkafka.ConsumerConfig{Group: group, Topics: []string{topic}, ShutdownTimeout: time.Second}

	var handled atomic.Int64 // handler calls that completed their transaction
	var lives []*consumer
	for life := 0; ; life++ {
		dialer := &crashDialer{}
		var crashed atomic.Bool
		crashNow := make(chan struct{})
		var crashOnce sync.Once
		h := func(ctx context.Context, d *outbox.Delivery) error {
			if crashed.Load() {
				return outbox.Retry(errors.New("this process is dead"), time.Hour) // never comes back
			}
			if err := work(ctx, d); err != nil {
				return err
			}
			if life < crashes && handled.Add(1) >= int64((life+1)*n/(crashes+2)) {
				crashOnce.Do(func() { // the effect is committed, the offset will never be
					crashed.Store(true)
					dialer.crash()
					close(crashNow)
				})
			} else if life >= crashes {
				handled.Add(1)
			}
			return nil
		}
		// A session lost early only adds redeliveries, which the inbox absorbs.
		lives = append(lives, tc.startConsumer(t, cfg, h, crashOpts(dialer, time.Second)...))
		if life < crashes {
			testenv.AwaitChan(t, fmt.Sprintf("crash %d", life+1), crashNow, func() any { return fmt.Sprintf("%d handled", handled.Load()) })
			continue
		}
		testenv.Await(t, "every record handled and committed", func() (any, bool) {
			rows, _ := count()
			offsets := tc.committed(t, group, topic, partitions)
			done := rows >= n
			for _, o := range offsets {
				done = done && o == int64(n/partitions)
			}
			return fmt.Sprintf("%d of %d effects, committed %v", rows, n, offsets), done
		})
		break
	}
	for _, c := range lives {
		if err := c.stop(t); err != nil {
			t.Fatal(err)
		}
	}
	rows, distinct := count()
	t.Logf("%d records, %d handled (%d again after %d crashes)", n, handled.Load(), handled.Load()-int64(n), crashes)
	if rows != n || distinct != n {
		t.Fatalf("%d effects (%d distinct) for %d records; want exactly one each", rows, distinct, n)
	}
	if handled.Load() <= int64(n) {
		t.Fatalf("no record was handled twice: the crashes did not happen before commits")
	}
}

// TestConsumeRebalance runs a second member into the group while the first is busy,
// then stops the first: partitions move twice while records are in flight, every record
// is handled, exactly once (each member commits what it handled before giving a
// partition up, so nothing is even delivered twice), in partition order.
func TestConsumeRebalance(t *testing.T) {
	t.Parallel()
	const partitions, per = 6, 300
	n := partitions * per
	tc := startCluster(t)
	topic := tc.createTopic(t, partitions, nil)
	tc.produce(t, seqRecords(topic, partitions, per)...)
	work, count := inboxEffects(t)
	group := newGroup()
	cfg := outboxkafka.ConsumerConfig{Group: group, Topics: []string{topic}, QueueSize: 50}

	var mu sync.Mutex
	next := make([]int, partitions)
	byMember := map[string]int{}
	var handled atomic.Int64
	handler := func(member string) outbox.Handler {
		return func(ctx context.Context, d *outbox.Delivery) error {
			time.Sleep(time.Millisecond) // keep records in flight while partitions move
			if err := work(ctx, d); err != nil {
				return err
			}
			p, i := seq(t, d.Payload)
			mu.Lock()
			if i != next[p] {
				t.Errorf("partition %d: record %d handled by %s, want %d", p, i, member, next[p])
			}
			next[p] = i + 1
			byMember[member]++
			mu.Unlock()
			handled.Add(1)
			return nil
		}
	}
	progress := func(want int) func() (any, bool) {
		return func() (any, bool) {
			mu.Lock()
			defer mu.Unlock()
			return fmt.Sprintf("%d of %d handled, by member %v", handled.Load(), n, byMember), handled.Load() >= int64(want)
		}
	}
	a := tc.startConsumer(t, cfg, handler("a"))
	testenv.Await(t, "the first member to start", progress(n/6))
	b := tc.startConsumer(t, cfg, handler("b"))
	testenv.Await(t, "both members to handle records", func() (any, bool) {
		seen, enough := progress(n / 2)()
		mu.Lock()
		defer mu.Unlock()
		return seen, enough && byMember["b"] > 0
	})
	if err := a.stop(t); err != nil {
		t.Fatal(err)
	}
	testenv.Await(t, "every record handled", progress(n))
	if err := b.stop(t); err != nil {
		t.Fatal(err)
	}
	rows, distinct := count()
	t.Logf("handled by member: %v", byMember)
	if rows != n || distinct != n || handled.Load() != int64(n) {
		t.Fatalf("%d effects (%d distinct) from %d handler calls for %d records; want exactly one each", rows, distinct, handled.Load(), n)
	}
}

func ExampleConsume() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// An in-process cluster with an outbox message in "events.orders", for the example.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "events.orders", "billing.dead"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	pub, err := outboxkafka.Dial(ctx, cluster.ListenAddrs(), outboxkafka.Config{Route: "events.{topic}"})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	msg := &outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "order-42", Payload: []byte(`{"id":42}`)}
	if errs := pub.Publish(ctx, []*outbox.Message{msg}); errs != nil {
		log.Fatal(errs)
	}

	// In a service: ctx is the service's; Consume returns once it is done and the
	// handlers in progress have finished. Wrap the handler with outbox.InboxHandler for
	// exactly-once effects.
	consumeCtx, stop := context.WithCancel(ctx)
	err = outboxkafka.Consume(consumeCtx, cluster.ListenAddrs(), outboxkafka.ConsumerConfig{
		Group:           "billing",
		Topics:          []string{"events.orders"},
		DeadLetterTopic: "billing.dead",
	}, func(ctx context.Context, d *outbox.Delivery) error {
		fmt.Printf("%s %s\n", d.Key, d.Payload)
		stop()
		return nil
	})
	fmt.Println("consumer stopped:", err)
	// Output:
	// order-42 {"id":42}
	// consumer stopped: <nil>
}

// TestDeadLetterReplay: a dead letter is listed with where it came from and why, and
// once replayed (after the fix) it is handled, once; the other record is not touched.
func TestDeadLetterReplay(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	topic := tc.createTopic(t, 1, nil)
	dlt := tc.createTopic(t, 3, nil)
	tc.produce(t, seqRecords(topic, 1, 2)...) // 0/0 and 0/1
	var mu sync.Mutex
	poisoned := true
	handled := map[string]int{}
	h := func(ctx context.Context, d *outbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		if poisoned && string(d.Payload) == "0/1" {
			return outbox.Permanent(errors.New("poison"))
		}
		handled[string(d.Payload)]++
		return nil
	}
	group := newGroup()
	c := tc.startConsumer(t, outboxkafka.ConsumerConfig{Group: group, Topics: []string{topic}, DeadLetterTopic: dlt}, h)

	var dead []outboxkafka.DeadLetter
	testenv.AwaitCond(t, "the dead letter", func() bool {
		ctx, cancel := testenv.CallContext() // per poll
		defer cancel()
		var err error
		if dead, err = outboxkafka.ListDead(ctx, tc.seeds, dlt, 0); err != nil {
			t.Fatal(err)
		}
		return len(dead) > 0
	})
	d := dead[0]
	if len(dead) != 1 || string(d.Payload) != "0/1" || string(d.Key) != "k0" || d.ID != "id-0-1" || d.Topic != topic ||
		d.SourcePartition != 0 || d.SourceOffset != 1 || d.Group != group || d.Reason != "permanent: poison" ||
		d.Attempts != 1 || d.Time.IsZero() {
		t.Fatalf("dead letters %+v", dead)
	}
	if limited, err := outboxkafka.ListDead(testenv.Context(t), tc.seeds, dlt, 1); err != nil || len(limited) != 1 {
		t.Fatalf("ListDead with limit 1 = %v, %v", limited, err)
	}

	mu.Lock()
	poisoned = false // the fix is deployed
	mu.Unlock()
	if n, err := outboxkafka.ReplayDead(testenv.Context(t), tc.seeds, dead); err != nil || n != 1 {
		t.Fatalf("ReplayDead = %d, %v", n, err)
	}
	testenv.AwaitCond(t, "the replayed record", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return handled["0/1"] > 0
	})
	tc.committedAll(t, "the replayed record's offset committed", group, topic, 1, 3)
	if err := c.stop(t); err != nil {
		t.Fatal(err)
	}
	if handled["0/0"] != 1 || handled["0/1"] != 1 {
		t.Fatalf("handled %v, want each once", handled)
	}
	replayed := tc.read(t, topic, 3)[2]
	for _, h := range replayed.Headers {
		if strings.HasPrefix(h.Key, "Outbox-Dead-") {
			t.Errorf("replayed record keeps header %s", h.Key)
		}
	}
	if headerMap(replayed)[outbox.HeaderID] != "id-0-1" {
		t.Errorf("replayed record headers %v", headerMap(replayed))
	}

	if _, err := outboxkafka.ListDead(testenv.Context(t), tc.seeds, "no-such-topic", 0); !errors.Is(err, outboxkafka.ErrNoTopic) {
		t.Errorf("ListDead of a missing topic = %v, want ErrNoTopic", err)
	}
	if _, err := outboxkafka.ReplayDead(testenv.Context(t), tc.seeds, []outboxkafka.DeadLetter{{Payload: []byte("x")}}); err == nil {
		t.Error("ReplayDead of a record without Outbox-Dead-Topic succeeded")
	}
}
