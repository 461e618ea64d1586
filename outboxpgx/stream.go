package outboxpgx

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/broken"
	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/outboxdriver"
)

// This file is the WAL relay mode's reader (docs/design-wal.md, §§0-2): it follows the
// slot that `outbox wal setup` made, over a logical replication connection of its own,
// and tells the relay which outbox seqs each transaction inserted, in commit order. It
// never moves the slot by itself: the slot's position is only what the relay
// acknowledges.

var _ outboxdriver.Streamer = (*Driver)(nil)

// StreamTxnSeqsMax is the most seqs a StreamTxn of this driver carries: a transaction
// that inserted more into the outbox (a bulk load, or a large move of the pending ring)
// is reported Bulk, with its range only, so that one transaction cannot hold the relay's
// memory.
const StreamTxnSeqsMax = 1_000_000

// StreamStatusIntervalDefault is StreamRequest.StatusInterval's default.
const StreamStatusIntervalDefault = 10 * time.Second

const (
	// streamBatchTxns is the most transactions one emit carries. A batch is emitted as
	// soon as nothing more has arrived from the server, so it grows only while the relay
	// reads slower than the server sends.
	streamBatchTxns = 1_000
	// streamWriteTimeout bounds a status update's write: nothing else would end a write
	// to a server that stopped reading.
	streamWriteTimeout = 10 * time.Second
	// streamCloseTimeout bounds saying goodbye to the server when Stream returns.
	streamCloseTimeout = 5 * time.Second
	// streamMinMajor is the oldest PostgreSQL WAL mode runs on.
	streamMinMajor = 14
)

// Stream implements outboxdriver.Streamer with PostgreSQL's logical replication
// (pgoutput, protocol version 1, through the pglogrepl package). It opens a replication
// connection of its own with the pool's connection settings (its BeforeConnect hook
// included) and req.RelayID as the application name unless the pool sets one, starts
// reading req.Slot at the slot's confirmed position (START_REPLICATION at 0/0, never
// anywhere else) with req.Publication, and calls emit with what committed.
//
// Stream asks for columns in binary (PostgreSQL 14 and later) and decodes the seq column
// of the inserts into the outbox table (named by the publication's partition root, so
// every bucket of the pending ring), and with req.Rows the whole rows (StreamTxn.Rows,
// within StreamTxnRowBytesMax and StreamBatchRowBytesMax), each transaction's end
// position, keepalives, and heartbeat messages (prefix "outbox.hb"). A transaction
// that inserted nothing into the outbox is not emitted; one that inserted more than
// StreamTxnSeqsMax seqs is emitted Bulk. A batch is emitted once nothing more is waiting
// on the connection, or at 1,000 transactions; its Idle is past every transaction of the
// batch.
//
// The slot's written, flushed and applied positions are set only by status updates,
// and a status update carries only the latest ack received on req.Acks, only while that
// ack's Until is in the future: it is sent when a new ack arrives, again every
// req.StatusInterval, and when the server asks for a reply. With no valid ack, Stream
// sends nothing at all, and the server ends the connection after its
// wal_sender_timeout (a StreamTransient error). An ack of LSN 0 confirms nothing (the
// server ignores a zero position) but counts as a reply: a relay that has nothing to
// acknowledge yet keeps the connection with it.
//
// emit runs on Stream's goroutine, so no status update goes out while it runs: it must
// hand the batch over and return well within wal_sender_timeout.
//
// Stream returns nil once ctx is done, else a *outboxdriver.StreamError (invalid slot or
// publication names, a negative StatusInterval, and a Driver without a pool are
// reported as they are, before anything is tried).
func (d *Driver) Stream(ctx context.Context, req outboxdriver.StreamRequest, emit func(outboxdriver.StreamBatch)) error {
	if err := d.needPool(); err != nil {
		return err
	}
	if req.Slot == "" || req.Publication == "" {
		slot, pub := d.names.WALDefaults()
		req.Slot, req.Publication = cmp.Or(req.Slot, slot), cmp.Or(req.Publication, pub)
	}
	if err := pgsql.CheckWALName("Slot", req.Slot); err != nil {
		return err
	}
	if err := pgsql.CheckWALName("Publication", req.Publication); err != nil {
		return err
	}
	if req.StatusInterval < 0 {
		return &outbox.ConfigError{Field: "StatusInterval", Reason: fmt.Sprintf("%s is negative", req.StatusInterval)}
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := d.slotRecorded(ctx, req.Slot); err != nil {
		return err
	}
	cfg, err := d.replicationConfig(ctx, req.RelayID)
	if err != nil {
		return streamFailed(ctx, fmt.Errorf("prepare the replication connection: %w", err))
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return streamFailed(ctx, fmt.Errorf("connect for replication: %w", err))
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), streamCloseTimeout)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if v := conn.ParameterStatus("server_version"); serverMajor(v) < streamMinMajor {
		return &outboxdriver.StreamError{Reason: outboxdriver.StreamVersion,
			Err: fmt.Errorf("WAL mode needs PostgreSQL %d or later; this server runs %s", streamMinMajor, v)}
	}
	// From 0/0: the slot's confirmed position. (The canary starts at the server's
	// current position instead.)
	var from pglogrepl.LSN
	if broken.Has(broken.WALStartAtCurrent) {
		if sys, err := pglogrepl.IdentifySystem(ctx, conn); err == nil {
			from = sys.XLogPos
		}
	}
	start := func() error {
		return pglogrepl.StartReplication(ctx, conn, req.Slot, from, pglogrepl.StartReplicationOptions{PluginArgs: []string{
			"proto_version '1'", "publication_names '" + req.Publication + "'", "messages 'true'", "binary 'true'"}})
	}
	err = start()
	if pgsql.SQLState(err) == "55006" && req.Token != 0 {
		// Another session still reads the slot: a reader whose lease expired while it
		// was paused keeps it until wal_sender_timeout. End it, fenced by our lease.
		var ended bool
		if terr := d.pool.QueryRow(ctx, d.names.WALTerminateReader(), req.Slot, req.RelayID, req.Token).Scan(&ended); terr != nil {
			return streamFailed(ctx, fmt.Errorf("end the session that reads replication slot %q: %w", req.Slot, terr))
		}
		if ended {
			err = start()
		}
	}
	if err != nil {
		return streamFailed(ctx, fmt.Errorf("start reading replication slot %q: %w", req.Slot, err))
	}
	if req.Started != nil {
		req.Started()
	}
	schema, table := d.names.OutboxRelation()
	s := &walStream{conn: conn, emit: emit, interval: req.StatusInterval, dec: newWALDecoder(schema, table, StreamTxnSeqsMax, req.Rows)}
	if s.interval == 0 {
		s.interval = StreamStatusIntervalDefault
	}
	stop := s.acks.watch(req.Acks)
	defer stop()
	if err := s.run(ctx); err != nil {
		return streamFailed(ctx, fmt.Errorf("read replication slot %q: %w", req.Slot, err))
	}
	return nil
}

