package outboxcli

import (
	"fmt"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testkinesis"
	"github.com/outboxkit/outbox/outboxkinesis"
)

// TestRelayKinesis runs the relay against kinesalite: messages reach the stream the
// route names with the key as partition key, in the envelope outboxkinesis decodes, and a
// topic whose stream does not exist is named in a warning at start-up. The AWS SDK takes
// its credentials from the process environment, so this test sets them and cannot run
// in parallel.
func TestRelayKinesis(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	srv := testkinesis.Shared(t)
	c := testkinesis.Client(srv.Endpoint())
	// The route sends topic "q" to the stream made here, "missing" to none.
	prefix := testkinesis.Unique() + "_"
	route := prefix + "{topic}"
	testkinesis.NamedStream(t, c, prefix+"q", 1)

	b := migrated(t)
	msgs := brokerMessages()
	b.Write(t, msgs...)
	log, stop := backgroundRelay(t, with(b.env, "OUTBOX_POLL_INTERVAL", "50ms"),
		"relay", "--broker", "kinesis://?region="+testkinesis.Region, "--kinesis-endpoint", srv.Endpoint(), "--route", route, "--log-format", "json")

	var got []types.Record
	testenv.Await(t, "2 records in "+prefix+"q", func() (any, bool) {
		ctx, cancel := testenv.CallContext()
		defer cancel()
		it, err := c.GetShardIterator(ctx, &kinesis.GetShardIteratorInput{StreamName: aws.String(prefix + "q"),
			ShardId: aws.String("shardId-000000000000"), ShardIteratorType: types.ShardIteratorTypeTrimHorizon})
		if err != nil {
			return err, false
		}
		out, err := c.GetRecords(ctx, &kinesis.GetRecordsInput{ShardIterator: it.ShardIterator})
		if err != nil {
			return err, false
		}
		got = out.Records
		return fmt.Sprintf("%d records", len(got)), len(got) >= 2
	})
	for i, m := range msgs[:2] {
		payload, headers, err := outboxkinesis.Decode(got[i].Data)
		if err != nil || string(payload) != string(m.Payload) || headers[outbox.HeaderID] != m.ID.String() || aws.ToString(got[i].PartitionKey) != "o-1" {
			t.Errorf("record %d: %q %v %v key %q, want payload %q, id %s, partition key o-1", i, payload, headers, err, aws.ToString(got[i].PartitionKey), m.Payload, m.ID)
		}
	}
	awaitMissingWarning(t, log, "stream", prefix+"missing")
	stopClean(t, log, stop)
}

func TestRelayKinesisRejectsBadSettingsBeforeConnecting(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OUTBOX_DATABASE_URL": unreachableDB, "OUTBOX_BROKER": "kinesis://?region=eu-west-1"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--route", "events/{topic}"}, "--route: \"events/{topic}\" does not form valid stream names"},
		{[]string{"--kinesis-max-record-bytes", "9999999"}, "--kinesis-max-record-bytes"},
		{[]string{"--kinesis-max-inflight", "-1"}, "--kinesis-max-inflight: must not be negative"},
		{[]string{"--kinesis-endpoint", "127.0.0.1:4567"}, "--kinesis-endpoint"},
		{[]string{"--broker", "kinesis://?endpoint=http://a:1", "--kinesis-endpoint", "http://b:2"}, "give one"},
	} {
		r := cli(t, env, append([]string{"relay"}, tc.args...)...)
		if r.code != 2 || !strings.Contains(errorLine(r.stderr), tc.want) {
			t.Errorf("relay %v: want exit 2 and %q, got %s", tc.args, tc.want, r)
		}
	}
}
