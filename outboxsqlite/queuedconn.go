package outboxsqlite

import (
	"context"
	"database/sql/driver"
	"io"
	"sync"
)

// queuedConnector opens the connections of a pool from Open: modernc.org/sqlite
// connections whose read-write transactions take a turn in the file's writeQueue before
// they begin.
type queuedConnector struct {
	base driver.Connector
	// q and drop are set by Open once the file exists, before the pool is handed out.
	q    *writeQueue
	drop func()
}

var _ io.Closer = (*queuedConnector)(nil)

func (c *queuedConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.base.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &queuedConn{Conn: conn, c: c}, nil
}

// Driver returns modernc.org/sqlite's driver, as a pool opened with sql.Open("sqlite")
// would report.
func (c *queuedConnector) Driver() driver.Driver { return c.base.Driver() }

// Close drops the pool's reference to the file's queue; database/sql calls it from
// DB.Close.
func (c *queuedConnector) Close() error {
	if c.drop != nil {
		c.drop()
	}
	return nil
}

// queuedConn is one connection of a pool from Open. Its read-write transactions
// (BeginTx without ReadOnly) wait for their turn in the file's queue, then begin
// IMMEDIATE (the DSN's _txlock), and give the turn back once COMMIT or ROLLBACK
// returned. Everything else goes straight to the modernc.org/sqlite connection.
type queuedConn struct {
	driver.Conn
	c *queuedConnector

	mu   sync.Mutex
	turn *heldTurn // the turn this connection holds, if any
}

var (
	_ driver.ConnBeginTx        = (*queuedConn)(nil)
	_ driver.ConnPrepareContext = (*queuedConn)(nil)
	_ driver.ExecerContext      = (*queuedConn)(nil)
	_ driver.QueryerContext     = (*queuedConn)(nil)
	_ driver.Pinger             = (*queuedConn)(nil)
	_ driver.SessionResetter    = (*queuedConn)(nil)
	_ driver.Validator          = (*queuedConn)(nil)
)

// heldTurn is a turn in the queue, given back exactly once.
type heldTurn struct {
	once sync.Once
	q    *writeQueue
}

func (h *heldTurn) giveBack() { h.once.Do(h.q.release) }

// Unwrap returns the modernc.org/sqlite connection, for code that reaches it through
// (*sql.Conn).Raw (backups, hooks, file controls).
func (c *queuedConn) Unwrap() driver.Conn { return c.Conn }

// takeTurn waits for this connection's turn at the write lock.
func (c *queuedConn) takeTurn(ctx context.Context) error {
	if c.c.q == nil {
		return nil // Open's own statements, before the queue is attached
	}
	if err := c.c.q.acquire(ctx, BusyTimeout); err != nil {
		return err
	}
	c.mu.Lock()
	c.turn = &heldTurn{q: c.c.q}
	c.mu.Unlock()
	return nil
}

// giveTurnBack releases the turn this connection holds, if any.
func (c *queuedConn) giveTurnBack() {
	c.mu.Lock()
	t := c.turn
	c.turn = nil
	c.mu.Unlock()
	if t != nil {
		t.giveBack()
	}
}

func (c *queuedConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	begin := c.Conn.(driver.ConnBeginTx)
	if opts.ReadOnly {
		return begin.BeginTx(ctx, opts) // deferred, in parallel with the writer
	}
	if err := c.takeTurn(ctx); err != nil {
		return nil, err
	}
	tx, err := begin.BeginTx(ctx, opts)
	if err != nil {
		c.giveTurnBack()
		return nil, err
	}
	return &queuedTx{Tx: tx, conn: c}, nil
}

// Begin is BeginTx with a background context; database/sql calls BeginTx.
func (c *queuedConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

// Close gives back a turn still held (a connection database/sql discards in the middle
// of a transaction), then closes the connection, which ends its transaction.
func (c *queuedConn) Close() error {
	err := c.Conn.Close()
	c.giveTurnBack()
	return err
}

func (c *queuedConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
}

func (c *queuedConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
}

func (c *queuedConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
}

func (c *queuedConn) Ping(ctx context.Context) error { return c.Conn.(driver.Pinger).Ping(ctx) }

func (c *queuedConn) ResetSession(ctx context.Context) error {
	return c.Conn.(driver.SessionResetter).ResetSession(ctx)
}

func (c *queuedConn) IsValid() bool { return c.Conn.(driver.Validator).IsValid() }

// queuedTx gives the connection's turn back once the transaction ended. database/sql
// calls Commit or Rollback exactly once per transaction: Rollback from its own goroutine
// when the BeginTx context ends first, and Rollback when Commit finds that context done.
type queuedTx struct {
	driver.Tx
	conn *queuedConn
}

func (t *queuedTx) Commit() error {
	defer t.conn.giveTurnBack()
	return t.Tx.Commit()
}

func (t *queuedTx) Rollback() error {
	defer t.conn.giveTurnBack()
	return t.Tx.Rollback()
}
