// Package childproc starts a server as a child process and waits for it to come up: the
// private PostgreSQL of the bench and WAL tests, and the test suite's NATS and RabbitMQ.
package childproc

import (
	"io"
	"os/exec"
	"syscall"
	"time"
)

// Start starts cmd, whose output goes to log, and returns a channel closed once the
// process has exited and log is closed. When cmd cannot start, log is closed and the
// error returned.
func Start(cmd *exec.Cmd, log io.Closer) (done <-chan struct{}, err error) {
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return nil, err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = log.Close()
		close(exited)
	}()
	return exited, nil
}

// Ready calls ready with done, and when it fails kills the process and waits until it
// has exited before returning ready's error.
func Ready(cmd *exec.Cmd, done <-chan struct{}, ready func(exited <-chan struct{}) error) error {
	if err := ready(done); err != nil {
		_ = cmd.Process.Kill()
		<-done
		return err
	}
	return nil
}

// Stop sends sig to the process and waits until it has exited. With a grace period, it
// kills the process if it has not exited by then, and reports that it did.
func Stop(cmd *exec.Cmd, done <-chan struct{}, sig syscall.Signal, grace time.Duration) (killed bool) {
	_ = cmd.Process.Signal(sig)
	if grace > 0 {
		select {
		case <-done:
		case <-time.After(grace):
			_ = cmd.Process.Kill()
			killed = true
		}
	}
	<-done
	return killed
}
