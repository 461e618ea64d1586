package outboxredis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox"
)

// replyErr is an error reply as go-redis returns it: a redis.Error.
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

// TestClassify pins the error table of the package documentation, for the errors that
// the tests against real servers do not provoke (those are in outage_test.go and
// cluster_test.go).
func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err    error
		outage bool
	}{
		// Connection level and unknown outcome.
		{io.EOF, true},
		{io.ErrUnexpectedEOF, true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true},
		{context.DeadlineExceeded, true},
		{context.Canceled, true},
		{redis.ErrClosed, true},
		{redis.ErrPoolTimeout, true},
		{redis.ErrPoolExhausted, true},
		{redis.Nil, true},
		{errors.New("something new"), true},
		// Server states and backpressure.
		{replyErr("OOM command not allowed when used memory > 'maxmemory'."), true},
		{replyErr("OOM command not allowed when used memory > 'maxmemory'. script: 3c96, on @user_script:1."), true},
		{replyErr("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."), true},
		{replyErr("LOADING Redis is loading the dataset in memory"), true},
		{replyErr("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), true},
		{replyErr("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk."), true},
		// Failover and cluster.
		{replyErr("READONLY You can't write against a read only replica."), true},
		{replyErr("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{replyErr("CLUSTERDOWN The cluster is down"), true},
		{replyErr("MOVED 3999 127.0.0.1:6381"), true},
		{replyErr("ASK 3999 127.0.0.1:6381"), true},
		{replyErr("NOREPLICAS Not enough good replicas to write."), true},
		// Configuration.
		{replyErr("NOAUTH Authentication required."), true},
		{replyErr("WRONGPASS invalid username-password pair or user is disabled."), true},
		{replyErr("NOPERM this user has no permissions to access one of the keys used as arguments"), true},
		{replyErr("ERR unknown command 'XADD', with args beginning with: "), true},
		{replyErr("ERR max number of clients reached"), true},
		{replyErr("ERR upstream failure"), true}, // Envoy's Redis proxy
		{replyErr("SOMENEWCODE whatever"), true},
		// Rejections.
		{replyErr("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{replyErr("WRONGTYPE Operation against a key holding the wrong kind of value script: 3c96, on @user_script:1."), false},
		{replyErr("CROSSSLOT Keys in request don't hash to the same slot"), false},
		{replyErr("ERR The stream has exhausted the last possible ID, unable to add more items"), false},
		{replyErr("ERR Protocol error: invalid bulk length"), false},
		{replyErr("ERR string exceeds maximum allowed size (proto-max-bulk-len)"), false},
	} {
		for _, err := range []error{tc.err, fmt.Errorf("hook: %w", tc.err)} {
			got := classify(err, "orders")
			if outbox.IsOutage(got) != tc.outage {
				t.Errorf("classify(%v): IsOutage = %v, want %v", err, !tc.outage, tc.outage)
			}
			if !errors.Is(got, tc.err) {
				t.Errorf("classify(%v) = %v does not wrap it", err, got)
			}
		}
	}
}

func TestDedupMarker(t *testing.T) {
	t.Parallel()
	for stream, want := range map[string]string{
		"orders":      "{orders}:outbox-dedup:k",
		"a{b":         "{a{b}:outbox-dedup:k",
		"{orders}":    "{orders}:outbox-dedup:k",
		"ev.{t}.x":    "ev.{t}.x:outbox-dedup:k",
		"a}b":         "a}b:outbox-dedup:k",
		"events.{}.x": "events.{}.x:outbox-dedup:k",
	} {
		if got := dedupMarker(stream, "k"); got != want {
			t.Errorf("dedupMarker(%q) = %q, want %q", stream, got, want)
		}
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"redis://127.0.0.1:6379":             "redis://127.0.0.1:6379",
		"redis://user:pw@host:6379/2":        "redis://REDACTED@host:6379/2",
		"rediss://:pw@host:6380?pool_size=4": "rediss://REDACTED@host:6380?pool_size=4",
		"redis://pw@host":                    "redis://REDACTED@host",
		"redis://:pw@[::1%zz]:6379":          "(invalid URL)",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}
