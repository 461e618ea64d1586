package outboxcli

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testsqs"
	"github.com/outboxkit/outbox/outboxsqs"
)

// TestRelaySNS runs the relay against fauxqs's SNS: messages reach the FIFO topic the
// route names, and through a raw subscription its SQS queue, in the layout outboxsqs
// decodes, with the key as message group; a topic that does not exist is named in a
// warning at start-up. The AWS SDK takes its credentials from the process environment,
// so this test sets them and cannot run in parallel.
func TestRelaySNS(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	srv := testsqs.Shared(t)
	sq := testsqs.Client(srv.Endpoint())
	sn := sns.New(sns.Options{Region: testsqs.Region, Credentials: testsqs.Credentials, BaseEndpoint: aws.String(srv.Endpoint())})
	ctx := testenv.Context(t)
	prefix := testsqs.Unique() + "_"
	created, err := sn.CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String(prefix + "q.fifo"), Attributes: map[string]string{"FifoTopic": "true"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = sn.DeleteTopic(context.Background(), &sns.DeleteTopicInput{TopicArn: created.TopicArn}) })
	_, queue := testsqs.Queue(t, sq, true, nil)
	qa, err := sq.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(queue),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Subscribe(ctx, &sns.SubscribeInput{TopicArn: created.TopicArn, Protocol: aws.String("sqs"),
		Endpoint: aws.String(qa.Attributes[string(types.QueueAttributeNameQueueArn)]), Attributes: map[string]string{"RawMessageDelivery": "true"}}); err != nil {
		t.Fatal(err)
	}

	b := migrated(t)
	msgs := brokerMessages()
	b.Write(t, msgs...)
	log, stop := backgroundRelay(t, with(b.env, "OUTBOX_POLL_INTERVAL", "50ms"),
		"relay", "--broker", "sns://?region="+testsqs.Region, "--sns-endpoint", srv.Endpoint(), "--route", prefix+"{topic}.fifo", "--log-format", "json")

	var got []types.Message
	testenv.Await(t, "2 messages through "+prefix+"q.fifo", func() (any, bool) {
		out, err := sq.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(queue), MaxNumberOfMessages: 10,
			VisibilityTimeout: 60, MessageAttributeNames: []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll}})
		if err == nil {
			got = append(got, out.Messages...)
			for _, m := range out.Messages {
				_, _ = sq.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(queue), ReceiptHandle: m.ReceiptHandle})
			}
		}
		return fmt.Sprintf("%d messages (%v)", len(got), err), len(got) >= 2
	})
	for i, m := range msgs[:2] {
		payload, headers, err := outboxsqs.Decode(got[i])
		if err != nil || string(payload) != string(m.Payload) || headers[outbox.HeaderID] != m.ID.String() {
			t.Errorf("message %d: %q %v %v, want payload %q and id %s", i, payload, headers, err, m.Payload, m.ID)
		}
	}
	if g := got[0].Attributes["MessageGroupId"]; g != "o-1" {
		t.Errorf("message group %q, want the key o-1", g)
	}
	awaitMissingWarning(t, log, "topic", prefix+"missing.fifo")
	stopClean(t, log, stop)
}

func TestRelaySNSRejectsBadSettingsBeforeConnecting(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OUTBOX_DATABASE_URL": unreachableDB, "OUTBOX_BROKER": "sns://?region=eu-west-1"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--route", "events.{topic}"}, "--route: \"events.{topic}\" does not form valid topic names"},
		{[]string{"--route", "arn:aws:sns:eu-west-1:{topic}:x"}, "placeholders may fill only the topic name"},
		{[]string{"--sns-max-message-bytes", "999999"}, "--sns-max-message-bytes"},
		{[]string{"--sns-max-inflight", "-1"}, "--sns-max-inflight: must not be negative"},
		{[]string{"--sns-endpoint", "127.0.0.1:4566"}, "--sns-endpoint"},
		{[]string{"--broker", "sns://?endpoint=http://a:1", "--sns-endpoint", "http://b:2"}, "give one"},
	} {
		r := cli(t, env, append([]string{"relay"}, tc.args...)...)
		if r.code != 2 || !strings.Contains(errorLine(r.stderr), tc.want) {
			t.Errorf("relay %v: want exit 2 and %q, got %s", tc.args, tc.want, r)
		}
	}
}
