package outboxsqs_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testsqs"
	"github.com/outboxkit/outbox/outboxsqs"
)

func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Here an SQS emulator (fauxqs) and fixed credentials; in production
	// "sqs://?region=eu-west-1" and the SDK's default credential chain.
	srv, err := testsqs.SharedServer()
	if err != nil {
		log.Fatal(err)
	}
	sqsURL := "sqs://?region=us-east-1&endpoint=" + srv.Endpoint()

	// Once, before the relay runs: the publisher does not create queues.
	admin := testsqs.Client(srv.Endpoint())
	created, err := admin.CreateQueue(ctx, &sqs.CreateQueueInput{
		QueueName:  aws.String("outboxsqs-example-orders.fifo"),
		Attributes: map[string]string{"FifoQueue": "true"},
	})
	if err != nil {
		log.Fatal(err)
	}

	pub, err := outboxsqs.Dial(ctx, sqsURL, outboxsqs.Config{Route: "outboxsqs-example-{topic}.fifo"}, testsqs.ConfigOptions()...)
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	// The relay does this (outbox.NewRelay(store, pub, ...)); here by hand.
	msg := &outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "order-42",
		Payload: []byte(`{"id":42}`), ContentType: outbox.ContentTypeJSON}
	errs := pub.Publish(ctx, []*outbox.Message{msg})
	fmt.Println("confirmed:", errs == nil)

	// A consumer receives every attribute and decodes the message.
	out, err := admin.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
		QueueUrl:              created.QueueUrl,
		MessageAttributeNames: []string{"All"},
		WaitTimeSeconds:       1,
	})
	if err != nil || len(out.Messages) != 1 {
		log.Fatal(out, err)
	}
	payload, headers, err := outboxsqs.Decode(out.Messages[0])
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(payload), headers[outbox.HeaderKey], headers[outbox.HeaderContentType])
	_, _ = admin.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: created.QueueUrl})
	// Output:
	// confirmed: true
	// {"id":42} order-42 application/json
}
