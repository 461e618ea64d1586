// Package testsqs gives tests an Amazon SQS API on this machine: fauxqs, an SQS
// emulator from the npm registry, run by Node.js as a child process on a free port of
// 127.0.0.1. There is no AWS here: what passes against fauxqs shows that the client
// speaks the SQS API as fauxqs implements it, not that AWS behaves the same.
//
// fauxqs must be installed first (InstallCommand); a missing install fails the test
// with that command, never skips it.
package testsqs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/outboxkit/outbox/internal/testinfra/nodechild"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxsqs"
)

// InstallCommand installs the fauxqs version these tests run against where Dir looks
// for it. fauxqs 1.9.2 is the last release that runs on Node.js 20: 2.x needs 22.5 or
// later (node:sqlite), and fails to start on 20. Either works where Node.js allows.
const InstallCommand = `npm install --prefix "$HOME/.cache/outbox/fauxqs" fauxqs@1.9.2`

// Region is the region of the clients this package makes. fauxqs takes it from the
// request's signature.
const Region = "us-east-1"

// Dir returns the npm prefix fauxqs is installed under: $OUTBOX_FAUXQS_DIR, or
// $HOME/.cache/outbox/fauxqs where InstallCommand puts it. The package itself is in
// Dir()/node_modules/fauxqs.
func Dir() string {
	if d := os.Getenv("OUTBOX_FAUXQS_DIR"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "outbox", "fauxqs")
}

// launcher starts fauxqs's app on 127.0.0.1 (its own CLI listens on every interface
// and logs every request), prints the port, and exits when its standard input closes.
const launcher = `
const { buildApp } = await import(process.argv[1]);
const app = buildApp({ logger: false });
await app.listen({ port: 0, host: "127.0.0.1" });
console.log("fauxqs port " + app.server.address().port);
process.stdin.on("end", () => process.exit(0));
process.stdin.on("error", () => process.exit(0));
process.stdin.resume();
`

// Server is a fauxqs child process. Its queues and topics live in memory and die with
// it.
type Server = nodechild.Server

// Start starts a private fauxqs for the test and stops it when the test ends. It fails
// the test when fauxqs is not installed or does not come up.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := start()
	if err != nil {
		t.Fatalf("testsqs: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

var shared struct {
	once sync.Once
	s    *Server
	err  error
}

// Shared returns the fauxqs that the tests of this test binary share, starting it on
// first use. It lives until the test binary exits. Tests isolate themselves by queue
// (Queue), and cut connections through a proxy of their own, never the server.
func Shared(t testing.TB) *Server {
	t.Helper()
	s, err := SharedServer()
	if err != nil {
		t.Fatalf("testsqs: %v", err)
	}
	return s
}

// SharedServer is Shared for examples, which have no testing.TB.
func SharedServer() (*Server, error) {
	shared.once.Do(func() { shared.s, shared.err = start() })
	return shared.s, shared.err
}

func start() (*Server, error) {
	return nodechild.Start(nodechild.Spec{
		Name:     "fauxqs",
		Module:   filepath.Join(Dir(), "node_modules", "fauxqs", "dist", "app.js"),
		Install:  InstallCommand + "\n(or set OUTBOX_FAUXQS_DIR to the npm prefix it is installed under)",
		Launcher: launcher,
		ESM:      true,
		// GET /health answers 200 once fauxqs serves.
		Healthy: func(ctx context.Context, addr string) (any, bool) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/health", nil)
			if err != nil {
				return err, false
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err, false
			}
			_ = resp.Body.Close()
			return resp.Status, resp.StatusCode == http.StatusOK
		},
		ExitHint: func(stderr string) string {
			if strings.Contains(stderr, "node:sqlite") {
				return " (this fauxqs needs a newer Node.js; install the last release for Node.js 20 with: " + InstallCommand + ")"
			}
			return ""
		},
	})
}

// Credentials are the fixed credentials of the clients this package makes; fauxqs
// accepts any.
var Credentials = credentials.NewStaticCredentialsProvider("test", "test", "")

// ConfigOptions returns the options that point config.LoadDefaultConfig at fauxqs
// without touching the machine's AWS configuration or the instance metadata service:
// fixed credentials and Region.
func ConfigOptions() []func(*config.LoadOptions) error {
	return []func(*config.LoadOptions) error{
		config.WithRegion(Region),
		config.WithCredentialsProvider(Credentials),
	}
}

// Client returns an SQS client for endpoint (Endpoint of a Server, or a proxy in front
// of one), with outboxsqs.BufferRequests as a publisher's users should have it.
func Client(endpoint string) *sqs.Client {
	return sqs.New(sqs.Options{
		Region:       Region,
		Credentials:  Credentials,
		BaseEndpoint: aws.String(endpoint),
	}, func(o *sqs.Options) { o.HTTPClient = outboxsqs.BufferRequests(o.HTTPClient) })
}

// Queue creates a queue with a unique name (FIFO when fifo is set, with the "fifo"
// suffix) and the given attributes, and returns its name and URL. It is deleted when
// the test ends.
func Queue(t testing.TB, c *sqs.Client, fifo bool, attrs map[string]string) (name, url string) {
	t.Helper()
	name = Unique()
	a := map[string]string{}
	for k, v := range attrs {
		a[k] = v
	}
	if fifo {
		name += ".fifo"
		a["FifoQueue"] = "true"
	}
	out, err := c.CreateQueue(testenv.Context(t), &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: a})
	if err != nil {
		t.Fatalf("testsqs: create queue %s: %v", name, err)
	}
	url = aws.ToString(out.QueueUrl)
	t.Cleanup(func() {
		if _, err := c.DeleteQueue(testenv.Context(t), &sqs.DeleteQueueInput{QueueUrl: aws.String(url)}); err != nil {
			t.Logf("testsqs: delete queue %s: %v", name, err)
		}
	})
	return name, url
}

// Unique returns a fresh queue name.
func Unique() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "outbox_test_" + hex.EncodeToString(b[:])
}
