package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// broker is the NATS side of a run: an embedded JetStream server, or a real one, with a
// stream of the run's own.
type broker struct {
	describe      string
	js            jetstream.JetStream
	stream        string
	subjectPrefix string
	close         func()
}

// startBroker connects to url, or starts an embedded JetStream server storing under dir
// when url is empty, and creates the run's stream.
func startBroker(ctx context.Context, url, dir string) (*broker, error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	b := &broker{close: closeAll}
	if url == "" {
		srv, err := server.NewServer(&server.Options{
			ServerName: "outbox-demo", Host: "127.0.0.1", Port: server.RANDOM_PORT,
			JetStream: true, StoreDir: filepath.Join(dir, "jetstream"), NoLog: true, NoSigs: true,
		})
		if err != nil {
			return nil, fmt.Errorf("embedded NATS: %w", err)
		}
		srv.Start()
		closers = append(closers, func() { srv.Shutdown(); srv.WaitForShutdown() })
		if !srv.ReadyForConnections(10 * time.Second) {
			closeAll()
			return nil, fmt.Errorf("embedded NATS did not start")
		}
		url = srv.ClientURL()
		b.describe = "embedded NATS JetStream server (" + url + ")"
	} else {
		b.describe = "NATS JetStream at " + redactURL(url)
	}
	nc, err := nats.Connect(url, nats.Name("outbox-demo"))
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("connect to NATS at %s: %w", redactURL(url), err)
	}
	closers = append(closers, nc.Close)
	if b.js, err = jetstream.New(nc); err != nil {
		closeAll()
		return nil, err
	}
	tag := randomTag()
	b.stream, b.subjectPrefix = "OUTBOX_DEMO_"+strings.ToUpper(tag), "outbox_demo_"+tag+"."
	if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: b.stream, Subjects: []string{b.subjectPrefix + ">"}}); err != nil {
		closeAll()
		return nil, fmt.Errorf("create stream %s: %w", b.stream, err)
	}
	closers = append(closers, func() {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = b.js.DeleteStream(dctx, b.stream)
	})
	return b, nil
}

// redactURL hides the user information of a URL.
func redactURL(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if i := strings.LastIndex(rest, "@"); ok && i >= 0 {
		return scheme + "://REDACTED" + rest[i:]
	}
	return s
}

func randomTag() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

type tmpDir struct{ path string }

func tempDir() (*tmpDir, error) {
	p, err := os.MkdirTemp("", "outbox-demo-")
	if err != nil {
		return nil, err
	}
	return &tmpDir{path: p}, nil
}

func (d *tmpDir) remove() { _ = os.RemoveAll(d.path) }
