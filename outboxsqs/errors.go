package outboxsqs

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	smithy "github.com/aws/smithy-go"

	"github.com/outboxkit/outbox"
)

// ErrNoQueue is matched (errors.Is) by every *NoQueueError.
var ErrNoQueue = errors.New("outboxsqs: queue does not exist")

// NoQueueError reports a destination queue that does not exist (or that the credentials
// may not see: SQS answers the same). Publish returns it wrapped as an outage, since it is
// a configuration problem that would otherwise dead-letter every message routed there.
type NoQueueError struct {
	Queue string // the queue name or URL the route gave
	Err   error  // the SQS error (*types.QueueDoesNotExist)
}

func (e *NoQueueError) Error() string {
	name := queueName(e.Queue)
	create := fmt.Sprintf("aws sqs create-queue --queue-name %s", name)
	if isFIFO(name) {
		create += " --attributes FifoQueue=true"
	}
	return fmt.Sprintf("outboxsqs: queue %q does not exist: create it (for example: %s) or fix the publisher's Route", e.Queue, create)
}

// Is makes errors.Is(err, ErrNoQueue) true.
func (e *NoQueueError) Is(target error) bool { return target == ErrNoQueue }

func (e *NoQueueError) Unwrap() error { return e.Err }

// EntryError is the failure SQS reported for one entry of a SendMessageBatch call.
type EntryError struct {
	Queue       string
	Code        string // "InvalidMessageContents", "InvalidParameterValue", ...
	Message     string
	SenderFault bool // SQS blames the request (the message), not itself
}

func (e *EntryError) Error() string {
	fault := "receiver"
	if e.SenderFault {
		fault = "sender"
	}
	return fmt.Sprintf("outboxsqs: queue %q refused the message (%s fault): %s: %s", e.Queue, fault, e.Code, e.Message)
}

// ErrorCode returns the SQS error code, as smithy.APIError does.
func (e *EntryError) ErrorCode() string { return e.Code }

func entryError(queue string, f types.BatchResultErrorEntry) error {
	e := &EntryError{Queue: queue, Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}
	if !e.SenderFault || outageCode(e.Code) {
		return outbox.Outage(e)
	}
	return e
}

// SQS error codes, without the "AWS.SimpleQueueService." prefix of the query protocol,
// in the JSON protocol's spelling and, where it differs, the query protocol's.
var (
	// rejectionCodes concern the message itself.
	rejectionCodes = map[string]bool{
		"InvalidMessageContents": true,
		"InvalidParameterValue":  true,
		"MissingParameter":       true,
		"InvalidAttributeName":   true,
		"InvalidAttributeValue":  true,
		"BatchRequestTooLong":    true,
	}
	// outageCodes are backpressure, service trouble or configuration problems that
	// affect every message, whatever SenderFault says.
	outageCodes = map[string]bool{
		// throttling and limits
		"RequestThrottled": true, "ThrottlingException": true, "Throttling": true,
		"OverLimit": true, "RequestLimitExceeded": true,
		// the queue's KMS key
		"KmsAccessDenied": true, "KmsDisabled": true, "KmsInvalidKeyUsage": true,
		"KmsInvalidState": true, "KmsNotFound": true, "KmsOptInRequired": true, "KmsThrottled": true,
		"KMS.AccessDeniedException": true, "KMS.DisabledException": true,
		"KMS.InvalidKeyUsageException": true, "KMS.InvalidStateException": true,
		"KMS.NotFoundException": true, "KMS.OptInRequired": true, "KMS.ThrottlingException": true,
		// credentials and permissions
		"AccessDenied": true, "AccessDeniedException": true, "InvalidSecurity": true,
		"InvalidClientTokenId": true, "UnrecognizedClientException": true,
		"SignatureDoesNotMatch": true, "IncompleteSignature": true, "InvalidAccessKeyId": true,
		"MissingAuthenticationToken": true, "ExpiredToken": true, "ExpiredTokenException": true,
		"RequestExpired": true,
		// the service
		"InternalError": true, "InternalFailure": true, "ServiceUnavailable": true,
		"ServiceUnavailableException": true,
	}
	noQueueCodes = map[string]bool{"QueueDoesNotExist": true, "NonExistentQueue": true}
)

func normalizeCode(code string) string {
	return strings.TrimPrefix(code, "AWS.SimpleQueueService.")
}

func outageCode(code string) bool { return outageCodes[normalizeCode(code)] }

// classify turns the error of a call for queue into an outage or a rejection (see the
// package documentation). A rejection of a call that carried several messages does not
// say which one is at fault: Publish then sends them one by one.
func classify(err error, queue string) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return outbox.Outage(fmt.Errorf("outboxsqs: queue %q: %w", queue, err))
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		code := normalizeCode(apiErr.ErrorCode())
		var qne *types.QueueDoesNotExist
		switch {
		case errors.As(err, &qne), noQueueCodes[code]:
			// SQS answers, but the queue does not exist: an outage of this destination
			// only, so that the relay holds back its messages and goes on.
			return outbox.DestinationOutage("queue "+queue, &NoQueueError{Queue: queue, Err: err})
		case rejectionCodes[code]:
			return fmt.Errorf("outboxsqs: queue %q refused the message: %w", queue, err)
		}
	}
	// Throttling, 5xx, credentials, network errors, a response that does not match the
	// request (checksum), and anything unknown: pause, lose nothing.
	return outbox.Outage(fmt.Errorf("outboxsqs: queue %q: %w", queue, err))
}
