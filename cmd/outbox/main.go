// Command outbox runs the outbox relay as a daemon and operates an outbox: schema
// migrations, status, dead letters, the web console, the demo and the benchmark. It is
// package outboxcli with a signal handler; `outbox help` lists the commands.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/outboxkit/outbox/outboxcli"
)

// version is set at build time: go build -ldflags "-X main.version=v1.2.3".
var version string

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// After the first signal, a second one kills the process the default way,
		// for an operator whose graceful stop takes too long.
		<-ctx.Done()
		stop()
	}()
	outboxcli.Version = version
	code := outboxcli.Main(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
