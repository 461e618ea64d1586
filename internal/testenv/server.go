package testenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"
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

// WaitReady calls ping every interval until it succeeds, and fails when exited closes
// first (the server's process is gone) or timeout passes, with ping's last error.
func WaitReady(exited <-chan struct{}, timeout, interval time.Duration, ping func() error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("the process exited")
		default:
		}
		if last = ping(); last == nil {
			return nil
		}
		time.Sleep(interval)
	}
	return fmt.Errorf("still not ready after %v: %w", timeout, last)
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
