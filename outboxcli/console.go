package outboxcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/outboxkit/outbox/internal/console"
)

// consoleAddrDefault is where `outbox console` listens unless told otherwise: loopback,
// which needs no token.
const consoleAddrDefault = "127.0.0.1:8080"

// consoleShutdownGrace is how long a stopping console waits for requests under way.
const consoleShutdownGrace = 5 * time.Second

var consoleCommand = &command{
	name:    "console",
	summary: "Serve the web console (overview, dead letters) without a relay",
	help: `Serves the web console on --http-addr until SIGTERM or SIGINT: an overview of the
outbox (backlog, throughput, oldest pending age, topics, relays and their leases) and its
dead letters, with filters, a detail view, and replay and purge behind a confirmation
step. 'outbox relay --http-addr' serves the same console from a relay.

Without --http-token the console listens on loopback only and answers only requests from
this machine (reach it from elsewhere through an SSH tunnel: ssh -L 8080:127.0.0.1:8080
HOST). Any other address needs --http-token or --http-token-file: the console asks for the
token on a login page, or takes it as "Authorization: Bearer TOKEN". The token travels
with every request, so put TLS in front of the console (a reverse proxy) beyond a
trusted network.`,
	setup: func(fs *flag.FlagSet) runFunc {
		db := addDBFlags(fs, true)
		c := addConsoleFlags(fs, consoleAddrDefault)
		logFormat := fs.String("log-format", "text", "log `format`: text or json")
		logLevel := fs.String("log-level", "info", "log `level`: debug, info, warn or error")
		return func(ctx context.Context, inv *invocation, args []string) error {
			if err := noArgs(args); err != nil {
				return err
			}
			log, err := newLogger(inv.stderr, *logFormat, *logLevel)
			if err != nil {
				return err
			}
			if c.addr == "" {
				return usageErrorf("--http-addr: give the address to serve the console on, e.g. %s", consoleAddrDefault)
			}
			if err := c.check(ctx, inv); err != nil {
				return err
			}
			drv, err := db.openMigrated(ctx, "outbox console")
			if err != nil {
				return err
			}
			defer drv.close()
			stop, err := c.start(ctx, inv, console.Config{Admin: drv}, log)
			if err != nil {
				return err
			}
			<-ctx.Done()
			stop()
			log.Info("web console stopped")
			return nil
		}
	},
}

// consoleFlags are the flags of the web console, shared by `outbox console` and
// `outbox relay`.
type consoleFlags struct {
	addr, token, tokenFile string
	checked                bool
}

// addConsoleFlags defines --http-addr (defaulting to defaultAddr; empty serves no
// console), --http-token and --http-token-file.
func addConsoleFlags(fs *flag.FlagSet, defaultAddr string) *consoleFlags {
	c := &consoleFlags{}
	fs.StringVar(&c.addr, "http-addr", defaultAddr,
		"serve the web console (overview, dead letters with replay and purge) on this `host:port`;\n"+
			"empty serves none. An address beyond loopback needs --http-token")
	fs.StringVar(&c.token, "http-token", "",
		fmt.Sprintf("`token` the web console requires (at least %d characters; openssl rand -hex 32 makes one),\n", console.MinTokenLen)+
			"typed into its login page or sent as \"Authorization: Bearer TOKEN\"")
	fs.StringVar(&c.tokenFile, "http-token-file", "", "`file` holding the web console's token (like --http-token)")
	return c
}

// check validates the flags without listening: one token source, its length, and the
// loopback rule. It reads --http-token-file and keeps the token out of all output. It
// is cheap to call again.
func (c *consoleFlags) check(ctx context.Context, inv *invocation) error {
	if c.checked || c.addr == "" {
		return nil
	}
	if err := checkListenAddr("http-addr", c.addr); err != nil {
		return err
	}
	switch {
	case c.token != "" && c.tokenFile != "":
		return usageErrorf("--http-token and --http-token-file: give one")
	case c.tokenFile != "":
		raw, err := os.ReadFile(c.tokenFile)
		if err != nil {
			return usageErrorf("--http-token-file: %v", err)
		}
		c.token = strings.TrimRight(string(raw), "\r\n")
		if c.token == "" {
			return usageErrorf("--http-token-file: %s is empty", c.tokenFile)
		}
		inv.secrets.addOpaque("http-token", c.token)
	}
	if c.token != "" && len(c.token) < console.MinTokenLen {
		return usageErrorf("--http-token: must be at least %d characters, not %d (openssl rand -hex 32 makes a good one)", console.MinTokenLen, len(c.token))
	}
	if err := console.CheckAddr(ctx, c.addr, c.token); err != nil {
		if errors.Is(err, console.ErrTokenRequired) {
			return usageErrorf("--http-addr %s is beyond loopback (%v), and the console replays and purges dead letters: "+
				"set --http-token or --http-token-file, or listen on 127.0.0.1 and reach the console through an SSH tunnel",
				c.addr, strings.TrimPrefix(err.Error(), console.ErrTokenRequired.Error()+": "))
		}
		return usageErrorf("--http-addr: %v", err)
	}
	c.checked = true
	return nil
}

// handler returns the console of what cfg says (Admin, and RelayStats and RelayID when a
// relay serves it; or a fleet's Outboxes), with the flags' token, log and scrubber.
func (c *consoleFlags) handler(ctx context.Context, inv *invocation, cfg console.Config, log *slog.Logger) (*console.Handler, error) {
	if err := c.check(ctx, inv); err != nil {
		return nil, err
	}
	cfg.Token, cfg.Logger, cfg.Scrub = c.token, log, inv.secrets.scrub
	h, err := console.New(cfg)
	if err != nil {
		return nil, flagError(err, map[string]string{"Token": "http-token"})
	}
	return h, nil
}

// start serves the console on --http-addr in the background and returns the function
// that stops it, waiting up to consoleShutdownGrace for requests under way. With an empty
// --http-addr it serves nothing and stop does nothing.
func (c *consoleFlags) start(ctx context.Context, inv *invocation, cfg console.Config, log *slog.Logger) (stop func(), err error) {
	if c.addr == "" {
		return func() {}, nil
	}
	h, err := c.handler(ctx, inv, cfg, log)
	if err != nil {
		return nil, err
	}
	ln, err := console.Listen(ctx, c.addr, c.token)
	if err != nil {
		return nil, fmt.Errorf("--http-addr: %w", err)
	}
	srv := newServer(h, log)
	sampling, stopSampling := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() {
		defer func() { done <- struct{}{} }()
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("web console stopped serving", "err", err)
		}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		h.Sample(sampling)
	}()
	log.Info("web console listening", "url", "http://"+ln.Addr().String()+"/", "token_required", c.token != "")
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), consoleShutdownGrace)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			srv.Close()
		}
		stopSampling()
		<-done
		<-done
	}, nil
}
