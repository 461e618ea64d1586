// Package childproc starts a server as a child process and waits for it to come up: the
// private PostgreSQL of the bench and WAL tests, and the test suite's NATS and RabbitMQ.
package childproc

import (
	"io"
	"os/exec"
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