// RecordStreamState implements outboxdriver.Streamer: the state and its reason in the
// slot's row of outbox_wal, which 'outbox wal status' shows.
func (d *Driver) RecordStreamState(ctx context.Context, req outboxdriver.StreamRequest, state outboxdriver.StreamState, reason outboxdriver.StreamReason) error {
	if err := d.needPool(); err != nil {
		return err
	}
	_, err := d.pool.Exec(ctx, d.names.WALRecordState(), d.names.WALSlot(req.Slot), string(state), string(reason), req.RelayID, req.Token)
	return err
}

// RecreateSlot implements outboxdriver.SlotRecreator: the slot is made anew (a lost one
// dropped first) if the relay holds its lease under req.Token; creating it waits up to
// pgsql.WALSlotTimeoutDefault for the transactions open when it starts.
func (d *Driver) RecreateSlot(ctx context.Context, req outboxdriver.StreamRequest) (bool, error) {
	if err := d.needPool(); err != nil {
		return false, err
	}
	return d.names.WALRecreateSlot(ctx, d.inTx, d.names.WALSlot(req.Slot), req.RelayID, req.Token, pgsql.WALSlotTimeoutDefault)
}

var _ outboxdriver.SlotRecreator = (*Driver)(nil)

// slotRecorded checks that setup recorded the slot in outbox_wal: 'outbox wal drop'
// deletes the row first, so that a relay it terminated does not take the slot again
// before it is dropped.
func (d *Driver) slotRecorded(ctx context.Context, slot string) error {
	var level string
	if err := d.pool.QueryRow(ctx, "SELECT current_setting('wal_level')").Scan(&level); err != nil {
		return streamFailed(ctx, fmt.Errorf("read wal_level: %w", err))
	}
	if level != "logical" {
		return &outboxdriver.StreamError{Reason: outboxdriver.StreamWALLevel,
			Err: fmt.Errorf("wal_level is %q; WAL mode needs \"logical\": ALTER SYSTEM SET wal_level = logical and restart PostgreSQL", level)}
	}
	var ok bool
	err := d.pool.QueryRow(ctx, d.names.WALSlotRecorded(), slot).Scan(&ok)
	switch {
	case err != nil && pgsql.SQLState(err) == "42P01": // undefined_table: before migration 5
		return &outboxdriver.StreamError{Reason: outboxdriver.StreamSlotMissing,
			Err: fmt.Errorf("the outbox lacks schema version 5 (005_wal), which records the slot: run 'outbox migrate up' and 'outbox wal setup': %w", err)}
	case err != nil:
		return streamFailed(ctx, fmt.Errorf("look up slot %q in outbox_wal: %w", slot, err))
	case !ok:
		return &outboxdriver.StreamError{Reason: outboxdriver.StreamSlotMissing,
			Err: fmt.Errorf("slot %q is not recorded in outbox_wal (never set up, or being dropped): run 'outbox wal setup'", slot)}
	}
	return nil
}

