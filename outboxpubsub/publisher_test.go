package outboxpubsub_test

import (
	"context"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxpubsub"
)

// TestPausedKeyResumed: a publish on a key that the server refuses pauses the key in the
// client; Publish resumes it once the key has nothing in flight, so the relay's next
// attempt of the key goes out instead of failing as paused.
func TestPausedKeyResumed(t *testing.T) {
	srv, admin := fake(t)
	topic := newTopic(t, admin)
	pub, err := outboxpubsub.Dial(testenv.Context(t), "pubsub://"+project+"?endpoint="+srv.Addr, outboxpubsub.Config{Route: topic})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	srv.SetAutoPublishResponse(false)
	srv.AddPublishResponse(nil, status.Error(codes.InvalidArgument, "test: refused"))
	srv.AddPublishResponse(&pubsubpb.PublishResponse{MessageIds: []string{"m-1"}}, nil)

	m := &outbox.Message{ID: outbox.NewID(), Topic: "t", Key: "k", Payload: []byte(`{}`), ContentType: outbox.ContentTypeJSON}
	ctx := context.Background()
	errs := pub.Publish(ctx, []*outbox.Message{m})
	if errs == nil || outbox.IsOutage(errs[0]) {
		t.Fatalf("first publish: %v, want a rejection", errs)
	}
	if errs := pub.Publish(ctx, []*outbox.Message{m}); errs != nil {
		t.Fatalf("second publish of the key: %v; want it published (the key resumed)", errs[0])
	}
}
