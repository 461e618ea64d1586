package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/brokers"
	"github.com/outboxkit/outbox/outboxsqs"
)

func init() { RegisterTarget(brokers.SQS, openSQS) }

// sqsTarget sends to FIFO queues of its own (per-key order on SQS needs FIFO). The URL
// is outboxsqs.Dial's ("sqs://?region=...&endpoint=..."); credentials come from the
// AWS SDK's chain.
type sqsTarget struct {
	url    string
	admin  *outboxsqs.Publisher // its client creates, deletes and fills queues
	client *sqs.Client
}

func openSQS(ctx context.Context, url string) (Target, error) {
	admin, err := outboxsqs.Dial(ctx, url, outboxsqs.Config{})
	if err != nil {
		return nil, fmt.Errorf("connect to SQS: %w", err)
	}
	return &sqsTarget{url: url, admin: admin, client: admin.Client()}, nil
}

func (t *sqsTarget) Prepare(ctx context.Context, name string) (string, func(), error) {
	queue := name + ".fifo"
	out, err := t.client.CreateQueue(ctx, &sqs.CreateQueueInput{
		QueueName:  aws.String(queue),
		Attributes: map[string]string{"FifoQueue": "true"},
	})
	if err != nil {
		return "", nil, fmt.Errorf("create queue %s: %w", queue, err)
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = t.client.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: out.QueueUrl})
	}
	return queue, drop, nil
}

func (t *sqsTarget) Broker() (string, brokers.Settings) { return t.url, brokers.Settings{} }

// Raw sends SendMessageBatch calls of 10 messages with the same client the publisher
// uses, outboxsqs.MaxInflightDefault of them at once (the publisher's default). The
// entries are built by the publisher's own code (outboxsqs.Publisher.Entry), so both send
// the same bytes; a call counts only when SQS lists every entry as Successful.
func (t *sqsTarget) Raw(ctx context.Context, route string, msgs []*outbox.Message) error {
	builder, err := outboxsqs.New(t.client, outboxsqs.Config{Route: route})
	if err != nil {
		return err
	}
	url, err := t.client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(route)})
	if err != nil {
		return err
	}
	return sendBatches(ctx, msgs, 10, outboxsqs.MaxInflightDefault, func(batch []*outbox.Message) error {
		entries := make([]types.SendMessageBatchRequestEntry, len(batch))
		for i, m := range batch {
			e, _, err := builder.Entry(m)
			if err != nil {
				return err
			}
			e.Id = aws.String(strconv.Itoa(i))
			entries[i] = e
		}
		out, err := t.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: url.QueueUrl, Entries: entries})
		if err == nil && len(out.Failed) > 0 {
			err = fmt.Errorf("%d entries failed, the first: %s: %s", len(out.Failed), aws.ToString(out.Failed[0].Code), aws.ToString(out.Failed[0].Message))
		}
		return err
	})
}

// sendBatches calls send with msgs in batches of size, from workers goroutines at once,
// and returns the first error (or ctx's), after which it sends no more.
func sendBatches(ctx context.Context, msgs []*outbox.Message, size, workers int, send func([]*outbox.Message) error) error {
	batches := make(chan []*outbox.Message)
	go func() {
		defer close(batches)
		for start := 0; start < len(msgs); start += size {
			select {
			case batches <- msgs[start:min(start+size, len(msgs))]:
			case <-ctx.Done():
				return
			}
		}
	}()
	var (
		wg       sync.WaitGroup
		once     sync.Once
		failed   atomic.Bool
		firstErr error
	)
	for range workers {
		wg.Go(func() {
			for batch := range batches {
				if failed.Load() {
					continue // drain, so that the feeder ends
				}
				if err := send(batch); err != nil {
					once.Do(func() { firstErr = err })
					failed.Store(true)
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

func (t *sqsTarget) Close() { t.admin.Close() }
