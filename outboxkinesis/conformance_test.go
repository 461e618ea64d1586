package outboxkinesis_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/nodechild"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testkinesis"
	"github.com/outboxkit/outbox/internal/testinfra/testproxy"
	"github.com/outboxkit/outbox/outboxkinesis"
	"github.com/outboxkit/outbox/outboxtest/conformance"
)

// TestConformance runs the publisher suite on kinesalite, streams of 4 shards: a key's
// records go to one shard, in sequence-number order.
func TestConformance(t *testing.T) {
	srv := testkinesis.Shared(t)
	direct := testkinesis.Client(srv.Endpoint())
	proxy := testproxy.New(t, srv.Addr())
	conformance.Run(t, conformance.Broker{
		Destination: func(t *testing.T) string { return testkinesis.Stream(t, direct, 4) },
		Publisher: func(t *testing.T, route string) outbox.Publisher {
			pub, err := outboxkinesis.Dial(testenv.Context(t), "kinesis://?endpoint=http://"+proxy.Addr(), outboxkinesis.Config{Route: route}, testkinesis.ConfigOptions()...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pub.Close)
			return pub
		},
		Read: func(t *testing.T, stream string, n int) []conformance.Received {
			return read(t, srv, direct, stream, n)
		},
		Reject: func(t *testing.T, dest string) *outbox.Message {
			// Over Config.MaxRecordBytes: refused before it is sent.
			return &outbox.Message{ID: outbox.NewID(), Topic: "big", Key: "big", ContentType: outbox.ContentTypeBinary,
				Payload: bytes.Repeat([]byte("x"), outboxkinesis.MaxRecordBytesDefault)}
		},
		Cut:     func(t *testing.T) { proxy.Cut() },
		Restore: func(t *testing.T) { proxy.Restore(t) },
		// The payload travels in a JSON envelope, base64 when it is not JSON.
		MaxPayload: (outboxkinesis.MaxRecordBytesDefault - 4096) * 3 / 4,
	})
}

// read reads every shard of stream from its start until it has n records, or until
// their number stops growing for testenv.Stall(); a key's records are in one shard, in
// order. It fails at once, with what the emulator said, if srv's process has exited.
func read(t *testing.T, srv *nodechild.Server, c *kinesis.Client, stream string, n int) []conformance.Received {
	t.Helper()
	var got []conformance.Received
	err := testenv.Progress(context.Background(), fmt.Sprintf("%d records in %s", n, stream), testenv.Stall(), func() (any, bool) {
		ctx, cancel := testenv.CallContext()
		defer cancel()
		got = got[:0]
		if srv.Exited() {
			t.Fatalf("kinesalite exited; its standard error:\n%s", srv.Stderr())
		}
		shards, err := c.ListShards(ctx, &kinesis.ListShardsInput{StreamName: aws.String(stream)})
		if err != nil {
			return err, false
		}
		ids := make([]string, 0, len(shards.Shards))
		for _, s := range shards.Shards {
			ids = append(ids, aws.ToString(s.ShardId))
		}
		slices.Sort(ids)
		for _, id := range ids {
			it, err := c.GetShardIterator(ctx, &kinesis.GetShardIteratorInput{StreamName: aws.String(stream), ShardId: aws.String(id),
				ShardIteratorType: types.ShardIteratorTypeTrimHorizon})
			if err != nil {
				return err, false
			}
			for iter := it.ShardIterator; iter != nil; {
				out, err := c.GetRecords(ctx, &kinesis.GetRecordsInput{ShardIterator: iter})
				if err != nil {
					return err, false
				}
				for _, r := range out.Records {
					payload, headers, err := outboxkinesis.Decode(r.Data)
					if err != nil {
						t.Fatalf("decode record %s: %v", aws.ToString(r.SequenceNumber), err)
					}
					got = append(got, conformance.Received{DedupID: headers[outbox.HeaderDedupKey], Key: headers[outbox.HeaderKey],
						ContentType: headers[outbox.HeaderContentType], Headers: headers, Payload: payload})
				}
				if len(out.Records) == 0 || aws.ToInt64(out.MillisBehindLatest) == 0 {
					break
				}
				iter = out.NextShardIterator
			}
		}
		return fmt.Sprintf("%d of %d records", len(got), n), len(got) >= n
	})
	if err != nil {
		t.Logf("read %s: %v", stream, err)
	}
	return got
}
