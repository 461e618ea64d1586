package chaos

import (
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/testpg"
	"github.com/outboxkit/outbox/internal/torture/nemesis"
)

// KindPGRestart is an immediate restart of the run's private PostgreSQL server
// (Config.PrivatePostgres): every session is cut mid-statement, COMMITs in flight get no
// answer, and the server replays its WAL before it accepts connections again.
const KindPGRestart = "pg-restart"

// pgRestart stops the server with pg_ctl stop -m immediate, holds it down for 0.5–3 s,
// and starts it again. The heal returns once the server accepts connections, and resets
// pool (the run's own pool) so that the run's next query does not take a connection
// that died with the server.
func pgRestart(srv *testpg.Server, pool *pgxpool.Pool) nemesis.Fault {
	return nemesis.Fault{Kind: KindPGRestart, MinHold: 500 * time.Millisecond, MaxHold: 3 * time.Second,
		Inject: func(*rand.Rand) (string, func() error, error) {
			srv.Stop(testpg.Immediate)
			return "postgres " + srv.Addr(), func() error {
				srv.Start()
				pool.Reset()
				return nil
			}, nil
		}}
}