// replicationConfig returns the pool's connection settings for a logical replication
// connection.
func (d *Driver) replicationConfig(ctx context.Context, relayID string) (*pgconn.Config, error) {
	pc := d.pool.Config() // a deep copy: changing it leaves the pool alone
	cc := pc.ConnConfig
	if pc.BeforeConnect != nil { // rotating passwords, cloud IAM tokens
		if err := pc.BeforeConnect(ctx, cc); err != nil {
			return nil, err
		}
	}
	cfg := &cc.Config
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["replication"] = "database"
	if cfg.RuntimeParams["application_name"] == "" && relayID != "" {
		cfg.RuntimeParams["application_name"] = "outbox relay " + relayID // shown by pg_stat_replication
	}
	// A wait for the server is ended by a deadline on the socket, which leaves the
	// connection usable. A cancel request, which a pool may be configured to send,
	// would end the replication itself.
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	return cfg, nil
}

// serverMajor returns the major version of a server_version ("15.4 (Debian 15.4-1)"),
// or a large number when it cannot tell, leaving the verdict to the server.
func serverMajor(version string) int {
	digits := version[:len(version)-len(strings.TrimLeft(version, "0123456789"))]
	v, err := strconv.Atoi(digits)
	if err != nil {
		return 1 << 30
	}
	return v
}

// streamFailed is the error Stream returns for err: nil once ctx is done (the stream
// was stopped, whatever broke on the way), else a StreamError with err's reason.
func streamFailed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return &outboxdriver.StreamError{Reason: streamReason(err), Err: err}
}

// streamReason classifies a replication error by PostgreSQL's SQLSTATE and message
// (docs/design-wal.md, §5). The messages differ between versions (14 to 18), hence the
// several spellings. Anything not recognized, a lost connection included, is transient.
func streamReason(err error) outboxdriver.StreamReason {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return outboxdriver.StreamTransient
	}
	msg := pe.Message
	switch pe.Code {
	case "55000": // object_not_in_prerequisite_state
		switch {
		case strings.Contains(msg, "wal_level"): // logical decoding requires wal_level >= logical
			return outboxdriver.StreamWALLevel
		case strings.Contains(msg, "cannot read from logical replication slot"), // 14, 15
			strings.Contains(msg, "can no longer get changes from replication slot"), // 16 and later
			strings.Contains(pe.Detail, "invalidated"):
			return outboxdriver.StreamSlotLost
		}
	case "42501": // insufficient_privilege: no REPLICATION attribute
		return outboxdriver.StreamPrivilege
	case "42704": // undefined_object
		switch {
		case strings.HasPrefix(msg, "replication slot"):
			return outboxdriver.StreamSlotMissing
		case strings.HasPrefix(msg, "publication"):
			return outboxdriver.StreamPublication
		}
	case "55006": // object_in_use: replication slot "x" is active for PID n
		return outboxdriver.StreamSlotActive
	}
	return outboxdriver.StreamTransient
}

