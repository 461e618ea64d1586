package outboxnats

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
)

// ErrNoStream is matched (errors.Is) by every *NoStreamError.
var ErrNoStream = errors.New("outboxnats: no JetStream stream captures the subject")

// NoStreamError reports a subject that no JetStream stream captures: nothing would store
// a message published to it. Publish returns it wrapped as an outage, since it is a
// configuration problem that would otherwise dead-letter every message. In a cluster the
// server gives the same answer (no responders) while the subject's stream has no leader,
// so a brief burst of these during a leader election is no cause for alarm.
type NoStreamError struct {
	Subject string
	Err     error // the underlying error (jetstream.ErrNoStreamResponse, ...), if any
}

func (e *NoStreamError) Error() string {
	return fmt.Sprintf("outboxnats: no JetStream stream captures subject %q: create a stream whose subjects match it "+
		"(for example: nats stream add --subjects %q) or fix the publisher's Route",
		e.Subject, suggestFilter(e.Subject))
}

// Is makes errors.Is(err, ErrNoStream) true.
func (e *NoStreamError) Is(target error) bool { return target == ErrNoStream }

func (e *NoStreamError) Unwrap() error { return e.Err }

// suggestFilter returns a stream subject filter that captures subject: its first token
// and ">" ("events.orders" -> "events.>").
func suggestFilter(subject string) string {
	first, _, more := strings.Cut(subject, ".")
	if !more || first == "" {
		return subject
	}
	return first + ".>"
}

// JetStream API error codes this package classifies and nats.go does not name.
const (
	codeAccountResourcesExceeded jetstream.ErrorCode = 10002
	codeInsufficientResources    jetstream.ErrorCode = 10023
	codeMemoryResourcesExceeded  jetstream.ErrorCode = 10028
	codeStorageResourcesExceeded jetstream.ErrorCode = 10047
	codeStreamStoreFailed        jetstream.ErrorCode = 10077 // incl. max msgs/bytes with discard new
	codeStreamSealed             jetstream.ErrorCode = 10109
	codeDuplicateInProcess       jetstream.ErrorCode = 10158
	codeTooManyRequests          jetstream.ErrorCode = 10167
)

// classify turns an error of publishing to subject into an outage or a rejection (see the
// package documentation).
func classify(err error, subject string) error {
	wrapped := fmt.Errorf("outboxnats: publish to subject %q: %w", subject, err)
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		// The server answers, but no stream takes this subject: an outage of this
		// destination only, so that the relay holds back its messages and goes on.
		return outbox.DestinationOutage("subject "+subject, &NoStreamError{Subject: subject, Err: err})
	case errors.Is(err, nats.ErrMaxPayload),
		errors.Is(err, nats.ErrBadSubject),
		errors.Is(err, jetstream.ErrInvalidJSAck), // a reply that is no PubAck: not a stream's subject
		errors.Is(err, nats.ErrBadHeaderMsg),
		errors.Is(err, nats.ErrInvalidMsg):
		return wrapped
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return outbox.Outage(wrapped)
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		if apiOutage(apiErr) {
			return outbox.Outage(wrapped)
		}
		return wrapped
	}
	// Connection-level errors (closed, draining, reconnecting, disconnected, timeouts,
	// too many stalled publishes, ...) and anything unknown: pause, lose nothing.
	return outbox.Outage(wrapped)
}

// apiOutage reports whether a JetStream API error answering a publish is an outage
// rather than a rejection of the message.
func apiOutage(e *jetstream.APIError) bool {
	switch e.ErrorCode {
	case codeAccountResourcesExceeded, codeInsufficientResources, codeMemoryResourcesExceeded,
		codeStorageResourcesExceeded, codeStreamStoreFailed, codeStreamSealed,
		codeDuplicateInProcess, codeTooManyRequests,
		jetstream.JSErrCodeJetStreamNotEnabled, jetstream.JSErrCodeJetStreamNotEnabledForAccount,
		jetstream.JSErrCodeStreamNotFound:
		return true
	case jetstream.JSErrCodeStreamMessageExceedsMaximum,
		jetstream.JSErrCodeStreamWrongLastSequence,
		jetstream.JSErrCodeStreamWrongLastSequenceConstant,
		jetstream.JSErrCodeBadRequest:
		return false
	}
	// 5xx: the server or cluster is in trouble (offline stream, no leader, ...); 409 and
	// 429 ask to come back later. 4xx is about the request, that is, the message.
	return e.Code >= 500 || e.Code == 409 || e.Code == 429
}

// Check returns a check for outbox.WriterConfig.Check that refuses at write time the
// messages whose subject, by route (the publisher's Config.Route; "" is "{topic}"), no
// NATS publisher can take: a wildcard token ("orders.>"), an empty token, white space,
// or a subject reserved for the server's APIs. The relay would otherwise dead-letter
// them at their first attempt.
func Check(route string) (func(*outbox.Message) error, error) {
	r, err := outbox.ParseRoute(route)
	if err != nil {
		return nil, err
	}
	return r.Check("NATS subject", checkSubject), nil
}

// checkSubject returns why subject cannot be published to, or "". NATS subjects are
// dot-separated non-empty tokens without white space; a token "*" or ">" is a wildcard,
// which subscribers may use but publishers may not.
func checkSubject(subject string) string {
	if subject == "" {
		return "empty subject"
	}
	if first, _, _ := strings.Cut(subject, "."); strings.HasPrefix(first, "$") || first == "_INBOX" || first == "_R_" {
		// $JS.API (a publish there can delete or purge a stream), $SYS, $KV, $O, $JSC,
		// $NRG, $MQTT...: the server's own APIs. _INBOX and _R_: replies to requests.
		return fmt.Sprintf("%q is reserved for the server's APIs and replies, not for messages", first)
	}
	if i := strings.IndexFunc(subject, func(r rune) bool { return r <= ' ' || r == 0x7f }); i >= 0 {
		return fmt.Sprintf("white space or control character at byte %d", i)
	}
	for tok := range strings.SplitSeq(subject, ".") {
		switch tok {
		case "":
			return "empty token (leading, trailing or double dot)"
		case "*", ">":
			return fmt.Sprintf("wildcard token %q", tok)
		}
	}
	return ""
}

// covers reports whether every subject that filter sub matches is matched by filter f
// (both may hold wildcards).
func covers(f, sub string) bool {
	ft := strings.Split(f, ".")
	st := strings.Split(sub, ".")
	for i, t := range ft {
		if t == ">" {
			return i < len(st)
		}
		if i >= len(st) {
			return false
		}
		switch st[i] {
		case ">":
			return false
		case "*":
			if t != "*" {
				return false
			}
		default:
			if t != "*" && t != st[i] {
				return false
			}
		}
	}
	return len(ft) == len(st)
}
