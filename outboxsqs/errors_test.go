package outboxsqs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	smithy "github.com/aws/smithy-go"

	"github.com/outboxkit/outbox"
)

// TestClassify pins the error table of the package documentation for errors that fauxqs
// cannot produce.
func TestClassify(t *testing.T) {
	t.Parallel()
	api := func(code string) error {
		return fmt.Errorf("operation error SQS: SendMessageBatch: %w", &smithy.GenericAPIError{Code: code, Message: "x"})
	}
	override := func(code string) *string { return &code }
	for _, tc := range []struct {
		name    string
		err     error
		outage  bool
		noQueue bool
	}{
		{"canceled", context.Canceled, true, false},
		{"deadline", context.DeadlineExceeded, true, false},
		{"network", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, true, false},
		{"unknown", errors.New("something new"), true, false},
		{"unknown code", api("SomethingNew"), true, false},
		{"queue missing", &types.QueueDoesNotExist{Message: aws.String("x")}, true, true},
		{"queue missing, query code", &types.QueueDoesNotExist{ErrorCodeOverride: override("AWS.SimpleQueueService.NonExistentQueue")}, true, true},
		{"queue missing, generic", api("AWS.SimpleQueueService.NonExistentQueue"), true, true},
		{"throttled", &types.RequestThrottled{}, true, false},
		{"throttling exception", api("ThrottlingException"), true, false},
		{"over limit", &types.OverLimit{}, true, false},
		{"kms throttled", &types.KmsThrottled{}, true, false},
		{"kms disabled", &types.KmsDisabled{}, true, false},
		{"kms disabled, query code", &types.KmsDisabled{ErrorCodeOverride: override("KMS.DisabledException")}, true, false},
		{"kms access denied", &types.KmsAccessDenied{}, true, false},
		{"access denied", api("AccessDenied"), true, false},
		{"bad token", api("InvalidClientTokenId"), true, false},
		{"expired token", api("ExpiredToken"), true, false},
		{"invalid security", &types.InvalidSecurity{}, true, false},
		{"internal", api("InternalError"), true, false},
		{"unavailable", api("ServiceUnavailable"), true, false},
		{"too many entries (our bug)", &types.TooManyEntriesInBatchRequest{}, true, false},
		{"ids not distinct (our bug)", &types.BatchEntryIdsNotDistinct{}, true, false},
		{"invalid contents", &types.InvalidMessageContents{}, false, false},
		{"invalid parameter", api("InvalidParameterValue"), false, false},
		{"invalid parameter, query code", api("AWS.SimpleQueueService.InvalidParameterValue"), false, false},
		{"missing parameter", api("MissingParameter"), false, false},
		{"attribute name", &types.InvalidAttributeName{}, false, false},
		{"attribute value", &types.InvalidAttributeValue{}, false, false},
		{"batch too long", &types.BatchRequestTooLong{}, false, false},
	} {
		got := classify(tc.err, "q")
		if outbox.IsUnavailable(got) != tc.outage {
			t.Errorf("%s: IsUnavailable(%v) = %v, want %v", tc.name, got, !tc.outage, tc.outage)
		}
		if !errors.Is(got, tc.err) {
			t.Errorf("%s: %v does not wrap %v", tc.name, got, tc.err)
		}
		if errors.Is(got, ErrNoQueue) != tc.noQueue {
			t.Errorf("%s: errors.Is(%v, ErrNoQueue) = %v, want %v", tc.name, got, !tc.noQueue, tc.noQueue)
		}
	}
}

func TestEntryError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code   string
		sender bool
		outage bool
	}{
		{"InvalidMessageContents", true, false},
		{"InvalidParameterValue", true, false},
		{"SomethingNew", true, false}, // SQS blames the message
		{"InternalError", false, true},
		{"SomethingNew", false, true},
		{"RequestThrottled", true, true}, // backpressure whoever SQS blames
		{"KMS.ThrottlingException", true, true},
		{"KmsAccessDenied", true, true},
		{"AccessDenied", true, true},
	} {
		err := entryError("q", types.BatchResultErrorEntry{Id: aws.String("0"), Code: aws.String(tc.code), Message: aws.String("m"), SenderFault: tc.sender})
		if outbox.IsUnavailable(err) != tc.outage {
			t.Errorf("%s (sender fault %v): IsOutage(%v) = %v, want %v", tc.code, tc.sender, err, !tc.outage, tc.outage)
		}
		var ee *EntryError
		if !errors.As(err, &ee) || ee.Code != tc.code || ee.SenderFault != tc.sender {
			t.Errorf("%s: %v is not the *EntryError", tc.code, err)
		}
	}
}

func TestNoQueueErrorSaysWhatToDo(t *testing.T) {
	t.Parallel()
	for queue, want := range map[string]string{
		"orders":      `queue "orders" does not exist: create it (for example: aws sqs create-queue --queue-name orders) or fix the publisher's Route`,
		"orders.fifo": `aws sqs create-queue --queue-name orders.fifo --attributes FifoQueue=true`,
		"https://sqs.eu-west-1.amazonaws.com/123456789012/o.fifo": `--queue-name o.fifo --attributes FifoQueue=true`,
	} {
		msg := (&NoQueueError{Queue: queue}).Error()
		if !strings.Contains(msg, want) {
			t.Errorf("NoQueueError{%q} = %q, want it to contain %q", queue, msg, want)
		}
	}
}
