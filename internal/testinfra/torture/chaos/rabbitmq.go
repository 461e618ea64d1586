package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testproxy"
	"github.com/outboxkit/outbox/internal/testinfra/testrabbit"
	"github.com/outboxkit/outbox/internal/testinfra/torture"
	"github.com/outboxkit/outbox/internal/testinfra/torture/nemesis"
	"github.com/outboxkit/outbox/outboxamqp"
)

const (
	// The relays publish to a durable topic exchange whose one durable queue is bound
	// with "#": every routing key reaches it, so the queue holds every copy in the order
	// the broker took them.
	rabbitExchange = "torture"
	rabbitQueue    = "torture"
	rabbitBinding  = "#"

	// KindRabbitUnbind removes the queue's binding for the hold, then binds it again:
	// meanwhile every publish comes back as unroutable (basic.return, then basic.ack),
	// which the publisher must report as a rejection, never as published.
	KindRabbitUnbind = "rabbitmq-unbind"

	// RabbitMaxAttempts is the relays' attempt limit in RabbitMQ runs (unless
	// Config.MaxAttempts says otherwise).
	// Returns are rejections, and each burns an attempt: a message retried every 50–250
	// ms (RelayMain's backoff) spends at most 17 attempts in one unbind (at most 800 ms)
	// and 34 in two in a row, so the limit sits above that and only poison, refused
	// every time, is dead-lettered. Poison then takes about 8 s to die, and a key's later
	// events wait for it.
	RabbitMaxAttempts = 40
)

func init() {
	register("rabbitmq", brokerKind{
		new: func() Broker { return &rabbitBroker{} },
		dial: func(ctx context.Context, url, route string) (Publisher, error) {
			return outboxamqp.Dial(ctx, url, outboxamqp.Config{Exchange: rabbitExchange, Route: route})
		},
		maxAttempts: RabbitMaxAttempts,
	})
}

// rabbitBroker is a private RabbitMQ node (package testrabbit) with the run's exchange
// and durable queue; relays reach it through a proxy. Persistent messages confirmed into
// the durable queue survive its restarts.
type rabbitBroker struct {
	srv   *testrabbit.Server
	proxy *testproxy.Proxy
}

func (b *rabbitBroker) Start(tb testenv.TB) {
	b.srv = testrabbit.StartServer(tb)
	err := b.admin(func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(rabbitExchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(rabbitQueue, true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(rabbitQueue, rabbitBinding, rabbitExchange, false, nil)
	})
	if err != nil {
		tb.Fatalf("declare the exchange and queue: %v", err)
	}
	b.proxy = testproxy.New(tb, b.srv.Addr())
}

func (b *rabbitBroker) RelayURL() string { return "amqp://guest:guest@" + b.proxy.Addr() + "/" }
func (b *rabbitBroker) Route() string    { return "{topic}.{key}" }

func (b *rabbitBroker) Faults(tb testenv.TB) []nemesis.Fault {
	return append([]nemesis.Fault{
		// A graceful stop of the node and a start, with its data: a node boot takes
		// several seconds, so the outage is longer than the hold.
		{Kind: KindBrokerRestart, MinHold: 200 * time.Millisecond, MaxHold: 1500 * time.Millisecond,
			Inject: func(*rand.Rand) (string, func() error, error) {
				b.srv.Stop()
				return "rabbitmq " + b.srv.Node(), func() error { b.srv.Start(); return nil }, nil
			}},
		{Kind: KindRabbitUnbind, MinHold: 200 * time.Millisecond, MaxHold: 800 * time.Millisecond,
			Inject: func(*rand.Rand) (string, func() error, error) {
				target := fmt.Sprintf("queue %s binding %q", rabbitQueue, rabbitBinding)
				if err := b.admin(func(ch *amqp.Channel) error {
					return ch.QueueUnbind(rabbitQueue, rabbitBinding, rabbitExchange, nil)
				}); err != nil {
					return target, nil, err
				}
				return target, func() error {
					return b.admin(func(ch *amqp.Channel) error {
						return ch.QueueBind(rabbitQueue, rabbitBinding, rabbitExchange, false, nil)
					})
				}, nil
			}},
	}, brokerProxyFaults(tb, b.proxy)...)
}

// admin runs f on a channel of a new connection to the node itself (not the proxy). The
// dial's timeout bounds a hang: a fault that fails makes the run fail, so a slow node
// must not.
func (b *rabbitBroker) admin(f func(ch *amqp.Channel) error) error {
	conn, err := amqp.DialConfig(b.srv.URL(), amqp.Config{Dial: amqp.DefaultDial(testenv.Stall())})
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	return f(ch)
}

// ReadBack consumes the whole queue, as many messages as its count says, in queue
// order.
func (b *rabbitBroker) ReadBack(tb testenv.TB, log *torture.DeliveryLog) {
	tb.Helper()
	conn, err := amqp.Dial(b.srv.URL())
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		tb.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive(rabbitQueue, true, false, false, false, nil)
	if err != nil {
		tb.Fatalf("invalid run: the queue is gone: %v", err)
	}
	total := q.Messages
	if err := ch.Qos(1000, 0, false); err != nil {
		tb.Fatal(err)
	}
	deliveries, err := ch.Consume(rabbitQueue, "read-back", false, true, false, false, nil)
	if err != nil {
		tb.Fatal(err)
	}
	stall := testenv.Stall() // no message for this long: the read-back has stopped
	timer := time.NewTimer(stall)
	defer timer.Stop()
	for n := 0; n < total; {
		select {
		case d, ok := <-deliveries:
			if !ok {
				tb.Fatalf("invalid run: read-back stopped at message %d of %d: the channel closed", n, total)
			}
			n++
			c, err := torture.ParseDelivery(outboxamqp.HeaderStrings(d.Headers), d.Body)
			if err != nil {
				tb.Fatalf("message %d of the queue: %v", n, err)
			}
			log.Add(c)
			if n%500 == 0 || n == total {
				if err := d.Ack(true); err != nil {
					tb.Fatal(err)
				}
			}
			timer.Reset(stall)
		case <-timer.C:
			tb.Fatalf("invalid run: read-back stopped at message %d of %d: nothing came for %v", n, total, stall)
		}
	}
}