// walStream is one Stream call's connection and state. It is used by Stream's goroutine
// only, but for acks, which a goroutine of their own passes in.
type walStream struct {
	conn     *pgconn.PgConn
	emit     func(outboxdriver.StreamBatch)
	interval time.Duration
	dec      walDecoder
	acks     ackBox

	ack     outboxdriver.StreamAck // the latest ack; zero until one arrives
	changed bool                   // ack has not been sent since it arrived
	sentAt  time.Time              // when the last status update went out
}

// run reads the stream until it fails (a server error, a lost connection, a message it
// cannot decode) or ctx is done.
func (s *walStream) run(ctx context.Context) error {
	for {
		if err := s.status(false); err != nil {
			return err
		}
		msg, err := s.receive(ctx)
		if err != nil {
			return err
		}
		if msg == nil { // woken to send a status update
			continue
		}
		if err := s.handle(msg); err != nil {
			return err
		}
		// Whatever is already on the connection joins the batch: a backlog is read in
		// batches of many commits, a trickle one commit at a time.
		if s.dec.pending() && (len(s.dec.out.Txns) >= streamBatchTxns || s.conn.Frontend().ReadBufferLen() == 0) {
			s.emit(s.dec.take())
		}
	}
}

// receive waits for the server's next message. It returns nil, and no error, when it is
// time to send a status update instead: a new ack arrived, or the current one is due
// again.
func (s *walStream) receive(ctx context.Context) (pgproto3.BackendMessage, error) {
	var wctx context.Context
	var cancel context.CancelFunc
	if s.valid(time.Now()) {
		wctx, cancel = context.WithDeadline(ctx, s.sentAt.Add(s.interval))
	} else {
		wctx, cancel = context.WithCancel(ctx) // nothing to send until an ack arrives
	}
	defer cancel()
	if !s.acks.sleep(cancel) {
		return nil, nil // an ack arrived meanwhile
	}
	msg, err := s.conn.ReceiveMessage(wctx)
	s.acks.woke()
	if err != nil && ctx.Err() == nil && wctx.Err() != nil && (pgconn.Timeout(err) || errors.Is(err, context.Canceled)) {
		return nil, nil
	}
	return msg, err
}

// valid reports whether the latest ack may still be sent at now.
func (s *walStream) valid(now time.Time) bool { return now.Before(s.ack.Until) }

// status sends the latest ack as the slot's written, flushed and applied position when
// it changed, when the last update is StatusInterval old, or when the server asked
// (asked), and never once the ack's Until has passed.
func (s *walStream) status(asked bool) error {
	if a, ok := s.acks.take(); ok {
		s.ack, s.changed = a, true
	}
	now := time.Now()
	if !s.valid(now) || (!s.changed && !asked && now.Before(s.sentAt.Add(s.interval))) {
		return nil
	}
	lsn := pglogrepl.LSN(s.ack.LSN)
	nc := s.conn.Conn()
	if err := nc.SetWriteDeadline(now.Add(streamWriteTimeout)); err != nil {
		return err
	}
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: lsn, WALFlushPosition: lsn, WALApplyPosition: lsn, ClientTime: now})
	if err != nil {
		return fmt.Errorf("send a status update: %w", err)
	}
	if err := nc.SetWriteDeadline(time.Time{}); err != nil {
		return err
	}
	s.changed, s.sentAt = false, now
	return nil
}

// handle takes one message of the replication stream.
func (s *walStream) handle(msg pgproto3.BackendMessage) error {
	switch m := msg.(type) {
	case *pgproto3.CopyData:
		if len(m.Data) == 0 {
			return errors.New("an empty message in the stream")
		}
		switch m.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			k, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
			if err != nil {
				return err
			}
			s.dec.keepalive(uint64(k.ServerWALEnd))
			if k.ReplyRequested {
				return s.status(true)
			}
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(m.Data[1:])
			if err != nil {
				return err
			}
			if len(x.WALData) == 0 {
				return errors.New("an empty pgoutput message")
			}
			lm, err := pglogrepl.Parse(x.WALData)
			if err != nil {
				return fmt.Errorf("decode a pgoutput message (type %q): %w", x.WALData[0], err)
			}
			return s.dec.decode(lm)
		}
	case *pgproto3.ErrorResponse:
		return pgconn.ErrorResponseToPgError(m)
	case *pgproto3.CopyDone:
		return errors.New("the server ended the stream")
	}
	return nil
}

