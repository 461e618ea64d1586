package outboxsns_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testproxy"
	"github.com/outboxkit/outbox/internal/testinfra/testsqs"
	"github.com/outboxkit/outbox/outboxsns"
	"github.com/outboxkit/outbox/outboxsqs"
	"github.com/outboxkit/outbox/outboxtest/conformance"
)

// snsClient returns an SNS client of fauxqs at endpoint.
func snsClient(endpoint string) *sns.Client {
	return sns.New(sns.Options{Region: testsqs.Region, Credentials: testsqs.Credentials, BaseEndpoint: aws.String(endpoint)})
}

// topic creates a topic (FIFO when fifo is set) with a queue of the same kind subscribed
// to it for raw delivery, and returns the topic's name and the queue's URL.
func topic(t *testing.T, sn *sns.Client, sq *sqs.Client, fifo bool) (name, queueURL string) {
	t.Helper()
	ctx := testenv.Context(t)
	name = testsqs.Unique()
	attrs := map[string]string{}
	if fifo {
		name += ".fifo"
		attrs["FifoTopic"] = "true"
	}
	out, err := sn.CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String(name), Attributes: attrs})
	if err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	arn := aws.ToString(out.TopicArn)
	t.Cleanup(func() { _, _ = sn.DeleteTopic(context.Background(), &sns.DeleteTopicInput{TopicArn: aws.String(arn)}) })
	_, queueURL = testsqs.Queue(t, sq, fifo, nil)
	qa, err := sq.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(queueURL),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Subscribe(ctx, &sns.SubscribeInput{TopicArn: aws.String(arn), Protocol: aws.String("sqs"),
		Endpoint: aws.String(qa.Attributes[string(types.QueueAttributeNameQueueArn)]), Attributes: map[string]string{"RawMessageDelivery": "true"}}); err != nil {
		t.Fatalf("subscribe the queue to %s: %v", name, err)
	}
	return name, queueURL
}

// TestConformance runs the suite on a FIFO topic, where SNS keeps per-key order (the key
// is the message group), and on a standard topic, which promises no order: there
// PerKeyOrder passes only because fauxqs delivers in publish order. Each topic has an
// SQS queue subscribed for raw delivery, read with outboxsqs.Decode.
func TestConformance(t *testing.T) {
	for _, fifo := range []bool{true, false} {
		name := map[bool]string{true: "fifo", false: "standard"}[fifo]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := testsqs.Shared(t)
			sn, sq := snsClient(srv.Endpoint()), testsqs.Client(srv.Endpoint())
			proxy := testproxy.New(t, srv.Addr())
			queues := map[string]string{}
			conformance.Run(t, conformance.Broker{
				Destination: func(t *testing.T) string {
					name, url := topic(t, sn, sq, fifo)
					queues[name] = url
					return name
				},
				Publisher: func(t *testing.T, route string) outbox.Publisher {
					pub, err := outboxsns.Dial(testenv.Context(t), "sns://?endpoint=http://"+proxy.Addr(), outboxsns.Config{Route: route}, testsqs.ConfigOptions()...)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(pub.Close)
					return pub
				},
				Read: func(t *testing.T, dest string, n int) []conformance.Received {
					return read(t, sq, queues[dest], fifo, n)
				},
				Reject: func(t *testing.T, dest string) *outbox.Message {
					// Over Config.MaxMessageBytes: refused before it is sent.
					return &outbox.Message{ID: outbox.NewID(), Topic: "big", Key: "big",
						Payload: bytes.Repeat([]byte("x"), outboxsns.MaxMessageBytesDefault+1)}
				},
				Cut:        func(t *testing.T) { proxy.Cut() },
				Restore:    func(t *testing.T) { proxy.Restore(t) },
				MaxPayload: outboxsns.MaxMessageBytesDefault - 2048,
			})
		})
	}
}

// read receives from the queue at url, deleting what it received, until it has n
// messages, or until none has come for testenv.Stall().
func read(t *testing.T, c *sqs.Client, url string, fifo bool, n int) []conformance.Received {
	t.Helper()
	var got []conformance.Received
	err := testenv.Progress(context.Background(), fmt.Sprintf("%d messages in %s", n, url), testenv.Stall(), func() (any, bool) {
		for {
			ctx, cancel := testenv.CallContext()
			out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
				VisibilityTimeout: 30, MessageAttributeNames: []string{"All"},
				MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll}})
			cancel()
			if err != nil || len(out.Messages) == 0 {
				break
			}
			for _, m := range out.Messages {
				payload, headers, err := outboxsqs.Decode(m)
				if err != nil {
					t.Fatalf("decode: %v", err)
				}
				dedup := headers[outbox.HeaderDedupKey]
				if fifo {
					dedup = m.Attributes[string(types.MessageSystemAttributeNameMessageDeduplicationId)]
				}
				got = append(got, conformance.Received{DedupID: dedup, Key: headers[outbox.HeaderKey],
					ContentType: headers[outbox.HeaderContentType], Headers: headers, Payload: payload})
				_, _ = c.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle})
			}
		}
		return fmt.Sprintf("%d of %d messages", len(got), n), len(got) >= n
	})
	if err != nil {
		t.Logf("read %s: %v", url, err)
	}
	return got
}
