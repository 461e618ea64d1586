package bench

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/brokers"
	"github.com/outboxkit/outbox/outboxnats"
)

func init() { RegisterTarget(brokers.NATS, openNATS) }

// natsTarget publishes to JetStream streams of its own, file-backed like a production
// stream.
type natsTarget struct {
	url string
	nc  *nats.Conn
	js  jetstream.JetStream

	streams sync.Map // route -> jetstream.Stream, for Count
}

func openNATS(ctx context.Context, url string) (Target, error) {
	nc, err := nats.Connect(url, nats.Name("outbox-bench"))
	if err != nil {
		return nil, fmt.Errorf("connect to NATS: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &natsTarget{url: url, nc: nc, js: js}, nil
}

func (t *natsTarget) Prepare(ctx context.Context, name string) (string, func(), error) {
	stream := strings.ToUpper(name)
	if _, err := t.js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{name + ".>"}}); err != nil {
		return "", nil, fmt.Errorf("create stream %s: %w", stream, err)
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = t.js.DeleteStream(ctx, stream)
	}
	return name + ".events", drop, nil
}

func (t *natsTarget) Broker() (string, brokers.Settings) { return t.url, brokers.Settings{} }

// Raw publishes asynchronously with message ids, keeping up to 4,000 unacknowledged (the
// publisher's default window, and the client's own limit: a publish beyond it waits for
// an acknowledgement, up to a minute, as the publisher's does up to its deadline,
// rather than failing after the client's default 200 ms on a loaded machine). The wire
// messages are built by the publisher's own code (outboxnats.Publisher.Msg).
func (t *natsTarget) Raw(ctx context.Context, route string, msgs []*outbox.Message) error {
	builder, err := outboxnats.New(t.js, outboxnats.Config{Route: route})
	if err != nil {
		return err
	}
	futures := make(chan jetstream.PubAckFuture, outboxnats.MaxPendingDefault)
	errc := make(chan error, 1)
	go func() {
		defer close(errc)
		for f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				errc <- err
				for range futures {
				}
				return
			case <-ctx.Done():
				errc <- ctx.Err()
				for range futures {
				}
				return
			}
		}
	}()
	for _, m := range msgs {
		msg, err := builder.Msg(m)
		if err == nil {
			var f jetstream.PubAckFuture
			if f, err = t.js.PublishMsgAsync(msg, jetstream.WithMsgID(m.DedupID()), jetstream.WithStallWait(time.Minute)); err == nil {
				futures <- f
				continue
			}
		}
		close(futures)
		return err
	}
	close(futures)
	return <-errc
}

// PrepareTopics makes a stream for the subjects name.<topic>.
func (t *natsTarget) PrepareTopics(ctx context.Context, name string) (string, func(string) string, func(), error) {
	_, drop, err := t.Prepare(ctx, name)
	if err != nil {
		return "", nil, nil, err
	}
	return name + ".{topic}", func(topic string) string { return name + "." + topic }, drop, nil
}

// Read subscribes to route's subject with core NATS, on a connection of its own, and
// sees each message as the server accepts it for the stream. The subscription buffers
// without a limit, so that a burst that outpaces got loses nothing.
func (t *natsTarget) Read(route string, got func(payload []byte)) (func(), error) {
	nc, err := nats.Connect(t.url, nats.Name("outbox-bench-reader"))
	if err != nil {
		return nil, fmt.Errorf("connect to NATS: %w", err)
	}
	sub, err := nc.Subscribe(route, func(m *nats.Msg) { got(m.Data) })
	if err == nil {
		err = sub.SetPendingLimits(-1, -1)
	}
	if err == nil {
		err = nc.Flush()
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("subscribe to %s: %w", route, err)
	}
	return nc.Close, nil
}

// Count reads how many messages of route's subject its stream holds.
func (t *natsTarget) Count(ctx context.Context, route string) (int64, error) {
	s, ok := t.streams.Load(route)
	if !ok {
		name, err := t.js.StreamNameBySubject(ctx, route)
		if err != nil {
			return 0, err
		}
		if s, err = t.js.Stream(ctx, name); err != nil {
			return 0, err
		}
		t.streams.Store(route, s)
	}
	info, err := s.(jetstream.Stream).Info(ctx, jetstream.WithSubjectFilter(route))
	if err != nil {
		return 0, err
	}
	return int64(info.State.Subjects[route]), nil
}

func (t *natsTarget) Close() { t.nc.Close() }
