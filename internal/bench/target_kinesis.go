package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/brokers"
	"github.com/outboxkit/outbox/outboxkinesis"
)

func init() { RegisterTarget(brokers.Kinesis, openKinesis) }

// kinesisShards is the shard count of the streams a run creates.
const kinesisShards = 4

// kinesisTarget sends to streams of its own. The URL is outboxkinesis.Dial's
// ("kinesis://?region=...&endpoint=..."); credentials come from the AWS SDK's chain.
type kinesisTarget struct {
	url   string
	admin *outboxkinesis.Publisher // its client creates, deletes and fills streams
}

func openKinesis(ctx context.Context, url string) (Target, error) {
	admin, err := outboxkinesis.Dial(ctx, url, outboxkinesis.Config{})
	if err != nil {
		return nil, fmt.Errorf("connect to Kinesis: %w", err)
	}
	return &kinesisTarget{url: url, admin: admin}, nil
}

func (t *kinesisTarget) Prepare(ctx context.Context, name string) (string, func(), error) {
	c := t.admin.Client()
	if _, err := c.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: aws.String(name), ShardCount: aws.Int32(kinesisShards)}); err != nil {
		return "", nil, fmt.Errorf("create stream %s: %w", name, err)
	}
	w := kinesis.NewStreamExistsWaiter(c)
	if err := w.Wait(ctx, &kinesis.DescribeStreamInput{StreamName: aws.String(name)}, 5*time.Minute); err != nil {
		return "", nil, fmt.Errorf("stream %s to become active: %w", name, err)
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = c.DeleteStream(ctx, &kinesis.DeleteStreamInput{StreamName: aws.String(name), EnforceConsumerDeletion: aws.Bool(true)})
	}
	return name, drop, nil
}

func (t *kinesisTarget) Broker() (string, brokers.Settings) { return t.url, brokers.Settings{} }

// Raw sends PutRecords calls of 500 records with the same client the publisher uses,
// outboxkinesis.MaxInflightDefault of them at once (the publisher's default), with
// records built by the publisher's own code (outboxkinesis.Publisher.Record).
func (t *kinesisTarget) Raw(ctx context.Context, route string, msgs []*outbox.Message) error {
	builder, err := outboxkinesis.New(t.admin.Client(), outboxkinesis.Config{Route: route})
	if err != nil {
		return err
	}
	return sendBatches(ctx, msgs, 500, outboxkinesis.MaxInflightDefault, func(batch []*outbox.Message) error {
		records := make([]types.PutRecordsRequestEntry, len(batch))
		for i, m := range batch {
			r, _, err := builder.Record(m)
			if err != nil {
				return err
			}
			records[i] = r
		}
		out, err := t.admin.Client().PutRecords(ctx, &kinesis.PutRecordsInput{StreamName: aws.String(route), Records: records})
		if err == nil && aws.ToInt32(out.FailedRecordCount) > 0 {
			err = fmt.Errorf("%d records failed", aws.ToInt32(out.FailedRecordCount))
		}
		return err
	})
}

func (t *kinesisTarget) Close() { t.admin.Close() }
