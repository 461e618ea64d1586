package outboxsqs_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testproxy"
	"github.com/outboxkit/outbox/internal/testinfra/testsqs"
	"github.com/outboxkit/outbox/outboxsqs"
	"github.com/outboxkit/outbox/outboxtest/conformance"
)

// TestConformance runs the suite on a FIFO queue, where SQS keeps per-key order (the key
// is the message group), and on a standard queue, where SQS promises no order at all:
// there PerKeyOrder passes only because fauxqs happens to deliver in send order, which
// AWS does not.
func TestConformance(t *testing.T) {
	for _, fifo := range []bool{true, false} {
		name := "standard"
		if fifo {
			name = "fifo"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := testsqs.Shared(t)
			direct := testsqs.Client(srv.Endpoint())
			proxy := testproxy.New(t, srv.Addr())
			r := newReader(direct)
			conformance.Run(t, conformance.Broker{
				Destination: func(t *testing.T) string {
					name, url := testsqs.Queue(t, direct, fifo, nil)
					r.add(name, url, fifo)
					return name
				},
				Publisher: func(t *testing.T, route string) outbox.Publisher {
					pub, err := outboxsqs.Dial(testenv.Context(t), "sqs://?endpoint=http://"+proxy.Addr(), outboxsqs.Config{Route: route}, testsqs.ConfigOptions()...)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(pub.Close)
					return pub
				},
				Read: r.read,
				Reject: func(t *testing.T, dest string) *outbox.Message {
					// Over Config.MaxMessageBytes: refused before it is sent.
					return &outbox.Message{ID: outbox.NewID(), Topic: "big", Key: "big",
						Payload: bytes.Repeat([]byte("x"), outboxsqs.MaxMessageBytesDefault+1)}
				},
				Cut:     func(t *testing.T) { proxy.Cut() },
				Restore: func(t *testing.T) { proxy.Restore(t) },
				// Config.MaxMessageBytes counts the attributes too.
				MaxPayload: outboxsqs.MaxMessageBytesDefault - 2048,
			})
		})
	}
}

// reader reads queues with the SQS client, deleting what it received, and keeps what it
// read per queue, so that a second Read of a queue returns everything read so far.
type reader struct {
	c      *sqs.Client
	mu     sync.Mutex
	queues map[string]*readQueue // by name
}

type readQueue struct {
	url  string
	fifo bool
	got  []conformance.Received
}

func newReader(c *sqs.Client) *reader { return &reader{c: c, queues: map[string]*readQueue{}} }

func (r *reader) add(name, url string, fifo bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queues[name] = &readQueue{url: url, fifo: fifo}
}

// read receives from queue name until it has read n messages and the queue is empty.
// It stops early only when no message has come for testenv.Stall(), and then returns
// what it has, for the suite to say what is missing.
func (r *reader) read(t *testing.T, name string, n int) []conformance.Received {
	t.Helper()
	r.mu.Lock()
	q := r.queues[name]
	r.mu.Unlock()
	if q == nil {
		t.Fatalf("read: unknown queue %q", name)
	}
	err := testenv.Progress(context.Background(), fmt.Sprintf("%d messages in queue %s", n, name), testenv.Stall(), func() (any, bool) {
		for { // until a receive finds the queue empty
			ctx, cancel := testenv.CallContext() // per receive
			msgs := receive(t, ctx, r.c, q.url)
			cancel()
			if len(msgs) == 0 {
				break
			}
			for _, m := range msgs {
				q.got = append(q.got, received(t, m, q.fifo))
			}
		}
		return fmt.Sprintf("%d of %d messages", len(q.got), n), len(q.got) >= n
	})
	if err != nil {
		t.Logf("read %s: %v", name, err)
	}
	return q.got
}

// receive receives up to 10 messages with every attribute, waiting up to a second, and
// deletes them. They stay invisible for 30 s: long enough that a loaded machine deletes
// them before they come back (a duplicate the test would blame on the publisher), short
// enough that, should a response be lost and the SDK retry, the messages it held (and,
// on a FIFO queue, their group) come back well within testenv.Stall().
func receive(t *testing.T, ctx context.Context, c *sqs.Client, url string) []types.Message {
	t.Helper()
	out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
		QueueUrl:                    aws.String(url),
		MaxNumberOfMessages:         10,
		WaitTimeSeconds:             1,
		VisibilityTimeout:           30,
		MessageAttributeNames:       []string{"All"},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		t.Fatalf("receive from %s: %v", url, err)
	}
	if len(out.Messages) == 0 {
		return nil
	}
	var del []types.DeleteMessageBatchRequestEntry
	for i, m := range out.Messages {
		del = append(del, types.DeleteMessageBatchRequestEntry{Id: aws.String(string(rune('a' + i))), ReceiptHandle: m.ReceiptHandle})
	}
	if _, err := c.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(url), Entries: del}); err != nil && ctx.Err() == nil {
		t.Fatalf("delete from %s: %v", url, err)
	}
	return out.Messages
}

// received decodes a message as a consumer would: outboxsqs.Decode.
func received(t *testing.T, m types.Message, fifo bool) conformance.Received {
	t.Helper()
	payload, headers, err := outboxsqs.Decode(m)
	if err != nil {
		t.Fatalf("decode message %s: %v", aws.ToString(m.MessageId), err)
	}
	dedup := headers[outbox.HeaderDedupKey]
	if fifo {
		dedup = m.Attributes[string(types.MessageSystemAttributeNameMessageDeduplicationId)]
	}
	return conformance.Received{
		DedupID:     dedup,
		Key:         headers[outbox.HeaderKey],
		ContentType: headers[outbox.HeaderContentType],
		Headers:     headers,
		Payload:     payload,
	}
}
