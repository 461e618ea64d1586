package outbox

import (
	"context"
	"fmt"
)

// Publisher sends messages to a broker. Every broker adapter (outboxnats, ...) and the
// in-memory publisher of outboxtest implement it.
//
// Publish sends batch and returns when every message of it has been durably confirmed by
// the broker or has failed. It returns nil when all were confirmed; otherwise a slice of
// len(batch) whose i-th entry is nil exactly when batch[i] was confirmed. "Confirmed"
// must mean durable at the broker (a JetStream PubAck, a RabbitMQ confirm for a routed
// message, Kafka acks=all): the relay marks a message published on that word alone.
//
// Errors are of two kinds, and the relay treats them differently. An outage (the broker is
// unreachable, the connection broke, a timeout with unknown outcome) must be wrapped with
// Outage: the relay pauses, retries later and counts no attempt. Any other error is a
// rejection of that one message: the relay counts an attempt, backs off that message's key
// and dead-letters the message after the attempt limit, or at once when the error is
// wrapped with Permanent (the message can never be published: a destination reserved for
// the broker's own APIs, a message over the broker's size limit).
//
// The messages of one batch have distinct keys, so a publisher may send them all at once
// (pipelined) without breaking per-key order. Publish is called from several goroutines
// at once and must be safe for that. The batch and its messages must not be retained or
// modified after Publish returns.
type Publisher interface {
	Publish(ctx context.Context, batch []*Message) []error
}

// Pinger is implemented by publishers that can check the broker's reachability cheaply.
// After an outage the relay pings before it resumes sending.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Reconnector is implemented by publishers that keep a connection to the broker and know
// when it comes back. A relay paused by an outage probes the broker with backoff (Ping);
// with a Reconnector it also resumes at once when the publisher's connection is back,
// without waiting for its next probe.
type Reconnector interface {
	// Reconnected returns a channel that receives a value soon after each time the
	// publisher connects to the broker again. It is called once; values sent while nobody
	// listens may be dropped, but not the last one.
	Reconnected() <-chan struct{}
}

// publishAll calls pub.Publish and returns one result per message of batch, or nil: a
// publisher that answers with another number of results has failed the whole batch with
// an unknown outcome, an outage.
func publishAll(ctx context.Context, pub Publisher, batch []*Message) []error {
	errs := pub.Publish(ctx, batch)
	if errs != nil && len(errs) != len(batch) {
		return failAll(len(batch), Outage(fmt.Errorf("outbox: publisher returned %d results for %d messages", len(errs), len(batch))))
	}
	return errs
}

// failAll returns the results of n messages that all failed with err.
func failAll(n int, err error) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}
