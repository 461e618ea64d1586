package outboxcli

import (
	"context"
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
	msgs := []outbox.Message{
		{ID: outbox.NewID(), Topic: "q", Key: "o-1", Payload: []byte(`{"n":1}`)},
		{ID: outbox.NewID(), Topic: "q", Key: "o-1", Payload: []byte{0xff, 0x00}},
		{ID: outbox.NewID(), Topic: "missing", Key: "m-1", Payload: []byte(`{"n":3}`)},
	}
	b.Write(t, msgs...)
	rctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	env := with(b.env, "OUTBOX_POLL_INTERVAL", "50ms")
	go func() {
		done <- run(rctx, []string{"relay", "--broker", "kinesis://?region=" + testkinesis.Region, "--kinesis-endpoint", srv.Endpoint(),
			"--route", route, "--log-format", "json"}, func(k string) string { return env[k] }, &stdout, &stderr)
	}()

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
	testenv.AwaitCond(t, "the warning about "+prefix+"missing", func() bool {
		return strings.Contains(stderr.String(), "until their stream exists") && strings.Contains(stderr.String(), prefix+"missing")
	})
	cancel()
	if code := testenv.AwaitRecv(t, "the relay to stop after its context ended", done); code != 0 {
		t.Fatalf("relay exited %d after a graceful stop\nstderr:\n%s", code, stderr.String())
	}
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
