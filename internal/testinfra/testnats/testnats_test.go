package testnats_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testnats"
)

func TestStream(t *testing.T) {
	t.Parallel()
	js := testnats.JetStream(t, "")
	var name, prefix string
	t.Run("create", func(t *testing.T) {
		name, prefix = testnats.Stream(t, js)
		if !strings.HasSuffix(prefix, ".") {
			t.Fatalf("prefix %q does not end with a dot", prefix)
		}
		ack, err := js.Publish(testenv.Context(t), prefix+"a.b", []byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		if ack.Stream != name {
			t.Errorf("stored in %q, want %q", ack.Stream, name)
		}
		name2, prefix2 := testnats.Stream(t, js)
		if name2 == name || prefix2 == prefix {
			t.Errorf("two streams share a name or prefix: %s %s", name, prefix)
		}
	})
	// The subtest has ended: its cleanup deleted the stream.
	if _, err := js.Stream(testenv.Context(t), name); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("stream %s after cleanup: %v, want ErrStreamNotFound", name, err)
	}
}

func TestServerStopKillStart(t *testing.T) {
	t.Parallel()
	srv := testnats.StartServer(t)
	if !strings.HasPrefix(srv.URL(), "nats://127.0.0.1:") || srv.URL() == testnats.URL() {
		t.Fatalf("URL = %s, want a private port on 127.0.0.1", srv.URL())
	}
	publish := func(t *testing.T, subj string) error {
		// A stopped server refuses at once: the timeout only bounds a hang.
		nc, err := nats.Connect(srv.URL(), nats.Timeout(testenv.Stall()), nats.MaxReconnects(0))
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		_, err = js.Publish(testenv.Context(t), subj, []byte("x"))
		return err
	}
	count := func(t *testing.T) uint64 {
		js := testnats.JetStream(t, srv.URL())
		s, err := js.Stream(testenv.Context(t), "S")
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().State.Msgs
	}

	js := testnats.JetStream(t, srv.URL())
	if _, err := js.CreateStream(testenv.Context(t), jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	if err := publish(t, "s.1"); err != nil {
		t.Fatal(err)
	}

	srv.Stop()
	if err := publish(t, "s.2"); err == nil {
		t.Fatal("publish to a stopped server succeeded")
	}
	srv.Stop() // stopping twice is safe
	srv.Start()
	if n := count(t); n != 1 {
		t.Errorf("after Stop and Start: %d messages, want 1 (same store directory)", n)
	}

	if err := publish(t, "s.3"); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	if err := publish(t, "s.4"); err == nil {
		t.Fatal("publish to a killed server succeeded")
	}
	srv.Start()
	srv.Start() // starting a running server does nothing
	if n := count(t); n != 2 {
		t.Errorf("after Kill and Start: %d messages, want 2", n)
	}
}
