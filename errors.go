package outbox

import (
	"errors"
	"fmt"
	"strings"

	"github.com/outboxkit/outbox/outboxdriver"
)

// ErrInvalidMessage is matched (errors.Is) by every *ValidationError.
var ErrInvalidMessage = errors.New("outbox: invalid message")

// ValidationError says which message and which field Write rejected, and why. Write
// returns it before running any SQL, so nothing was written.
type ValidationError struct {
	Index  int    // position of the message in the Write call
	Field  string // "Topic", "Payload", "Headers[x-trace]", ...
	Reason string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("outbox: invalid message %d: %s: %s", e.Index, e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidMessage) true.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalidMessage }

// ErrDuplicate is matched (errors.Is) by every *DuplicateError.
var ErrDuplicate = errors.New("outbox: duplicate dedup key")

// DuplicateError reports messages that Write skipped because a message with the same
// dedup key already exists (committed, or written earlier in the same transaction or the
// same call). A dedup key stays taken while its message is pending or dead-lettered, and
// for the relay's Retention after the message was written. The other messages of the call were written and the transaction is still
// usable: commit it if the duplicate means "this was already done" (an idempotent retry),
// roll it back otherwise. A concurrent transaction holding the same dedup key makes Write
// wait for it; if that transaction rolls back, Write inserts the message instead.
type DuplicateError struct {
	DedupKeys []string // the skipped messages' dedup keys, in call order
}

func (e *DuplicateError) Error() string {
	const show = 5
	keys := e.DedupKeys
	more := ""
	if len(keys) > show {
		more = fmt.Sprintf(" and %d more", len(keys)-show)
		keys = keys[:show]
	}
	return fmt.Sprintf("outbox: %d message(s) skipped, dedup key already used: %s%s",
		len(e.DedupKeys), strings.Join(keys, ", "), more)
}

// Is makes errors.Is(err, ErrDuplicate) true.
func (e *DuplicateError) Is(target error) bool { return target == ErrDuplicate }

// OutageError marks a publish failure as a connection-level outage: the broker could not
// be reached or the connection broke, so the message was neither accepted nor rejected
// on its merits. The relay pauses with backoff and does not count an attempt. Publishers
// wrap such errors with Outage.
type OutageError struct{ Err error }

func (e *OutageError) Error() string { return "broker outage: " + e.Err.Error() }
func (e *OutageError) Unwrap() error { return e.Err }

// Outage wraps err as an *OutageError. It returns nil for a nil err.
func Outage(err error) error {
	if err == nil {
		return nil
	}
	var oe *OutageError
	if errors.As(err, &oe) {
		return err
	}
	return &OutageError{Err: err}
}

// DestinationOutageError marks a publish failure as an outage of one destination: the
// broker answers, but this message's destination cannot take messages now (a webhook
// endpoint answering 5xx or 429, an SQS queue that does not exist, a NATS subject that no
// stream captures). The relay counts no attempt and defers the message's key, with a
// delay that grows while the destination keeps failing; the other destinations go on.
// Destination names the destination in logs and metrics: it must hold no secret.
type DestinationOutageError struct {
	Destination string
	Err         error
}

func (e *DestinationOutageError) Error() string {
	return "destination " + e.Destination + " unavailable: " + e.Err.Error()
}
func (e *DestinationOutageError) Unwrap() error { return e.Err }

// DestinationOutage wraps err as a *DestinationOutageError for destination. It returns nil
// for a nil err.
func DestinationOutage(destination string, err error) error {
	if err == nil {
		return nil
	}
	return &DestinationOutageError{Destination: destination, Err: err}
}

// AsDestinationOutage returns the destination of err when it is, or wraps, a
// *DestinationOutageError and is not a broker-wide outage.
func AsDestinationOutage(err error) (destination string, ok bool) {
	var de *DestinationOutageError
	if IsOutage(err) || !errors.As(err, &de) {
		return "", false
	}
	return de.Destination, true
}

// IsUnavailable reports whether err says that the message could not be delivered for now,
// with no attempt to count: a broker outage (IsOutage) or an outage of its destination
// (AsDestinationOutage). Anything else is a rejection of the message.
func IsUnavailable(err error) bool {
	var de *DestinationOutageError
	return IsOutage(err) || errors.As(err, &de)
}

// IsOutage reports whether err is, or wraps, a connection-level outage: an *OutageError
// or any error with a method Outage() bool that returns true.
func IsOutage(err error) bool {
	var oe *OutageError
	if errors.As(err, &oe) {
		return true
	}
	var o interface{ Outage() bool }
	return errors.As(err, &o) && o.Outage()
}

// ErrNoPriorities is matched (errors.Is) by the error of a Write that gives a message a
// Priority the store cannot keep: a PostgreSQL outbox before schema version 10 (run
// outbox migrate up), or a MySQL or SQLite one. The database may have refused the
// statement: roll the transaction back, as after any database error.
var ErrNoPriorities = outboxdriver.ErrNoPriorities
