package outboxpgx

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// onLiveConn runs op, again at once each time it failed because its connection had been
// closed by the server (a terminated session, a server that restarted) or by the network:
// the pool then drops that connection, and the next attempt takes another one. It makes
// at most as many attempts as the pool has connections, plus one, so that the idle
// connections a server restart or a pg_terminate_backend left dead cost no backoff each;
// a server that refuses new connections ends the loop with its error at once. op must be
// safe to repeat: a read, or a statement whose effect the relay would record again anyway
// when it got an error.
func onLiveConn[T any](ctx context.Context, pool *pgxpool.Pool, op func() (T, error)) (T, error) {
	attempts := int(pool.Stat().MaxConns()) + 1
	for {
		v, err := op()
		attempts--
		if err == nil || attempts == 0 || ctx.Err() != nil || !connLost(err) {
			return v, err
		}
	}
}

// connLost reports whether err says that the connection a statement used was gone: the
// server ended the session (admin_shutdown, crash_shutdown), the socket was closed or
// reset, or the stall watch closed it (errSilent). A refused connection attempt is not among them: the server is down, and trying
// again at once would not help.
func connLost(err error) bool {
	if errors.Is(err, errSilent) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "57P01" || pgErr.Code == "57P02"
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return false
	}
	var opErr *net.OpError
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, net.ErrClosed) || (errors.As(err, &opErr) && opErr.Op == "read")
}
