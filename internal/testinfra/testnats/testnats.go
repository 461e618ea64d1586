// Package testnats gives tests a real NATS JetStream server: the shared one running on
// this machine (URL, Conn, Stream), or a private nats-server child process that a test
// may stop, kill and restart (StartServer). Tests that cause outages use a private
// server, never the shared one: other packages' tests run against it concurrently. A
// missing server fails the test, never skips it.
package testnats

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

// URL returns the shared test server's URL: $OUTBOX_TEST_NATS_URL or the local server.
func URL() string {
	return cmp.Or(os.Getenv("OUTBOX_TEST_NATS_URL"), "nats://127.0.0.1:4222")
}

// Conn connects to url (URL() when empty) and closes the connection when the test ends.
func Conn(t testenv.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	url = cmp.Or(url, URL())
	// The connect timeout bounds a hang: a missing server refuses at once.
	nc, err := nats.Connect(url, append([]nats.Option{nats.Timeout(testenv.Stall())}, opts...)...)
	if err != nil {
		t.Fatalf("testnats: NATS at %s is not reachable (start nats-server -js, or set OUTBOX_TEST_NATS_URL): %v", redact(url), err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// JetStream returns a JetStream context on a new connection to url (URL() when empty).
func JetStream(t testenv.TB, url string, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(Conn(t, url, opts...))
	if err != nil {
		t.Fatalf("testnats: %v", err)
	}
	return js
}

// Stream creates a uniquely named memory stream capturing "<unique>.>" and deletes it when
// the test ends. It returns the stream's name and the subject prefix ("<unique>.") to
// publish under.
func Stream(t testenv.TB, js jetstream.JetStream) (name string, subjectPrefix string) {
	t.Helper()
	unique := Unique()
	name = strings.ToUpper(unique)
	subjectPrefix = unique + "."
	_, err := js.CreateStream(testenv.Context(t), jetstream.StreamConfig{
		Name:     name,
		Subjects: []string{subjectPrefix + ">"},
		Storage:  jetstream.MemoryStorage,
	})
	if err != nil {
		t.Fatalf("testnats: create stream %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := testenv.CallContext()
		defer cancel()
		if err := js.DeleteStream(ctx, name); err != nil {
			t.Logf("testnats: delete stream %s: %v", name, err)
		}
	})
	return name, subjectPrefix
}

// Unique returns a fresh name usable as a subject token and a stream name.
func Unique() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "outbox_test_" + hex.EncodeToString(b[:])
}

// redact hides the user information of a URL in messages.
func redact(url string) string {
	scheme, rest, ok := strings.Cut(url, "://")
	if i := strings.LastIndex(rest, "@"); ok && i >= 0 {
		return scheme + "://REDACTED" + rest[i:]
	}
	return url
}
