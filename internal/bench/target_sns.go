package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/brokers"
	"github.com/outboxkit/outbox/outboxsns"
)

func init() { RegisterTarget(brokers.SNS, openSNS) }

// snsTarget sends to FIFO topics of its own (per-key order on SNS needs FIFO), with no
// subscription. The URL is outboxsns.Dial's ("sns://?region=...&endpoint=...");
// credentials come from the AWS SDK's chain.
type snsTarget struct {
	url   string
	admin *outboxsns.Publisher // its client creates, deletes and publishes to topics

	mu   sync.Mutex
	arns map[string]string // the ARNs of the topics Prepare made, by name
}

func openSNS(ctx context.Context, url string) (Target, error) {
	admin, err := outboxsns.Dial(ctx, url, outboxsns.Config{})
	if err != nil {
		return nil, fmt.Errorf("connect to SNS: %w", err)
	}
	return &snsTarget{url: url, admin: admin, arns: map[string]string{}}, nil
}

func (t *snsTarget) Prepare(ctx context.Context, name string) (string, func(), error) {
	topic := name + ".fifo"
	out, err := t.admin.Client().CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String(topic),
		Attributes: map[string]string{"FifoTopic": "true"}})
	if err != nil {
		return "", nil, fmt.Errorf("create topic %s: %w", topic, err)
	}
	t.mu.Lock()
	t.arns[topic] = aws.ToString(out.TopicArn)
	t.mu.Unlock()
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = t.admin.Client().DeleteTopic(ctx, &sns.DeleteTopicInput{TopicArn: out.TopicArn})
	}
	return topic, drop, nil
}

func (t *snsTarget) Broker() (string, brokers.Settings) { return t.url, brokers.Settings{} }

// Raw sends PublishBatch calls of 10 messages with the same client the publisher uses,
// outboxsns.MaxInflightDefault of them at once (the publisher's default), with entries
// built by the publisher's own code (outboxsns.Publisher.Entry).
func (t *snsTarget) Raw(ctx context.Context, route string, msgs []*outbox.Message) error {
	builder, err := outboxsns.New(t.admin.Client(), outboxsns.Config{Route: route})
	if err != nil {
		return err
	}
	t.mu.Lock()
	arn := t.arns[route]
	t.mu.Unlock()
	return sendBatches(ctx, msgs, 10, outboxsns.MaxInflightDefault, func(batch []*outbox.Message) error {
		entries := make([]types.PublishBatchRequestEntry, len(batch))
		for i, m := range batch {
			e, _, err := builder.Entry(m)
			if err != nil {
				return err
			}
			e.Id = aws.String(strconv.Itoa(i))
			entries[i] = e
		}
		out, err := t.admin.Client().PublishBatch(ctx, &sns.PublishBatchInput{TopicArn: aws.String(arn), PublishBatchRequestEntries: entries})
		if err == nil && len(out.Failed) > 0 {
			err = fmt.Errorf("%d entries failed, the first: %s: %s", len(out.Failed), aws.ToString(out.Failed[0].Code), aws.ToString(out.Failed[0].Message))
		}
		return err
	})
}

func (t *snsTarget) Close() { t.admin.Close() }