// ackBox passes the relay's acks to the stream. A goroutine of its own receives them, so
// that a new ack ends a wait for the server at once; only the latest one counts.
type ackBox struct {
	mu     sync.Mutex
	latest outboxdriver.StreamAck
	fresh  bool               // latest has not been taken
	wake   context.CancelFunc // ends the wait for the server in progress; nil when none
}

// watch receives acks until the returned stop is called (which waits for the
// goroutine to end) or acks is closed.
func (b *ackBox) watch(acks <-chan outboxdriver.StreamAck) (stop func()) {
	if acks == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case a, ok := <-acks:
				if !ok {
					return
				}
				b.put(a)
			case <-done:
				return
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

func (b *ackBox) put(a outboxdriver.StreamAck) {
	b.mu.Lock()
	b.latest, b.fresh = a, true
	wake := b.wake
	b.wake = nil
	b.mu.Unlock()
	if wake != nil {
		wake()
	}
}

// take returns the latest ack if it was not taken before.
func (b *ackBox) take() (outboxdriver.StreamAck, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	a, fresh := b.latest, b.fresh
	b.fresh = false
	return a, fresh
}

// sleep records wake as the way to end the coming wait for the server, unless an ack
// arrived since the last take: then it returns false, and the wait must not start.
func (b *ackBox) sleep(wake context.CancelFunc) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fresh {
		return false
	}
	b.wake = wake
	return true
}

// woke forgets the wait's wake.
func (b *ackBox) woke() {
	b.mu.Lock()
	b.wake = nil
	b.mu.Unlock()
}

// walDecoder turns the messages of a pgoutput stream into what Stream emits. It does no
// I/O, and is used by one goroutine.
//
// Invariants:
//   - a transaction is reported at its Commit, and only if it inserted into the outbox;
//   - pos, the highest position reported (a transaction's end, or an idle position),
//     only grows: each transaction reported ends past every position reported before;
//   - an idle position is reported only outside a transaction (between a Commit and the
//     next Begin), so it is past every transaction reported before it and before the
//     commit of every transaction reported after it.
type walDecoder struct {
	schema, table string      // the outbox table: only inserts into it count
	max           int         // the most seqs a transaction keeps
	types         *pgtype.Map // decodes the rows' columns; nil: seqs only (StreamRequest.Rows)
	whole         func() bool // StreamRequest.Rows: whole rows, or keys only
	txnBytesMax   int         // StreamTxnRowBytesMax
	batchBytesMax int         // StreamBatchRowBytesMax

	rels     map[uint32]walRelation
	open     bool // between a Begin and its Commit
	txn      outboxdriver.StreamTxn
	n        int  // the seqs the open transaction inserted, kept or not
	noRows   bool // the open transaction's rows are left out (over budget, or bulk)
	txnBytes int  // the bytes of the open transaction's rows kept
	outBytes int  // the bytes of out's rows
	pos      uint64
	out      outboxdriver.StreamBatch // decoded, not yet taken
}

// walRelation is what the decoder knows of a relation the stream described.
type walRelation struct {
	seq  int         // the index of its seq column; -1 for another table
	key  int         // the index of its key column, when cols is set
	cols []walColumn // the outbox table's columns, when rows are decoded and it has all a message needs
}

// newWALDecoder returns a decoder of the inserts into schema.table that keeps at most max
// seqs of a transaction, and decodes the rows too when rows is set: whole while it
// returns true, keys only while it returns false.
func newWALDecoder(schema, table string, max int, rows func() bool) walDecoder {
	d := walDecoder{schema: schema, table: table, max: max, rels: map[uint32]walRelation{},
		txnBytesMax: StreamTxnRowBytesMax, batchBytesMax: StreamBatchRowBytesMax, whole: rows}
	if rows != nil {
		d.types = pgtype.NewMap()
	}
	return d
}

// decode takes one pgoutput message. Type and Origin messages, and any update, delete or
// truncate (which the publication does not publish), are ignored.
func (d *walDecoder) decode(m pglogrepl.Message) error {
	switch m := m.(type) {
	case *pglogrepl.BeginMessage:
		if d.open {
			return errors.New("a Begin inside a transaction")
		}
		d.open, d.txn, d.n, d.noRows, d.txnBytes = true, outboxdriver.StreamTxn{Xid: m.Xid}, 0, d.types == nil, 0
		d.txn.KeysOnly = d.whole != nil && !d.whole()
	case *pglogrepl.RelationMessage:
		return d.relation(m)
	case *pglogrepl.InsertMessage:
		return d.insert(m)
	case *pglogrepl.CommitMessage:
		return d.commit(uint64(m.TransactionEndLSN))
	case *pglogrepl.LogicalDecodingMessage:
		d.message(m)
	}
	return nil
}

