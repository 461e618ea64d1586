package outboxcli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxredis"
)

// redisAddr is the Redis of the tests: OUTBOX_TEST_REDIS_ADDR, or the local server.
func redisAddr() string {
	if a := os.Getenv("OUTBOX_TEST_REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// redisPrefix connects to the test server and returns a fresh key prefix; the keys
// under it are deleted when the test ends. A missing server fails the test.
func redisPrefix(t *testing.T) (*redis.Client, string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: redisAddr()})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(testenv.Context(t)).Err(); err != nil {
		t.Fatalf("Redis is needed (set OUTBOX_TEST_REDIS_ADDR, or start redis-server): %v", err)
	}
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	prefix := "cli-" + hex.EncodeToString(b) + "."
	t.Cleanup(func() {
		ctx, cancel := testenv.CallContext()
		defer cancel()
		keys, _ := c.Keys(ctx, prefix+"*").Result()
		for _, k := range keys {
			c.Del(ctx, k)
		}
	})
	return c, prefix
}

// TestRelayRedis runs the relay against Redis: messages land in the streams the route
// names, in the entry layout of outboxredis, and a topic whose key is not a stream is
// named in a warning at start-up.
func TestRelayRedis(t *testing.T) {
	t.Parallel()
	b := migrated(t)
	c, prefix := redisPrefix(t)
	ctx := context.Background()
	if err := c.Set(ctx, prefix+"blocked", "not a stream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	msgs := []outbox.Message{
		{ID: outbox.NewID(), Topic: "orders", Key: "o-1", Payload: []byte(`{"n":1}`), DedupKey: "order-1-placed"},
		{ID: outbox.NewID(), Topic: "orders", Key: "o-1", Payload: []byte(`{"n":2}`)},
		{ID: outbox.NewID(), Topic: "blocked", Key: "b-1", Payload: []byte(`{"n":3}`)},
	}
	b.Write(t, msgs...)

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	env := with(b.env, "OUTBOX_POLL_INTERVAL", "50ms")
	go func() {
		done <- run(rctx, []string{"relay", "--broker", "redis://" + redisAddr(), "--route", prefix + "{topic}",
			"--redis-maxlen", "1000", "--redis-dedup-window", "1m", "--max-attempts", "100", "--log-format", "json"},
			func(k string) string { return env[k] }, &stdout, &stderr)
	}()

	var got []outboxredis.Entry
	testenv.Await(t, "2 entries in "+prefix+"orders", func() (any, bool) {
		xs, err := c.XRange(ctx, prefix+"orders", "-", "+").Result()
		got = got[:0]
		for _, x := range xs {
			got = append(got, outboxredis.ParseEntry(x))
		}
		return fmt.Sprintf("%d entries (%v)", len(got), err), len(got) >= 2
	})
	for i, m := range msgs[:2] {
		if string(got[i].Payload) != string(m.Payload) || got[i].Headers[outbox.HeaderID] != m.ID.String() {
			t.Errorf("entry %d: %+v, want payload %s and id %s", i, got[i], m.Payload, m.ID)
		}
	}
	if got[0].DedupKey() != "order-1-placed" {
		t.Errorf("dedup key %q", got[0].DedupKey())
	}
	testenv.AwaitCond(t, "the warning about "+prefix+"blocked", func() bool {
		return strings.Contains(stderr.String(), "cannot be added to their stream") && strings.Contains(stderr.String(), prefix+"blocked")
	})

	cancel()
	if code := testenv.AwaitRecv(t, "the relay to stop after its context ended", done); code != 0 {
		t.Fatalf("relay exited %d after a graceful stop\nstderr:\n%s", code, stderr.String())
	}
}

// TestRelayRedisPassword gives a password from a file for a user the server does not
// have: the server refuses it (go-redis authenticates only when there is a password, so
// the refusal shows it was sent), and the password never reaches the output.
func TestRelayRedisPassword(t *testing.T) {
	t.Parallel()
	b := migrated(t)
	const secret = "redis-s3cret-pw"
	pwFile := writeFile(t, "password", secret+"\n")
	r := cli(t, b.env, "relay", "--broker", "redis://outbox-nosuchuser@"+redisAddr(), "--redis-password-file", pwFile)
	if r.code != 1 || !strings.Contains(errorLine(r.stderr), "WRONGPASS") {
		t.Errorf("want a refused password (exit 1), got %s", r)
	}
	if strings.Contains(r.stdout+r.stderr, secret) {
		t.Errorf("the password appears in the output:\n%s", r)
	}
}

func TestRelayRedisRejectsBadSettingsBeforeConnecting(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OUTBOX_DATABASE_URL": unreachableDB, "OUTBOX_BROKER": "redis://127.0.0.1:1"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--redis-maxlen", "-1"}, "--redis-maxlen: must not be negative"},
		{[]string{"--redis-maxlen-exact"}, "--redis-maxlen-exact: needs MaxLen"},
		{[]string{"--redis-dedup-window", "-1s"}, "--redis-dedup-window"},
		{[]string{"--redis-wait-replicas", "-1"}, "--redis-wait-replicas"},
		{[]string{"--redis-wait-timeout", "10us"}, "--redis-wait-timeout"},
		{[]string{"--broker-tls-server-name", "redis"}, "TLS needs a rediss:// --broker URL"},
		{[]string{"--redis-password", "pw", "--redis-password-file", "/dev/null"}, "give one"},
		{[]string{"--redis-password-file", "/nonexistent/pw"}, "--redis-password-file"},
	} {
		r := cli(t, env, append([]string{"relay"}, tc.args...)...)
		if r.code != 2 || !strings.Contains(errorLine(r.stderr), tc.want) {
			t.Errorf("relay %v: want exit 2 and %q, got %s", tc.args, tc.want, r)
		}
	}
}
