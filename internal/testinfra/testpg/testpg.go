// Package testpg gives tests a private PostgreSQL server (package pgserver): a cluster of
// its own in a temporary directory, on a free port of 127.0.0.1, that a test may stop (as
// an operator or a crash would) and start again. Tests that take PostgreSQL down use it,
// never the shared server, which other packages' tests use concurrently. A missing
// PostgreSQL installation fails the test, never skips it.
//
// A test that needs other server settings passes them to StartServer, as postgres -c
// takes them: StartServer(t, "wal_level=logical") for logical replication, which the
// shared server's settings (wal_level=replica) do not allow.
package testpg

import (
	"github.com/outboxkit/outbox/internal/pgserver"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
)

// Database is the database every server has, besides postgres and the templates.
const Database = pgserver.Database

// A StopMode is how Stop shuts the server down: pg_ctl's -m.
type StopMode = pgserver.StopMode

const (
	Fast      = pgserver.Fast      // disconnects the clients, rolls back and checkpoints
	Immediate = pgserver.Immediate // kills every server process at once, as a crash would
)

// Server is a private PostgreSQL server of a test: stopped and removed when the test
// ends. Its methods fail the test on an error.
type Server struct {
	*pgserver.Server
	t testenv.TB
}

// StartServer creates a cluster, starts it, creates the Database and waits until it
// accepts connections (pgserver.Start, with testenv.Stall as its stall bound). It fails
// the test if PostgreSQL is not installed or the server does not come up.
//
// settings are extra server settings, each "name=value" as postgres -c takes it
// ("wal_level=logical", "max_replication_slots=2"); they apply at every start, restarts
// included, and beat the defaults. A setting PostgreSQL does not know or accept fails
// the start, with the server log.
func StartServer(t testenv.TB, settings ...string) *Server {
	t.Helper()
	s, err := pgserver.Start(pgserver.Options{Settings: settings, Stall: testenv.Stall()})
	if err != nil {
		t.Fatalf("testpg: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Logf("testpg: %v", err)
		}
	})
	return &Server{Server: s, t: t}
}

// Start starts the server again and waits until it accepts connections (pgserver's
// Start).
func (s *Server) Start() {
	s.t.Helper()
	if err := s.Server.Start(); err != nil {
		s.t.Fatalf("testpg: %v", err)
	}
}

// Stop shuts the server down with pg_ctl stop -m mode (pgserver's Stop).
func (s *Server) Stop(mode StopMode) {
	s.t.Helper()
	if err := s.Server.Stop(mode); err != nil {
		s.t.Fatalf("testpg: %v", err)
	}
}

// Restart stops the server with mode and starts it again.
func (s *Server) Restart(mode StopMode) {
	s.t.Helper()
	s.Stop(mode)
	s.Start()
}
