package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
)

// FreePort returns a TCP port of 127.0.0.1 that nothing listens on at the moment, for a
// private server to take.
func FreePort(t TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// WaitReady polls ping until it succeeds. It gives up when exited closes (the server's
// process is gone), or when ping's error, together with what more reports (the size of a
// log the server writes as it boots; more may be nil), has not changed for Stall(): a start
// that is slow on a loaded machine is waited for, a stuck one is reported with its last
// error. what names what is awaited, for the error.
func WaitReady(exited <-chan struct{}, what string, ping func() error, more func() any) error {
	var exit error
	err := Progress(context.Background(), what, Stall(), func() (any, bool) {
		select {
		case <-exited:
			exit = errors.New("the process exited")
			return nil, true
		default:
		}
		err := ping()
		if more != nil {
			return fmt.Sprintf("%v (%v)", err, more()), err == nil
		}
		return err, err == nil
	})
	if err != nil {
		return err
	}
	return exit
}

// LogTail returns the last n bytes of the log file at path, or why it cannot be read, for
// the failure message of a server that did not come up.
func LogTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
