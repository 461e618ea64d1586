// Package testkinesis gives tests an Amazon Kinesis Data Streams API on this machine:
// kinesalite, a Kinesis emulator from the npm registry written in JavaScript, run by
// Node.js as a child process on a free port of 127.0.0.1, its streams in memory. There
// is no AWS here: what passes against kinesalite shows that the client speaks the
// Kinesis API as kinesalite implements it, not that AWS behaves the same.
//
// kinesalite must be installed first (InstallCommand); a missing install fails the test
// with that command, never skips it.
package testkinesis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/outboxkit/outbox/internal/testinfra/nodechild"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

// InstallCommand installs the kinesalite version these tests run against where Dir
// looks for it (scripts/test.sh installs the same with its lockfile).
const InstallCommand = `npm install --prefix "$HOME/.cache/outbox/kinesalite" kinesalite@3.3.3`

// Region is the region of the clients this package makes.
const Region = "us-east-1"

// Dir returns the npm prefix kinesalite is installed under: $OUTBOX_KINESALITE_DIR, or
// $HOME/.cache/outbox/kinesalite where InstallCommand puts it.
func Dir() string {
	if d := os.Getenv("OUTBOX_KINESALITE_DIR"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "outbox", "kinesalite")
}

// launcher starts kinesalite on 127.0.0.1 with streams that become active at once,
// prints the port, and exits when its standard input closes. kinesalite throws from a
// request's error handler when its client resets the connection mid-request (as the
// tests' proxy cuts do), which would end the process: such an error is logged and the
// server goes on; any other uncaught error still ends it.
const launcher = `
process.on("uncaughtException", (err) => {
  if (err && (err.code === "ECONNRESET" || err.message === "aborted")) {
    console.error("kinesalite: a request its client aborted: " + err.message);
    return;
  }
  console.error(err);
  process.exit(1);
});
const kinesalite = require(process.argv[1]);
const server = kinesalite({ createStreamMs: 0, deleteStreamMs: 0, updateStreamMs: 0, shardLimit: 1000 });
server.listen(0, "127.0.0.1", () => console.log("kinesalite port " + server.address().port));
process.stdin.on("end", () => process.exit(0));
process.stdin.on("error", () => process.exit(0));
process.stdin.resume();
`

// Server is a kinesalite child process.
type Server = nodechild.Server

var shared struct {
	once sync.Once
	s    *Server
	err  error
}

// Shared returns the kinesalite that the tests of this test binary share, starting it
// on first use. It lives until the test binary exits. Tests isolate themselves by
// stream (Stream), and cut connections through a proxy of their own.
func Shared(t testing.TB) *Server {
	t.Helper()
	shared.once.Do(func() {
		shared.s, shared.err = nodechild.Start(nodechild.Spec{
			Name:     "kinesalite",
			Module:   filepath.Join(Dir(), "node_modules", "kinesalite", "index.js"),
			Install:  InstallCommand + "\n(or set OUTBOX_KINESALITE_DIR to the npm prefix it is installed under)",
			Launcher: launcher,
			Healthy: func(ctx context.Context, addr string) (any, bool) {
				_, err := Client("http://"+addr).ListStreams(ctx, &kinesis.ListStreamsInput{})
				return err, err == nil
			},
		})
	})
	if shared.err != nil {
		t.Fatalf("testkinesis: %v", shared.err)
	}
	return shared.s
}

// Credentials are the fixed credentials of the clients this package makes; kinesalite
// accepts any signed request.
var Credentials = credentials.NewStaticCredentialsProvider("test", "test", "")

// ConfigOptions returns the options that give config.LoadDefaultConfig this package's
// region and credentials.
func ConfigOptions() []func(*config.LoadOptions) error {
	return []func(*config.LoadOptions) error{config.WithRegion(Region), config.WithCredentialsProvider(Credentials)}
}

// Client returns a Kinesis client for endpoint (a Server's, or a proxy's in front of
// one).
func Client(endpoint string) *kinesis.Client {
	return kinesis.New(kinesis.Options{Region: Region, Credentials: Credentials, BaseEndpoint: aws.String(endpoint)})
}

// Unique returns a unique stream name.
func Unique() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "outbox_test_" + hex.EncodeToString(b[:])
}

// Stream creates a stream with a unique name and shards shards, waits until it is
// active, and returns its name. It is deleted when the test ends.
func Stream(t testing.TB, c *kinesis.Client, shards int32) string {
	t.Helper()
	return NamedStream(t, c, Unique(), shards)
}

// NamedStream is Stream with the name given.
func NamedStream(t testing.TB, c *kinesis.Client, name string, shards int32) string {
	t.Helper()
	ctx := testenv.Context(t)
	if _, err := c.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: aws.String(name), ShardCount: aws.Int32(shards)}); err != nil {
		t.Fatalf("testkinesis: create stream %s: %v", name, err)
	}
	testenv.Await(t, "stream "+name+" to be active", func() (any, bool) {
		out, err := c.DescribeStreamSummary(ctx, &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(name)})
		if err != nil {
			return err, false
		}
		return out.StreamDescriptionSummary.StreamStatus, out.StreamDescriptionSummary.StreamStatus == types.StreamStatusActive
	})
	t.Cleanup(func() {
		_, _ = c.DeleteStream(context.Background(), &kinesis.DeleteStreamInput{StreamName: aws.String(name), EnforceConsumerDeletion: aws.Bool(true)})
	})
	return name
}
