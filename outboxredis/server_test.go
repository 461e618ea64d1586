package outboxredis_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxredis"
)

// The shared Redis of this machine keeps nothing on disk, and other packages' tests may
// use it: tests never restart, fill or reconfigure it. Tests that need a server in a
// special state (out of memory, a replica, busy, TLS, a cluster) start a private
// redis-server child process.

// sharedAddr is the shared test server: $OUTBOX_TEST_REDIS_ADDR or the local one.
func sharedAddr() string {
	return cmp.Or(os.Getenv("OUTBOX_TEST_REDIS_ADDR"), "127.0.0.1:6379")
}

// newClient connects to addr, fails the test if the server does not answer, and closes
// the client when the test ends. Reads time out after a minute, not go-redis's 3 s: the
// tests run many servers in parallel on a small machine, and a stalled second must not
// fail a test that is not about timeouts.
func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, ReadTimeout: time.Minute})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(testenv.Context(t)).Err(); err != nil {
		t.Fatalf("Redis at %s is not reachable (start redis-server, or set OUTBOX_TEST_REDIS_ADDR): %v", addr, err)
	}
	return c
}

// uniqueStream returns a fresh stream name, and deletes every key whose name holds it
// (the stream, streams named after it, dedup markers) when the test ends.
func uniqueStream(t testing.TB, c redis.UniversalClient) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "outboxredis-test-" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx, cancel := testenv.CallContext()
		defer cancel()
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, "*"+name+"*", 1000).Result()
			if err != nil {
				return
			}
			for _, k := range keys {
				c.Del(ctx, k)
			}
			if cursor = next; cursor == 0 {
				return
			}
		}
	})
	return name
}

// newMsg is testenv.Message with the creation time a relay gives it.
func newMsg(topic, key string, payload []byte) *outbox.Message {
	m := testenv.Message(topic, key, payload)
	m.CreatedAt = time.Now()
	return m
}

func batchOf(topic string, n int) []*outbox.Message {
	batch := make([]*outbox.Message, n)
	for i := range batch {
		batch[i] = newMsg(topic, "k"+strconv.Itoa(i), []byte(`{"n":`+strconv.Itoa(i)+`}`))
	}
	return batch
}

func requireAll(t testing.TB, errs []error, n int, outage bool) {
	t.Helper()
	if len(errs) != n {
		t.Fatalf("errs = %v, want %d errors", errs, n)
	}
	for i, err := range errs {
		if err == nil || outbox.IsOutage(err) != outage {
			t.Errorf("message %d: %v, want an error with IsOutage %v", i, err, outage)
		}
	}
}

// entries reads the whole stream.
func entries(t testing.TB, c redis.Cmdable, stream string) []outboxredis.Entry {
	t.Helper()
	ctx, cancel := testenv.CallContext()
	defer cancel()
	xs, err := c.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		t.Fatalf("XRANGE %s: %v", stream, err)
	}
	out := make([]outboxredis.Entry, len(xs))
	for i, x := range xs {
		out[i] = outboxredis.ParseEntry(x)
	}
	return out
}

// server is a private redis-server child process, killed when the test ends.
type server struct {
	Addr string
	Port string
	Dir  string
	args []string
	cmd  *exec.Cmd
}

// freePort returns a port that was free a moment ago.
func freePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// startServer starts a private redis-server without persistence, with extra
// configuration arguments ("--maxmemory", "1mb", ...), and waits until it answers.
func startServer(t testing.TB, extra ...string) *server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server is not installed (apt-get install redis-server): %v", err)
	}
	s := &server{Port: freePort(t), Dir: t.TempDir()}
	s.Addr = "127.0.0.1:" + s.Port
	s.args = append([]string{"--port", s.Port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.Dir, "--logfile", filepath.Join(s.Dir, "redis.log")}, extra...)
	t.Cleanup(s.Kill)
	s.Start(t)
	return s
}

// Start starts the server again after Kill, on the same port.
func (s *server) Start(t testing.TB) {
	t.Helper()
	s.cmd = exec.Command("redis-server", s.args...)
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	err := testenv.Progress(context.Background(), "private redis-server on "+s.Addr+" to answer", testenv.Stall(), func() (any, bool) {
		ctx, cancel := testenv.CallContext()
		defer cancel()
		err := c.Ping(ctx).Err()
		return err, err == nil
	})
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
		t.Fatalf("%v\n%s", err, log)
	}
}

// Kill stops the server at once; killing it twice is safe.
func (s *server) Kill() {
	if s.cmd != nil && s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
}

// Signal sends sig to the server process (SIGSTOP stalls it, SIGCONT resumes it).
func (s *server) Signal(t testing.TB, sig os.Signal) {
	t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to redis-server: %v", sig, err)
	}
}

// info returns the value of field in the INFO output of c, or "".
func info(t testing.TB, c redis.Cmdable, section, field string) string {
	t.Helper()
	ctx, cancel := testenv.CallContext()
	defer cancel()
	for line := range strings.SplitSeq(c.Info(ctx, section).Val(), "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	return ""
}
