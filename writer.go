package outbox

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/outboxkit/outbox/outboxdriver"
)

// WriterConfig configures a Writer.
type WriterConfig struct {
	// Limits bound message sizes. See Limits for the defaults.
	Limits Limits

	// Inject, when set, is called for each message of a Write with Write's context,
	// before the message is validated, to add headers from the context: the tracing
	// plugin (outboxotel) puts the W3C traceparent of the current span there. It works
	// on Write's own copy of the message; Headers may be nil and may be set.
	Inject func(ctx context.Context, m *Message)

	// Check, when set, is called for each message of a Write after it was validated and
	// its defaults filled, to refuse what the relay's destination could never take: the
	// broker packages give one for their names (outboxnats.Check: a subject NATS refuses,
	// such as a wildcard; outboxkafka.Check: a topic name Kafka refuses). A
	// *ValidationError it returns is passed on with Index set, any other error wrapped
	// in one; either way nothing is written.
	Check func(m *Message) error

	// Priorities gives the messages of a topic a default Message.Priority, for those
	// written with none (0): {"payments": 5} puts payments ahead of a backlog of other
	// topics. Values run from 1 to MaxPriority.
	Priorities map[string]int

	// Priority, when set, gives a default Message.Priority to the messages written with
	// none that Priorities gives none either, from anything of the message:
	// Routing.Priorities gives each destination's. It returns 0 (none) to MaxPriority;
	// a Write fails with a *ValidationError on a value outside.
	Priority func(m *Message) int
}

// Validate checks c as NewWriter does: a *ConfigError names the field at fault.
func (c WriterConfig) Validate() error {
	if err := c.Limits.validate(); err != nil {
		return err
	}
	for topic, p := range c.Priorities {
		field := fmt.Sprintf("Priorities[%q]", topic)
		if topic == "" {
			return &ConfigError{Field: field, Reason: "the topic must not be empty"}
		}
		if p < 1 || p > MaxPriority {
			return &ConfigError{Field: field, Reason: fmt.Sprintf("%d is outside 1-%d", p, MaxPriority)}
		}
	}
	return nil
}

// Writer writes messages in the caller's transaction: the messages exist if and only if
// that transaction commits. It is safe for concurrent use; the transactions passed to it
// follow their own library's rules (a pgx.Tx must not be used by two goroutines at once).
type Writer[TTx any] struct {
	driver outboxdriver.WriteDriver[TTx]
	limits Limits
	inject func(context.Context, *Message)
	check  func(*Message) error
	prio   map[string]int
	prioOf func(*Message) int
}

// NewWriter returns a Writer that inserts through driver.
func NewWriter[TTx any](driver outboxdriver.WriteDriver[TTx], config WriterConfig) (*Writer[TTx], error) {
	if any(driver) == nil {
		return nil, errors.New("outbox: missing driver (wrap a pgx pool with outboxpgx.New or a *sql.DB with outboxsql.New)")
	}
	if err := config.Validate(); err != nil {
		return nil, err
	}
	return &Writer[TTx]{driver: driver, limits: config.Limits.withDefaults(), inject: config.Inject, check: config.Check,
		prio: maps.Clone(config.Priorities), prioOf: config.Priority}, nil
}

// Write validates msgs and inserts them in tx, in as few statements as the driver can
// (outboxpgx: one; outboxsql: one per 6,000 messages; SQLite and MySQL: a few per chunk
// that fits their parameter limits).
//
// Invalid messages make Write return a *ValidationError (errors.Is ErrInvalidMessage)
// before any SQL runs, so the transaction is untouched. Messages whose dedup key is
// already taken are skipped and reported with a *DuplicateError (errors.Is ErrDuplicate);
// the rest are written. Any other error comes from the database and, as with any failed
// statement, leaves the transaction aborted.
//
// Because the rows are ordinary rows of the transaction, a rollback (or a rollback to a
// savepoint taken before Write) removes them, and no relay can see them before commit.
func (w *Writer[TTx]) Write(ctx context.Context, tx TTx, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	// Work on a copy: defaults are filled in place and the caller's slice stays theirs.
	own := make([]Message, len(msgs))
	copy(own, msgs)
	if w.inject != nil {
		for i := range own {
			// The caller's Headers map stays the caller's.
			own[i].Headers = maps.Clone(own[i].Headers)
			w.inject(ctx, &own[i])
		}
	}
	if len(w.prio) > 0 || w.prioOf != nil {
		for i := range own {
			if own[i].Priority == 0 {
				own[i].Priority = w.prio[own[i].Topic]
			}
			if own[i].Priority == 0 && w.prioOf != nil {
				own[i].Priority = w.prioOf(&own[i])
			}
		}
	}
	if err := w.limits.Prepare(own); err != nil {
		return err
	}
	if w.check != nil {
		for i := range own {
			if err := w.check(&own[i]); err != nil {
				return checkFailed(i, err)
			}
		}
	}
	skipped, err := w.driver.Insert(ctx, tx, own)
	if err != nil {
		return err
	}
	if len(skipped) > 0 {
		return &DuplicateError{DedupKeys: skipped}
	}
	return nil
}

// checkFailed is the *ValidationError of message i, refused by WriterConfig.Check.
func checkFailed(i int, err error) error {
	var ve *ValidationError
	if errors.As(err, &ve) {
		out := *ve
		out.Index = i
		return &out
	}
	return &ValidationError{Index: i, Field: "Message", Reason: err.Error()}
}