// relation learns which relation id is the outbox table, and where its seq column is:
// by name, since generated columns (shard) are not sent and a later migration may
// reorder columns. The server sends a relation again after it changed.
func (d *walDecoder) relation(m *pglogrepl.RelationMessage) error {
	if m.Namespace != d.schema || m.RelationName != d.table {
		d.rels[m.RelationID] = walRelation{seq: -1} // a bucket of the ring, or a table added to the publication
		return nil
	}
	for i, c := range m.Columns {
		if c.Name == "seq" {
			r := walRelation{seq: i}
			if d.types != nil {
				r.cols = rowColumns(m)
				for j, c := range r.cols {
					if c.field == fieldKey {
						r.key = j
					}
				}
			}
			d.rels[m.RelationID] = r
			return nil
		}
	}
	return fmt.Errorf("the outbox table %s.%s arrived without a seq column", d.schema, d.table)
}

func (d *walDecoder) insert(m *pglogrepl.InsertMessage) error {
	rel, ok := d.rels[m.RelationID]
	col := rel.seq
	switch {
	case !ok:
		return fmt.Errorf("an insert into relation %d, which no Relation message described", m.RelationID)
	case col < 0:
		return nil
	case !d.open:
		return fmt.Errorf("an insert into %s.%s outside a transaction", d.schema, d.table)
	case m.Tuple == nil || col >= len(m.Tuple.Columns):
		return fmt.Errorf("an insert into %s.%s without its seq column", d.schema, d.table)
	}
	seq, err := columnInt64(m.Tuple.Columns[col])
	if err != nil {
		return fmt.Errorf("an insert into %s.%s: seq: %w", d.schema, d.table, err)
	}
	t := &d.txn
	if d.n == 0 {
		t.Lo, t.Hi = seq, seq
	}
	t.Lo, t.Hi = min(t.Lo, seq), max(t.Hi, seq)
	d.n++
	switch {
	case t.Bulk:
		return nil
	case d.n > d.max:
		t.Bulk, t.Seqs = true, nil
		d.dropRows()
		return nil
	}
	t.Seqs = append(t.Seqs, seq)
	if d.noRows {
		return nil
	}
	row, size := (*outbox.Message)(nil), 0
	switch {
	case rel.cols == nil:
	case t.KeysOnly:
		row, size = keyRow(seq, rel.key, m.Tuple)
	default:
		size = tupleBytes(m.Tuple)
	}
	if rel.cols == nil || d.txnBytes+size > d.txnBytesMax || d.outBytes+d.txnBytes+size > d.batchBytesMax {
		d.dropRows()
		return nil
	}
	if !t.KeysOnly {
		row = decodeRow(d.types, rel.cols, m.Tuple)
	}
	d.txnBytes += size
	t.Rows = append(t.Rows, row)
	return nil
}

// dropRows leaves the open transaction's rows out: only its seqs are reported.
func (d *walDecoder) dropRows() {
	d.noRows, d.txn.Rows, d.txnBytes = true, nil, 0
}

// columnInt64 reads a bigint column as pgoutput sends it: in binary, 8 bytes big-endian
// (the stream asks for binary columns, which spares the walsender the text output of
// every column: the payload's hex above all), or as text.
func columnInt64(c *pglogrepl.TupleDataColumn) (int64, error) {
	switch c.DataType {
	case pglogrepl.TupleDataTypeBinary:
		if len(c.Data) != 8 {
			return 0, fmt.Errorf("%d bytes in binary, want 8", len(c.Data))
		}
		return int64(binary.BigEndian.Uint64(c.Data)), nil
	case pglogrepl.TupleDataTypeText:
		return strconv.ParseInt(string(c.Data), 10, 64)
	}
	return 0, fmt.Errorf("a column of kind %q, want binary or text", c.DataType)
}

