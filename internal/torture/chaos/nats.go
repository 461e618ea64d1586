package chaos

import (
	"context"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testnats"
	"github.com/outboxkit/outbox/internal/testproxy"
	"github.com/outboxkit/outbox/internal/torture"
	"github.com/outboxkit/outbox/internal/torture/nemesis"
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
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: natsStream, Subjects: []string{natsSubject + ".>"},
		Storage: jetstream.FileStorage, MaxMsgSize: 1 << 20}); err != nil {
		tb.Fatalf("create stream: %v", err)
	}
	b.proxy = testproxy.New(tb, strings.TrimPrefix(b.srv.URL(), "nats://"))
}

func (b *natsBroker) RelayURL() string { return "nats://" + b.proxy.Addr() }
func (b *natsBroker) Route() string    { return natsSubject + ".{topic}" }

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
// ordered consumer.
func (b *natsBroker) ReadBack(tb testenv.TB, log *torture.DeliveryLog) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
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
	var seq uint64
	for seq < last {
		batch, err := cons.Fetch(int(min(last-seq, 500)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			tb.Fatalf("invalid run: read-back stopped at stream seq %d of %d: %v", seq, last, err)
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			md, err := msg.Metadata()
			if err != nil {
				tb.Fatal(err)
			}
			seq = md.Sequence.Stream
			d, err := torture.ParseDelivery(firstValues(msg.Headers()), msg.Data())
			if err != nil {
				tb.Fatalf("stream seq %d: %v", seq, err)
			}
			log.Add(d)
		}
		if err := batch.Error(); err != nil {
			tb.Fatalf("invalid run: read-back stopped at stream seq %d of %d: %v", seq, last, err)
		}
		if got == 0 {
			tb.Fatalf("invalid run: read-back stopped at stream seq %d of %d", seq, last)
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
