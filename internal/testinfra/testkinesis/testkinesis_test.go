package testkinesis

import (
	"net"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/kinesis"

	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

// A client that resets its connection in the middle of a request, as the tests' proxy
// cuts do, does not end kinesalite (which throws from the request's error handler).
func TestSurvivesAbortedRequest(t *testing.T) {
	srv := Shared(t)
	for range 3 {
		c, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("POST / HTTP/1.1\r\nHost: kinesis\r\nContent-Type: application/x-amz-json-1.1\r\nContent-Length: 1000\r\n\r\n{\"Strea")); err != nil {
			t.Fatal(err)
		}
		_ = c.(*net.TCPConn).SetLinger(0) // close with a reset
		_ = c.Close()
	}
	testenv.Await(t, "kinesalite to answer after the aborted requests", func() (any, bool) {
		if srv.Exited() {
			t.Fatalf("kinesalite exited; its standard error:\n%s", srv.Stderr())
		}
		ctx, cancel := testenv.CallContext()
		defer cancel()
		_, err := Client(srv.Endpoint()).ListStreams(ctx, &kinesis.ListStreamsInput{})
		return err, err == nil
	})
	if srv.Exited() {
		t.Fatalf("kinesalite exited; its standard error:\n%s", srv.Stderr())
	}
}
