package chaos

import (
	"context"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testnats"
	"github.com/outboxkit/outbox/internal/testinfra/testproxy"
	"github.com/outboxkit/outbox/internal/testinfra/torture"
	"github.com/outboxkit/outbox/internal/testinfra/torture/nemesis"
	"github.com/outboxkit/outbox/outboxnats"
)

const (
	natsStream  = "TORTURE"
	natsSubject = "torture"
)

func init() {
	register("nats", brokerKind{
		new: func() Broker { return &natsBroker{} },
		dial: func(ctx context.Context, url, route string) (Publisher, error) {
			return outboxnats.Dial(ctx, url, outboxnats.Config{Route: route})
		},
	})
}

// natsBroker is a private nats-server with a file-stored stream, so a restart keeps what
// was acknowledged; relays reach it through a proxy.
type natsBroker struct {
	srv   *testnats.Server
	proxy *testproxy.Proxy
}

func (b *natsBroker) Start(tb testenv.TB) {
	b.srv = testnats.StartServer(tb)
	nc, err := nats.Connect(b.srv.URL())
	if err != nil {
		tb.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(testenv.Context(tb), jetstream.StreamConfig{Name: natsStream, Subjects: []string{natsSubject + ".>"},
		Storage: jetstream.FileStorage, MaxMsgSize: 1 << 20}); err != nil {
		tb.Fatalf("create stream: %v", err)
	}
	b.proxy = testproxy.New(tb, strings.TrimPrefix(b.srv.URL(), "nats://"))
}

func (b *natsBroker) RelayURL() string { return "nats://" + b.proxy.Addr() }
func (b *natsBroker) Route() string    { return natsSubject + ".{topic}" }

// OutboxRoute gives each outbox of a run a subject of its own: torture.<name>.<topic>.
func (b *natsBroker) OutboxRoute(name string) string { return natsSubject + "." + name + ".{topic}" }

// OutboxOf names the outbox whose subject dest is.
func (b *natsBroker) OutboxOf(dest string) string {
	rest, ok := strings.CutPrefix(dest, natsSubject+".")
	if !ok {
		return ""
	}
	name, _, _ := strings.Cut(rest, ".")
	return name
}

func (b *natsBroker) Faults(tb testenv.TB) []nemesis.Fault {
	return append([]nemesis.Fault{
		{Kind: KindBrokerRestart, MinHold: 200 * time.Millisecond, MaxHold: 1500 * time.Millisecond,
			Inject: func(*rand.Rand) (string, func() error, error) {
				b.srv.Stop()
				return "nats " + b.srv.URL(), func() error { b.srv.Start(); return nil }, nil
			}},
	}, brokerProxyFaults(tb, b.proxy)...)
}

// ReadBack reads the whole stream, from its first message to its last sequence, with an
// ordered consumer. Each copy's Arrived is the time the server stored it (the stream
// keeps it across restarts), for the run's timing figures. It takes as long as it takes:
// the run is invalid only when the read has made no progress for testenv.Stall().
func (b *natsBroker) ReadBack(tb testenv.TB, log *torture.DeliveryLog) {
	tb.Helper()
	ctx := testenv.Context(tb) // for the set-up calls, each prompt
	nc, err := nats.Connect(b.srv.URL())
	if err != nil {
		tb.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	st, err := js.Stream(ctx, natsStream)
	if err != nil {
		tb.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	last := info.State.LastSeq
	if info.State.FirstSeq > 1 || info.State.Msgs != last {
		tb.Fatalf("invalid run: the stream lost messages (first seq %d, last seq %d, %d messages)", info.State.FirstSeq, last, info.State.Msgs)
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		tb.Fatal(err)
	}
	// A fetch that brings nothing, or fails (a consumer reset that timed out on a loaded
	// machine), is tried again; only a read that stops moving makes the run invalid.
	var seq uint64
	var lastErr error
	progressed := time.Now()
	for seq < last {
		if time.Since(progressed) > testenv.Stall() { // a stall detector, not a budget
			tb.Fatalf("invalid run: read-back stopped at stream seq %d of %d: no message for %v (last error: %v)", seq, last, testenv.Stall(), lastErr)
		}
		batch, err := cons.Fetch(int(min(last-seq, 500)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			lastErr = err
			time.Sleep(100 * time.Millisecond) // paces the retries
			continue
		}
		for msg := range batch.Messages() {
			md, err := msg.Metadata()
			if err != nil {
				tb.Fatal(err)
			}
			seq = md.Sequence.Stream
			progressed = time.Now()
			d, err := torture.ParseDelivery(firstValues(msg.Headers()), msg.Data())
			if err != nil {
				tb.Fatalf("stream seq %d: %v", seq, err)
			}
			d.Arrived = md.Timestamp // when the server stored it: this host's clock
			d.Dest = msg.Subject()
			log.Add(d)
		}
		if err := batch.Error(); err != nil {
			lastErr = err
		}
	}
}

func firstValues(h nats.Header) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		if len(v) > 0 {
			out[k] = v[0]
		}
	}
	return out
}
