package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/brokers"
	"github.com/outboxkit/outbox/outboxredis"
)

func init() { RegisterTarget(brokers.Redis, openRedis) }

// redisTarget adds to streams of its own on one Redis server.
type redisTarget struct {
	url    string
	client *redis.Client
}

// Raw sends pipelines of redisRawPipeline XADDs, redisRawWorkers at once.
const (
	redisRawPipeline = 1000
	redisRawWorkers  = 4
)

func openRedis(ctx context.Context, url string) (Target, error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redis URL: %w", err)
	}
	opts.ContextTimeoutEnabled = true
	client := redis.NewClient(opts)
	if err := client.Ping(ctx).Err(); err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("connect to Redis: %w", err)
	}
	return &redisTarget{url: url, client: client}, nil
}

func (t *redisTarget) Prepare(ctx context.Context, name string) (string, func(), error) {
	stream := name + ".events"
	if err := t.client.Del(ctx, stream).Err(); err != nil {
		return "", nil, fmt.Errorf("empty stream %s: %w", stream, err)
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = t.client.Del(ctx, stream).Err()
	}
	return stream, drop, nil
}

func (t *redisTarget) Broker() (string, brokers.Settings) { return t.url, brokers.Settings{} }

// Raw adds the messages with go-redis's own XADD, pipelined: redisRawWorkers goroutines
// each send pipelines of redisRawPipeline commands on their own connection. The entries
// are built by the publisher's own code (outboxredis.Fields), so both send the same
// bytes.
func (t *redisTarget) Raw(ctx context.Context, route string, msgs []*outbox.Message) error {
	chunks := make(chan []*outbox.Message)
	go func() {
		defer close(chunks)
		for start := 0; start < len(msgs); start += redisRawPipeline {
			select {
			case chunks <- msgs[start:min(start+redisRawPipeline, len(msgs))]:
			case <-ctx.Done():
				return
			}
		}
	}()
	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	for range redisRawWorkers {
		wg.Go(func() {
			for chunk := range chunks {
				pipe := t.client.Pipeline()
				for _, m := range chunk {
					pipe.XAdd(ctx, &redis.XAddArgs{Stream: route, ID: "*", Values: outboxredis.Fields(m)})
				}
				if _, err := pipe.Exec(ctx); err != nil {
					once.Do(func() { firstErr = err })
				}
			}
		})
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return firstErr
}

func (t *redisTarget) Close() { _ = t.client.Close() }
