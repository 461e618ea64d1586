package outboxamqp

import (
	"context"
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
)

// TestClassify pins the error table of the package documentation for errors that the
// tests against a real server cannot provoke cheaply.
func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		err    error
		outage bool
	}{
		{"returned", &ReturnError{RoutingKey: "k", Code: amqp.NoRoute, Text: "NO_ROUTE"}, false},
		{"nacked", outbox.Outage(&NackError{RoutingKey: "k"}), true},
		{"channel closed", sendErr(amqp.ErrClosed, "", "k"), true},
		{"connection forced", sendErr(&amqp.Error{Code: amqp.ConnectionForced, Reason: "CONNECTION_FORCED - shutdown"}, "", "k"), true},
		{"exchange not found", sendErr(&amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no exchange 'x'"}, "x", "k"), true},
		{"access refused", sendErr(&amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED"}, "x", "k"), true},
		{"message over max_message_size", sendErr(&amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - message size 20 is larger than configured max size 10"}, "", "k"), true},
		{"internal error", sendErr(&amqp.Error{Code: amqp.InternalError, Reason: "INTERNAL_ERROR"}, "", "k"), true},
		{"frame error", sendErr(&amqp.Error{Code: amqp.FrameError, Reason: "FRAME_ERROR"}, "", "k"), true},
		{"deadline", sendErr(context.DeadlineExceeded, "", "k"), true},
		{"unknown", sendErr(errors.New("something new"), "", "k"), true},
	} {
		if outbox.IsOutage(tc.err) != tc.outage {
			t.Errorf("%s: IsOutage(%v) = %v, want %v", tc.name, tc.err, !tc.outage, tc.outage)
		}
	}
	re := &ReturnError{Exchange: "events", RoutingKey: "order.placed", Code: amqp.NoRoute, Text: "NO_ROUTE"}
	if !errors.Is(re, outbox.ErrUnroutable) {
		t.Error("a ReturnError does not match outbox.ErrUnroutable")
	}
	if got := re.Error(); got != `outboxamqp: exchange "events" returned the message with routing key "order.placed" as unroutable (312 NO_ROUTE): bind a queue that matches the routing key, or give the exchange an alternate exchange` {
		t.Errorf("ReturnError text: %s", got)
	}
	if errors.Is(&NackError{}, outbox.ErrUnroutable) {
		t.Error("a NackError matches outbox.ErrUnroutable")
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"amqp://127.0.0.1:5672/":                        "amqp://127.0.0.1:5672/",
		"amqp://guest:guest@h:5672/%2F":                 "amqp://REDACTED@h:5672/%2F",
		"amqps://user@h/vhost":                          "amqps://REDACTED@h/vhost",
		"amqp://u:p%zz@h:5672/":                         "amqp://REDACTED@h:5672/",
		"amqp://u:pa?ss#w/rd@h:5672/":                   "amqp://REDACTED@h:5672/",
		"amqp://u:p@h:port/":                            "amqp://REDACTED@h:port/",
		"amqp://h/?heartbeat=5&auth_mechanism=external": "amqp://h/?heartbeat=5&auth_mechanism=external",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}
