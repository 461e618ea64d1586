package outboxcli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testsqs"
	"github.com/outboxkit/outbox/outboxsqs"
)

// TestRelaySQS runs the relay against fauxqs (an SQS emulator; see internal/testinfra/testsqs):
// messages land in the FIFO queue the route names, in the layout of outboxsqs, and a
// topic whose queue does not exist is named in a warning at start-up. The AWS SDK takes
// its credentials from the process environment, so this test sets them and cannot run
// in parallel.
func TestRelaySQS(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	srv := testsqs.Shared(t)
	client := testsqs.Client(srv.Endpoint())
	// The route is <prefix>{topic}.fifo: topic "q" goes to the queue made here, topic
	// "missing" to a queue that does not exist.
	prefix := testsqs.Unique() + "_"
	route := prefix + "{topic}.fifo"
	created, err := client.CreateQueue(context.Background(), &sqs.CreateQueueInput{
		QueueName: aws.String(prefix + "q.fifo"), Attributes: map[string]string{"FifoQueue": "true"},
	})
	if err != nil {
		t.Fatal(err)
	}
	url := aws.ToString(created.QueueUrl)
	t.Cleanup(func() {
		_, _ = client.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: created.QueueUrl})
	})

	b := migrated(t)
	msgs := brokerMessages()
	b.Write(t, msgs...)

	log, stop := backgroundRelay(t, with(b.env, "OUTBOX_POLL_INTERVAL", "50ms"),
		"relay", "--broker", "sqs://?region="+testsqs.Region, "--sqs-endpoint", srv.Endpoint(), "--route", route, "--log-format", "json")

	var got []types.Message
	testenv.Await(t, "2 messages in "+prefix+"q.fifo", func() (any, bool) {
		out, err := client.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(url), MaxNumberOfMessages: 10, VisibilityTimeout: 60,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		})
		if err == nil {
			got = append(got, out.Messages...)
			for _, m := range out.Messages {
				_, _ = client.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle})
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
	if d := got[0].Attributes["MessageDeduplicationId"]; d != "order-1-placed" {
		t.Errorf("dedup id %q", d)
	}
	awaitMissingWarning(t, log, "queue", prefix+"missing.fifo")

	stopClean(t, log, stop)
}

func TestRelaySQSRejectsBadSettingsBeforeConnecting(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OUTBOX_DATABASE_URL": unreachableDB, "OUTBOX_BROKER": "sqs://?region=eu-west-1"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--route", "events.{topic}"}, "--route: \"events.{topic}\" does not form valid queue names"},
		{[]string{"--sqs-max-message-bytes", "10"}, "--sqs-max-message-bytes"},
		{[]string{"--sqs-max-inflight", "-1"}, "--sqs-max-inflight: must not be negative"},
		{[]string{"--sqs-endpoint", "127.0.0.1:4566"}, "--sqs-endpoint"},
		{[]string{"--broker", "sqs://?endpoint=http://a:1", "--sqs-endpoint", "http://b:2"}, "give one"},
	} {
		r := cli(t, env, append([]string{"relay"}, tc.args...)...)
		if r.code != 2 || !strings.Contains(errorLine(r.stderr), tc.want) {
			t.Errorf("relay %v: want exit 2 and %q, got %s", tc.args, tc.want, r)
		}
	}
}

// TestRelaySQSLogsThroughTheScrubber: the AWS SDK's own warnings (here: an SQS endpoint
// whose Date header does not parse, quoted in the warning) reach the relay's log as
// records, scrubbed, instead of the process's stderr past the scrubber. The SDK reads
// its credentials from the process environment, so this test cannot run in parallel.
func TestRelaySQSLogsThroughTheScrubber(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	const password = "pw7"
	dsn := withPassword(t, password)
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Date", "not a date, see "+dsn) // quoted by the SDK's warning
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		fmt.Fprintf(w, `{"QueueUrl":%q}`, srv.URL+"/000000000000/q")
	}))
	t.Cleanup(srv.Close)

	b := migrated(t)
	env := with(b.env, "OUTBOX_DATABASE_URL", dsn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"relay", "--broker", "sqs://?region=eu-west-1", "--sqs-endpoint", srv.URL, "--route", "q",
			"--log-format", "json"}, func(k string) string { return env[k] }, &stdout, &stderr)
	}()
	var line string
	testenv.AwaitCond(t, "the SDK's warning in the relay's log", func() bool {
		for l := range strings.SplitSeq(stderr.String(), "\n") {
			if strings.Contains(l, `"component":"aws-sdk"`) && strings.Contains(l, "Date header") {
				line = l
				return true
			}
		}
		return false
	})
	cancel()
	testenv.AwaitRecv(t, "the relay to stop", done)
	if !strings.Contains(line, `"level":"WARN"`) || !strings.Contains(line, ":REDACTED@") || strings.Contains(line, ":"+password+"@") {
		t.Errorf("the SDK's warning: %s", line)
	}
}