func (d *walDecoder) commit(end uint64) error {
	if !d.open {
		return errors.New("a Commit outside a transaction")
	}
	d.open = false
	if d.n == 0 { // a transaction of other tables (PostgreSQL 14 sends them all)
		d.idle(end)
		return nil
	}
	if end <= d.pos {
		return fmt.Errorf("a transaction ending at %s, not past %s, the position reported before it", pglogrepl.LSN(end), pglogrepl.LSN(d.pos))
	}
	d.txn.End, d.pos = end, end
	d.out.Txns = append(d.out.Txns, d.txn)
	d.outBytes += d.txnBytes
	d.txn = outboxdriver.StreamTxn{}
	return nil
}

// message takes a logical decoding message: a heartbeat is a beat, and, written outside
// a transaction, an idle position too (the server decodes the log in order, so its
// position is past every commit sent before it and before every commit sent after it).
func (d *walDecoder) message(m *pglogrepl.LogicalDecodingMessage) {
	if m.Prefix != pgsql.WALHeartbeatPrefix {
		return
	}
	d.out.Beat = uint64(m.LSN)
	if !m.Transactional {
		d.idle(uint64(m.LSN))
	}
}

// keepalive takes a keepalive's position: the end of the log the server has decoded,
// so every transaction that committed before it was sent before it.
func (d *walDecoder) keepalive(walEnd uint64) { d.idle(walEnd) }

// idle reports at as an idle position, if it is outside a transaction and moves past
// everything reported.
func (d *walDecoder) idle(at uint64) {
	if !d.open && at > d.pos {
		d.out.Idle, d.pos = at, at
	}
}

// pending reports whether there is anything to take.
func (d *walDecoder) pending() bool {
	return len(d.out.Txns) > 0 || d.out.Idle > 0 || d.out.Beat > 0
}

// take returns what was decoded since the last take.
func (d *walDecoder) take() outboxdriver.StreamBatch {
	b := d.out
	d.out, d.outBytes = outboxdriver.StreamBatch{}, 0
	return b
}

var _ outboxdriver.WaitingReader = (*Driver)(nil)

// Waiting implements outboxdriver.WaitingReader in one query, on the "waiting" and "key"
// indexes, and the log's position in another when it found no row.
func (d *Driver) Waiting(ctx context.Context, leases []outboxdriver.Lease, limit int) ([]outboxdriver.WaitingRow, uint64, error) {
	if err := d.needPool(); err != nil {
		return nil, 0, err
	}
	type row struct {
		Seq int64
		Key string
		Pos string
	}
	var found []row
	var err error
	if len(leases) > 0 {
		found, err = queryNoJIT(ctx, d, pgx.RowToStructByPos[row], d.names.Waiting(), leasedShards(leases), limit+1)
	}
	pos := ""
	if err == nil && len(found) > 0 {
		pos = found[0].Pos
	} else if err == nil {
		var at []string
		if at, err = queryNoJIT(ctx, d, pgx.RowTo[string], "SELECT pg_current_wal_lsn()::text"); err == nil {
			pos = at[0]
		}
	}
	if err != nil {
		return nil, 0, fmt.Errorf("waiting messages: %w", err)
	}
	lsn, err := pglogrepl.ParseLSN(pos)
	if err != nil {
		return nil, 0, fmt.Errorf("waiting messages: the log's position %q: %w", pos, err)
	}
	rows := make([]outboxdriver.WaitingRow, len(found))
	for i, r := range found {
		rows[i] = outboxdriver.WaitingRow{Seq: r.Seq, Key: r.Key}
	}
	return rows, uint64(lsn), nil
}

// NextDue implements outboxdriver.Streamer: of the pending messages of the given shards
// that wait (a retry backing off, or a delayed message), when the earliest becomes due,
// or the zero time if none waits. The database says how long until then, and the time
// returned is that long after now by this process's clock, so a skew between the two
// clocks does not move the relay's timer (the round trip makes it late, never early).
func (d *Driver) NextDue(ctx context.Context, leases []outboxdriver.Lease) (time.Time, error) {
	if err := d.needPool(); err != nil {
		return time.Time{}, err
	}
	if len(leases) == 0 {
		return time.Time{}, nil
	}
	shards := leasedShards(leases)
	micros, err := queryNoJIT(ctx, d, pgx.RowTo[*int64], d.names.NextDue(), shards)
	if err != nil {
		return time.Time{}, fmt.Errorf("next due: %w", err)
	}
	if len(micros) != 1 || micros[0] == nil {
		return time.Time{}, nil
	}
	return time.Now().Add(time.Duration(*micros[0]) * time.Microsecond), nil
}
