package outboxpgx

// The stream reader's tests are inside the package: the decoder and the error
// classification are tested without a server, and the server tests set up WAL mode with
// the driver's own names. (testdb, which the other tests use, imports this package.)

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/internal/shard"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testpg"
	"github.com/outboxkit/outbox/outboxdriver"
)

// ---- the decoder, without a server ----

// decodeStep is one thing that happens to a decoder: a message, or a keepalive.
type decodeStep func(*walDecoder) error

func stepFeed(m pglogrepl.Message) decodeStep {
	return func(d *walDecoder) error { return d.decode(m) }
}

func stepKeepalive(lsn uint64) decodeStep {
	return func(d *walDecoder) error { d.keepalive(lsn); return nil }
}

func stepBegin() decodeStep { return stepFeed(&pglogrepl.BeginMessage{}) }

func stepCommit(end uint64) decodeStep {
	return stepFeed(&pglogrepl.CommitMessage{TransactionEndLSN: pglogrepl.LSN(end)})
}

func stepRelation(id uint32, schema, table string, cols ...string) decodeStep {
	m := &pglogrepl.RelationMessage{RelationID: id, Namespace: schema, RelationName: table}
	for _, c := range cols {
		m.Columns = append(m.Columns, &pglogrepl.RelationMessageColumn{Name: c})
	}
	return stepFeed(m)
}

// stepInsert is an insert into relation id with the given column values; "NULL" is a
// null, "b:" followed by hex bytes a column in binary.
func stepInsert(id uint32, vals ...string) decodeStep {
	tuple := &pglogrepl.TupleData{}
	for _, v := range vals {
		c := &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeText, Data: []byte(v)}
		if v == "NULL" {
			c = &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeNull}
		}
		if h, ok := strings.CutPrefix(v, "b:"); ok {
			data, err := hex.DecodeString(h)
			if err != nil {
				panic(err)
			}
			c = &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeBinary, Data: data}
		}
		tuple.Columns = append(tuple.Columns, c)
	}
	tuple.ColumnNum = uint16(len(tuple.Columns))
	return stepFeed(&pglogrepl.InsertMessage{RelationID: id, Tuple: tuple})
}

func stepHeartbeat(lsn uint64, transactional bool, prefix string) decodeStep {
	return stepFeed(&pglogrepl.LogicalDecodingMessage{LSN: pglogrepl.LSN(lsn), Transactional: transactional, Prefix: prefix})
}

// outboxRel describes the outbox table as relation 1, seq second: columns are found by
// name.
var outboxRel = stepRelation(1, "public", "outbox", "id", "seq", "key")

func TestStreamDecoder(t *testing.T) {
	type txn = outboxdriver.StreamTxn
	for _, tc := range []struct {
		name    string
		max     int
		steps   []decodeStep
		want    outboxdriver.StreamBatch
		wantErr string
	}{
		{name: "seqs in insert order, other tables ignored",
			steps: []decodeStep{outboxRel, stepRelation(2, "public", "outbox_b0", "seq"), stepRelation(3, "other", "outbox", "seq"),
				stepBegin(), stepInsert(1, "x", "7", "k"), stepInsert(2, "8"), stepInsert(3, "9"), stepInsert(1, "y", "5", "k"), stepCommit(100)},
			want: outboxdriver.StreamBatch{Txns: []txn{{End: 100, Seqs: []int64{7, 5}, Lo: 5, Hi: 7}}}},
		{name: "commit order kept",
			steps: []decodeStep{outboxRel, stepBegin(), stepInsert(1, "x", "9", "k"), stepCommit(100), stepBegin(), stepInsert(1, "x", "3", "k"), stepCommit(200)},
			want:  outboxdriver.StreamBatch{Txns: []txn{{End: 100, Seqs: []int64{9}, Lo: 9, Hi: 9}, {End: 200, Seqs: []int64{3}, Lo: 3, Hi: 3}}}},
		{name: "a transaction without outbox inserts is not emitted; its end is an idle position",
			steps: []decodeStep{stepRelation(2, "public", "other", "seq"), stepBegin(), stepInsert(2, "1"), stepCommit(100)},
			want:  outboxdriver.StreamBatch{Idle: 100}},
		{name: "more seqs than kept: bulk, with the range only", max: 3,
			steps: []decodeStep{outboxRel, stepBegin(), stepInsert(1, "", "10", ""), stepInsert(1, "", "12", ""), stepInsert(1, "", "11", ""),
				stepInsert(1, "", "14", ""), stepInsert(1, "", "13", ""), stepCommit(100)},
			want: outboxdriver.StreamBatch{Txns: []txn{{End: 100, Bulk: true, Lo: 10, Hi: 14}}}},
		{name: "as many seqs as kept: not bulk", max: 3,
			steps: []decodeStep{outboxRel, stepBegin(), stepInsert(1, "", "10", ""), stepInsert(1, "", "12", ""), stepInsert(1, "", "11", ""), stepCommit(100)},
			want:  outboxdriver.StreamBatch{Txns: []txn{{End: 100, Seqs: []int64{10, 12, 11}, Lo: 10, Hi: 12}}}},
		{name: "no idle position inside a transaction, nor one that does not move past the last end",
			steps: []decodeStep{outboxRel, stepBegin(), stepInsert(1, "", "1", ""), stepKeepalive(150), stepCommit(200), stepKeepalive(200), stepKeepalive(180)},
			want:  outboxdriver.StreamBatch{Txns: []txn{{End: 200, Seqs: []int64{1}, Lo: 1, Hi: 1}}}},
		{name: "a keepalive after the last commit is an idle position past it",
			steps: []decodeStep{outboxRel, stepKeepalive(50), stepBegin(), stepInsert(1, "", "1", ""), stepCommit(200), stepKeepalive(250)},
			want:  outboxdriver.StreamBatch{Txns: []txn{{End: 200, Seqs: []int64{1}, Lo: 1, Hi: 1}}, Idle: 250}},
		{name: "heartbeats: a beat, and outside a transaction an idle position; other messages ignored",
			steps: []decodeStep{outboxRel, stepHeartbeat(300, false, pgsql.WALHeartbeatPrefix), stepHeartbeat(400, false, "other")},
			want:  outboxdriver.StreamBatch{Idle: 300, Beat: 300}},
		{name: "a transactional heartbeat is a beat only",
			steps: []decodeStep{outboxRel, stepBegin(), stepHeartbeat(300, true, pgsql.WALHeartbeatPrefix), stepInsert(1, "", "4", ""), stepCommit(400)},
			want:  outboxdriver.StreamBatch{Txns: []txn{{End: 400, Seqs: []int64{4}, Lo: 4, Hi: 4}}, Beat: 300}},
		{name: "seqs in binary",
			steps: []decodeStep{outboxRel, stepBegin(), stepInsert(1, "b:01", "b:0000000000000007", "b:6b"),
				stepInsert(1, "b:02", "b:0100000000000000", "b:6b"), stepCommit(100)},
			want: outboxdriver.StreamBatch{Txns: []txn{{End: 100, Seqs: []int64{7, 1 << 56}, Lo: 7, Hi: 1 << 56}}}},
		{name: "a relation described again with its columns reordered",
			steps: []decodeStep{stepRelation(1, "public", "outbox", "seq", "id"), stepBegin(), stepInsert(1, "3", "x"), stepCommit(10),
				stepRelation(1, "public", "outbox", "id", "seq"), stepBegin(), stepInsert(1, "x", "4"), stepCommit(20)},
			want: outboxdriver.StreamBatch{Txns: []txn{{End: 10, Seqs: []int64{3}, Lo: 3, Hi: 3}, {End: 20, Seqs: []int64{4}, Lo: 4, Hi: 4}}}},

		{name: "insert into an undescribed relation", steps: []decodeStep{stepBegin(), stepInsert(9, "1")}, wantErr: "no Relation message described"},
		{name: "insert outside a transaction", steps: []decodeStep{outboxRel, stepInsert(1, "", "1", "")}, wantErr: "outside a transaction"},
		{name: "begin inside a transaction", steps: []decodeStep{stepBegin(), stepBegin()}, wantErr: "Begin inside a transaction"},
		{name: "commit outside a transaction", steps: []decodeStep{stepCommit(10)}, wantErr: "Commit outside a transaction"},
		{name: "the outbox without seq", steps: []decodeStep{stepRelation(1, "public", "outbox", "id")}, wantErr: "without a seq column"},
		{name: "a null seq", steps: []decodeStep{outboxRel, stepBegin(), stepInsert(1, "x", "NULL", "k")}, wantErr: "seq"},
		{name: "a binary seq of 4 bytes", steps: []decodeStep{outboxRel, stepBegin(), stepInsert(1, "x", "b:00000007", "k")}, wantErr: "want 8"},
		{name: "a short tuple", steps: []decodeStep{outboxRel, stepBegin(), stepInsert(1, "x")}, wantErr: "without its seq column"},
		{name: "an end not past an idle position reported before",
			steps:   []decodeStep{outboxRel, stepKeepalive(500), stepBegin(), stepInsert(1, "", "1", ""), stepCommit(400)},
			wantErr: "not past"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newWALDecoder("public", "outbox", cmp.Or(tc.max, StreamTxnSeqsMax), nil)
			var err error
			for _, step := range tc.steps {
				if err = step(&d); err != nil {
					break
				}
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v; want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !d.pending() {
				t.Fatalf("nothing pending; want %+v", tc.want)
			}
			if got := d.take(); fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", tc.want) {
				t.Errorf("batch\n%+v\nwant\n%+v", got, tc.want)
			}
			if d.pending() {
				t.Errorf("still pending after take: %+v", d.out)
			}
		})
	}
}

// rowsRelColumns are the outbox table's columns with their types, as the server
// describes them (shard, generated, is not sent).
var rowsRelColumns = func() []*pglogrepl.RelationMessageColumn {
	var cols []*pglogrepl.RelationMessageColumn
	for _, c := range []struct {
		name string
		oid  uint32
	}{{"seq", pgtype.Int8OID}, {"id", pgtype.UUIDOID}, {"topic", pgtype.TextOID}, {"key", pgtype.TextOID},
		{"aggregate_type", pgtype.TextOID}, {"event_type", pgtype.TextOID}, {"content_type", pgtype.TextOID},
		{"payload", pgtype.ByteaOID}, {"headers", pgtype.JSONBOID}, {"dedup_key", pgtype.TextOID},
		{"created_at", pgtype.TimestamptzOID}, {"next_attempt_at", pgtype.TimestamptzOID}, {"attempts", pgtype.Int4OID},
		{"last_error", pgtype.TextOID}, {"priority", pgtype.Int2OID}} {
		cols = append(cols, &pglogrepl.RelationMessageColumn{Name: c.name, DataType: c.oid})
	}
	return cols
}()

// rowsRel describes the outbox table as relation 1 with all of rowsRelColumns but those
// named in without.
func rowsRel(without ...string) decodeStep {
	m := &pglogrepl.RelationMessage{RelationID: 1, Namespace: "public", RelationName: "outbox"}
	for _, c := range rowsRelColumns {
		if !slices.Contains(without, c.Name) {
			m.Columns = append(m.Columns, c)
		}
	}
	return stepFeed(m)
}

// rowVals are the values, in text, of the row of seq, key and payload as a writer
// inserts it, in rowsRelColumns' order.
func rowVals(seq int64, key, payload string) []string {
	return []string{strconv.FormatInt(seq, 10), "0190f1a2-7b3c-7def-8abc-0123456789ab", "orders", key, "order", "placed",
		"application/json", `\x` + hex.EncodeToString([]byte(payload)), `{"h": "v"}`, "d" + strconv.FormatInt(seq, 10),
		"2026-11-30 10:00:00+00", "2026-11-30 10:00:00+00", "0", "NULL", "3"}
}

// rowStep is an insert into rowsRel of rowVals(seq, key, payload), with column col set
// to val for each col, val pair of set.
func rowStep(seq int64, key, payload string, set ...any) decodeStep {
	vals := rowVals(seq, key, payload)
	for i := 0; i < len(set); i += 2 {
		vals[set[i].(int)] = set[i+1].(string)
	}
	return stepInsert(1, vals...)
}

// TestStreamDecoderRows: with rows asked for, each insert comes as the message a fetch
// returns, DeliverAt set on a row that waits; a row that cannot be read is a nil entry;
// a transaction over its budget, or after the batch's budget is spent, or bulk, comes
// with its seqs only.
func TestStreamDecoderRows(t *testing.T) {
	id, err := outbox.ParseID("0190f1a2-7b3c-7def-8abc-0123456789ab")
	if err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	msg := func(seq int64, key, payload string, priority int) *outbox.Message {
		return &outbox.Message{Seq: seq, ID: id, Topic: "orders", Key: key, AggregateType: "order", EventType: "placed",
			ContentType: "application/json", Payload: []byte(payload), Headers: map[string]string{"h": "v"},
			DedupKey: "d" + strconv.FormatInt(seq, 10), Priority: priority, CreatedAt: created, Shard: shard.Of(key, id)}
	}
	long := strings.Repeat("x", 80)
	type want struct {
		seqs []int64
		rows []*outbox.Message // nil: Rows must be nil
	}
	for _, tc := range []struct {
		name     string
		off      bool // rows not asked for
		keys     bool // keys only asked for
		max      int
		txnMax   int
		batchMax int
		steps    []decodeStep
		want     []want
	}{
		{name: "fresh rows, as fetched; an empty key's shard is its id's",
			steps: []decodeStep{rowsRel(), stepBegin(), rowStep(7, "k", `{"a":1}`), rowStep(8, "", `{}`), stepCommit(100)},
			want:  []want{{seqs: []int64{7, 8}, rows: []*outbox.Message{msg(7, "k", `{"a":1}`, 3), msg(8, "", `{}`, 3)}}}},
		{name: "keys only: each row's seq and key", keys: true,
			steps: []decodeStep{rowsRel(), stepBegin(), rowStep(7, "k", "x"), rowStep(8, "", "y"), stepCommit(100)},
			want:  []want{{seqs: []int64{7, 8}, rows: []*outbox.Message{{Seq: 7, Key: "k"}, {Seq: 8}}}}},
		{name: "rows not asked for", off: true,
			steps: []decodeStep{rowsRel(), stepBegin(), rowStep(7, "k", "x"), stepCommit(100)},
			want:  []want{{seqs: []int64{7}}}},
		{name: "rows that wait, were attempted, failed: as they are",
			steps: []decodeStep{rowsRel(), stepBegin(), rowStep(1, "k", "x", 11, "2026-11-30 10:05:00+00"),
				rowStep(2, "k", "x", 12, "2", 13, "boom"), rowStep(3, "k", "x"), stepCommit(100)},
			want: []want{{seqs: []int64{1, 2, 3}, rows: []*outbox.Message{
				func() *outbox.Message { m := msg(1, "k", "x", 3); m.DeliverAt = created.Add(5 * time.Minute); return m }(),
				func() *outbox.Message { m := msg(2, "k", "x", 3); m.Attempts, m.LastError = 2, "boom"; return m }(),
				msg(3, "k", "x", 3)}}}},
		{name: "a column that does not decode: a nil entry",
			steps: []decodeStep{rowsRel(), stepBegin(), rowStep(1, "k", "x", 8, "not json"), stepCommit(100)},
			want:  []want{{seqs: []int64{1}, rows: []*outbox.Message{nil}}}},
		{name: "before migration 10: no priority column, priority 0",
			steps: []decodeStep{rowsRel("priority"), stepBegin(), stepInsert(1, rowVals(5, "k", "x")[:14]...), stepCommit(100)},
			want:  []want{{seqs: []int64{5}, rows: []*outbox.Message{msg(5, "k", "x", 0)}}}},
		{name: "a table without a column a message needs: seqs only",
			steps: []decodeStep{rowsRel("headers"), stepBegin(), stepInsert(1, "5"), stepCommit(100)},
			want:  []want{{seqs: []int64{5}}}},
		{name: "a transaction over its budget: seqs only; the next one has rows", txnMax: 200,
			steps: []decodeStep{rowsRel(), stepBegin(), rowStep(1, "k", "x"), rowStep(2, "k", long), stepCommit(100),
				stepBegin(), rowStep(3, "k", ""), stepCommit(200)},
			want: []want{{seqs: []int64{1, 2}}, {seqs: []int64{3}, rows: []*outbox.Message{msg(3, "k", "", 3)}}}},
		{name: "the batch's budget spent: later transactions seqs only", batchMax: 300,
			steps: []decodeStep{rowsRel(), stepBegin(), rowStep(1, "k", "x"), rowStep(2, "k", "x"), stepCommit(100),
				stepBegin(), rowStep(3, "k", long), stepCommit(200)},
			want: []want{{seqs: []int64{1, 2}, rows: []*outbox.Message{msg(1, "k", "x", 3), msg(2, "k", "x", 3)}}, {seqs: []int64{3}}}},
		{name: "bulk: no rows", max: 2,
			steps: []decodeStep{rowsRel(), stepBegin(), rowStep(1, "k", "x"), rowStep(2, "k", "x"), rowStep(3, "k", "x"), stepCommit(100)},
			want:  []want{{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rows func() bool
			if !tc.off {
				rows = func() bool { return !tc.keys }
			}
			d := newWALDecoder("public", "outbox", cmp.Or(tc.max, StreamTxnSeqsMax), rows)
			d.txnBytesMax, d.batchBytesMax = cmp.Or(tc.txnMax, d.txnBytesMax), cmp.Or(tc.batchMax, d.batchBytesMax)
			for _, step := range tc.steps {
				if err := step(&d); err != nil {
					t.Fatal(err)
				}
			}
			b := d.take()
			if len(b.Txns) != len(tc.want) {
				t.Fatalf("%d transactions, want %d: %+v", len(b.Txns), len(tc.want), b)
			}
			for i, w := range tc.want {
				got := b.Txns[i]
				if got.KeysOnly != tc.keys {
					t.Errorf("transaction %d: KeysOnly %v, want %v", i, got.KeysOnly, tc.keys)
				}
				if !slices.Equal(got.Seqs, w.seqs) {
					t.Errorf("transaction %d: seqs %v, want %v", i, got.Seqs, w.seqs)
				}
				if w.rows == nil {
					if got.Rows != nil {
						t.Errorf("transaction %d: rows %v, want none", i, got.Rows)
					}
					continue
				}
				if len(got.Rows) != len(w.rows) {
					t.Fatalf("transaction %d: %d rows, want %d", i, len(got.Rows), len(w.rows))
				}
				for j, m := range w.rows {
					if diff := messageDiff(got.Rows[j], m); diff != "" {
						t.Errorf("transaction %d, row %d: %s", i, j, diff)
					}
				}
			}
		})
	}
}

// messageDiff says how got differs from want, or "" (times compare as instants, a nil
// and an empty payload alike).
func messageDiff(got, want *outbox.Message) string {
	switch {
	case got == nil && want == nil:
		return ""
	case got == nil || want == nil:
		return fmt.Sprintf("%+v, want %+v", got, want)
	}
	g, w := *got, *want
	if !g.CreatedAt.Equal(w.CreatedAt) || !g.DeliverAt.Equal(w.DeliverAt) {
		return fmt.Sprintf("created_at %v, deliver_at %v; want %v, %v", g.CreatedAt, g.DeliverAt, w.CreatedAt, w.DeliverAt)
	}
	g.CreatedAt, w.CreatedAt, g.DeliverAt, w.DeliverAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	if len(g.Payload) == 0 && len(w.Payload) == 0 {
		g.Payload, w.Payload = nil, nil
	}
	if fmt.Sprintf("%+v", g) != fmt.Sprintf("%+v", w) {
		return fmt.Sprintf("\n%+v\nwant\n%+v", g, w)
	}
	return ""
}

func TestStreamReason(t *testing.T) {
	pe := func(code, msg, detail string) error { return &pgconn.PgError{Code: code, Message: msg, Detail: detail} }
	for _, tc := range []struct {
		err  error
		want outboxdriver.StreamReason
	}{
		{pe("55000", "logical decoding requires wal_level >= logical", ""), outboxdriver.StreamWALLevel},
		{pe("55000", `logical decoding requires "wal_level" >= "logical"`, ""), outboxdriver.StreamWALLevel},
		{pe("42501", "must be superuser or replication role to start walsender", ""), outboxdriver.StreamPrivilege},
		{pe("42501", "permission denied to start WAL sender", "Only roles with the REPLICATION attribute may start a WAL sender process."), outboxdriver.StreamPrivilege},
		{pe("42704", `replication slot "outbox_wal" does not exist`, ""), outboxdriver.StreamSlotMissing},
		{pe("42704", `publication "outbox_pub" does not exist`, ""), outboxdriver.StreamPublication},
		{pe("55000", `cannot read from logical replication slot "outbox_wal"`, "This slot has been invalidated because it exceeded the maximum reserved size."), outboxdriver.StreamSlotLost},
		{pe("55000", `can no longer get changes from replication slot "outbox_wal"`, "This slot has been invalidated because it exceeded the maximum reserved size."), outboxdriver.StreamSlotLost},
		{pe("55006", `replication slot "outbox_wal" is active for PID 4242`, ""), outboxdriver.StreamSlotActive},
		{pe("57P01", "terminating connection due to administrator command", ""), outboxdriver.StreamTransient},
		{pe("42704", `type "x" does not exist`, ""), outboxdriver.StreamTransient},
		{io.ErrUnexpectedEOF, outboxdriver.StreamTransient},
		{fmt.Errorf("connect for replication: %w", pe("42501", "must be superuser or replication role to start walsender", "")), outboxdriver.StreamPrivilege},
	} {
		if got := streamReason(tc.err); got != tc.want {
			t.Errorf("%v: %s, want %s", tc.err, got, tc.want)
		}
	}
}

func TestStreamServerMajor(t *testing.T) {
	for v, want := range map[string]int{"15.4 (Debian 15.4-1.pgdg120+1)": 15, "9.6.24": 9, "14beta1": 14, "17.0": 17, "": 1 << 30, "x": 1 << 30} {
		if got := serverMajor(v); got != want {
			t.Errorf("%q: %d, want %d", v, got, want)
		}
	}
}

// ---- on a private server with logical decoding ----

// TestStream runs the stream against a server of its own with wal_level=logical (the
// shared one runs replica); each subtest has its own outbox schema, slot and
// publication.
func TestStream(t *testing.T) {
	t.Parallel()
	srv := testpg.StartServer(t, "wal_level=logical", "max_replication_slots=20", "max_wal_senders=20")
	for _, tc := range []struct {
		name string
		test func(*testing.T, *testpg.Server)
	}{
		{"CommitOrder", testStreamCommitOrder},
		{"AcksOnly", testStreamAcksOnly},
		{"Redelivery", testStreamRedelivery},
		{"NotEmitted", testStreamNotEmitted},
		{"RingMove", testStreamRingMove},
		{"Rows", testStreamRows},
		{"Waiting", testStreamWaiting},
		{"Idle", testStreamIdle},
		{"Errors", testStreamErrors},
		{"NextDue", testStreamNextDue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.test(t, srv)
		})
	}
}

// Transactions arrive in commit order: one that took a lower seq but committed later
// arrives later, and ends later.
func testStreamCommitOrder(t *testing.T, srv *testpg.Server) {
	b := newStreamBundle(t, srv, Config{}, true)
	low := b.begin(t)
	a := b.writeIn(t, low, "a")
	high := b.begin(t)
	hi := b.writeIn(t, high, "b1", "b2")
	if a[0] >= hi[0] {
		t.Fatalf("seqs %v, %v: want the first transaction's lower", a, hi)
	}
	xid := func(tx pgx.Tx) uint32 {
		var x int64
		if err := tx.QueryRow(testenv.Context(t), `SELECT pg_current_xact_id()::text::bigint`).Scan(&x); err != nil {
			t.Fatal(err)
		}
		return uint32(x)
	}
	lowXid, highXid := xid(low), xid(high)
	b.commit(t, high)
	b.commit(t, low)

	r := b.stream(t, outboxdriver.StreamRequest{})
	got := r.awaitTxns(t, 2)
	if len(got) != 2 || !slices.Equal(got[0].Seqs, hi) || !slices.Equal(got[1].Seqs, a) {
		t.Fatalf("transactions %+v; want seqs %v then %v", got, hi, a)
	}
	if got[0].Xid != highXid || got[1].Xid != lowXid {
		t.Errorf("xids %d, %d; want %d, %d (the writers' transactions)", got[0].Xid, got[1].Xid, highXid, lowXid)
	}
	if got[0].End >= got[1].End || got[0].Bulk || got[0].Lo != hi[0] || got[0].Hi != hi[1] {
		t.Errorf("transactions %+v: want increasing ends and the range of each", got)
	}
}

// The slot moves only to what the relay acknowledges, and only before the ack's Until.
func testStreamAcksOnly(t *testing.T, srv *testpg.Server) {
	b := newStreamBundle(t, srv, Config{}, true)
	start := b.confirmed(t)
	b.write(t, "a")
	b.write(t, "b")
	r := b.stream(t, outboxdriver.StreamRequest{StatusInterval: 50 * time.Millisecond})
	got := r.awaitTxns(t, 2)
	if c := b.confirmed(t); c != start {
		t.Fatalf("confirmed_flush_lsn moved from %s to %s without an ack", pglogrepl.LSN(start), pglogrepl.LSN(c))
	}
	if b.replied(t) {
		t.Fatal("a status update went out without an ack")
	}

	r.ack(t, outboxdriver.StreamAck{LSN: got[0].End, Until: time.Now().Add(time.Hour)})
	b.awaitConfirmed(t, got[0].End)

	// An ack whose Until has passed is not sent, neither when it arrives nor when the
	// status is due again: the stream reads on (a transaction written after it arrives)
	// and the slot stays where the last valid ack put it.
	r.ack(t, outboxdriver.StreamAck{LSN: got[1].End, Until: time.Now().Add(-time.Second)})
	c := b.write(t, "c")
	if more := r.awaitTxns(t, 3); !slices.Equal(more[2].Seqs, c) {
		t.Fatalf("transactions %+v; want %v third", more, c)
	}
	at := b.replyTime(t)
	d := b.write(t, "d")
	if more := r.awaitTxns(t, 4); !slices.Equal(more[3].Seqs, d) {
		t.Fatalf("transactions %+v; want %v fourth", more, d)
	}
	if now := b.replyTime(t); at == "" || now != at {
		t.Errorf("the walsender heard status updates at %q, then %q; want one, before the expired ack", at, now)
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("Stream after its context ended: %v, want nil", err)
	}
	if c := b.confirmed(t); c != got[0].End {
		t.Errorf("confirmed_flush_lsn %s after an expired ack; want %s", pglogrepl.LSN(c), pglogrepl.LSN(got[0].End))
	}
}

// A new stream delivers again every transaction not acknowledged, and none that was.
func testStreamRedelivery(t *testing.T, srv *testpg.Server) {
	b := newStreamBundle(t, srv, Config{}, true)
	b.write(t, "a")
	b.write(t, "b", "c")
	r := b.stream(t, outboxdriver.StreamRequest{})
	first := r.awaitTxns(t, 2)
	if err := r.stop(t); err != nil {
		t.Fatalf("Stream after its context ended: %v, want nil", err)
	}
	b.awaitInactive(t)

	r = b.stream(t, outboxdriver.StreamRequest{})
	if again := r.awaitTxns(t, 2); fmt.Sprint(again) != fmt.Sprint(first) {
		t.Fatalf("after a restart: %+v; want the same %+v", again, first)
	}
	r.ack(t, outboxdriver.StreamAck{LSN: first[0].End, Until: time.Now().Add(time.Hour)})
	b.awaitConfirmed(t, first[0].End)
	_ = r.stop(t)
	b.awaitInactive(t)

	r = b.stream(t, outboxdriver.StreamRequest{})
	if again := r.awaitTxns(t, 1); fmt.Sprint(again[0]) != fmt.Sprint(first[1]) {
		t.Fatalf("after acknowledging the first: %+v; want %+v first", again, first[1])
	}
}

// A rolled-back transaction, and one that touched other tables only, are not emitted; a
// transaction that also touched another table carries only its outbox seqs.
func testStreamNotEmitted(t *testing.T, srv *testpg.Server) {
	b := newStreamBundle(t, srv, Config{}, true)
	b.exec(t, `CREATE TABLE %s.other (x int)`)
	tx := b.begin(t)
	b.writeIn(t, tx, "rolled-back")
	if err := tx.Rollback(testenv.Context(t)); err != nil {
		t.Fatal(err)
	}
	b.exec(t, `INSERT INTO %s.other VALUES (1)`)
	tx = b.begin(t)
	if _, err := tx.Exec(testenv.Context(t), fmt.Sprintf(`INSERT INTO %s.other VALUES (2)`, b.quoted())); err != nil {
		t.Fatal(err)
	}
	mixed := b.writeIn(t, tx, "mixed")
	b.commit(t, tx)
	last := b.write(t, "last")

	r := b.stream(t, outboxdriver.StreamRequest{})
	got := r.awaitTxns(t, 2)
	if len(got) != 2 || !slices.Equal(got[0].Seqs, mixed) || !slices.Equal(got[1].Seqs, last) {
		t.Fatalf("transactions %+v; want only %v and %v", got, mixed, last)
	}
}

// The ring's move of a pending row to the current bucket arrives as a new insert of the
// same seq; the truncate of the emptied bucket does not arrive.
func testStreamRingMove(t *testing.T, srv *testpg.Server) {
	b := newStreamBundle(t, srv, Config{RotateRows: 1}, true)
	a := b.write(t, "a")
	r := b.stream(t, outboxdriver.StreamRequest{})
	r.awaitTxns(t, 1)
	b.awaitRingMove(t)
	z := b.write(t, "z")
	got := r.awaitTxns(t, 3)
	if len(got) != 3 || !slices.Equal(got[0].Seqs, a) || !slices.Equal(got[1].Seqs, a) || !slices.Equal(got[2].Seqs, z) {
		t.Fatalf("transactions %+v; want %v written, %v moved, then %v", got, a, a, z)
	}
}

// With rows asked for, each row arrives as the table holds it (read back as a fetch reads
// it, shard included), a delayed one with its DeliverAt, also when a ring move inserts it
// again; a transaction over the budget comes with its seqs only.
func testStreamRows(t *testing.T, srv *testpg.Server) {
	b := newStreamBundle(t, srv, Config{RotateRows: 1}, true)
	ctx := testenv.Context(t)
	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	msgs := []outbox.Message{
		{Topic: "orders", Key: "k1", Payload: []byte(`{"n": 1}`), Headers: map[string]string{"Trace": "t1", "x-a": ""}},
		{Topic: "orders", Key: "", Payload: []byte{}, AggregateType: "order", EventType: "placed", Priority: 7},
		{Topic: "files", Key: "k2", Payload: binary, ContentType: "application/octet-stream", DedupKey: "mine"},
		{Topic: "later", Key: "k3", Payload: []byte("x"), DeliverAt: time.Now().Add(time.Hour)},
	}
	tx := b.begin(t)
	if err := b.w.Write(ctx, tx, msgs...); err != nil {
		t.Fatal(err)
	}
	b.commit(t, tx)
	var bulky []outbox.Message // over the budget together: each is under the writer's limit
	for range StreamTxnRowBytesMax/1_000_000 + 1 {
		bulky = append(bulky, outbox.Message{Topic: "big", Key: "k4", Payload: make([]byte, 1_000_000)})
	}
	tx = b.begin(t)
	if err := b.w.Write(ctx, tx, bulky...); err != nil {
		_ = tx.Rollback(ctx)
		t.Fatal(err)
	}
	b.commit(t, tx)
	r := b.stream(t, outboxdriver.StreamRequest{Rows: func() bool { return true }})
	got := r.awaitTxns(t, 2)

	rows, err := b.pool.Query(ctx, `SELECT `+pgsql.ReadColumns("")+`, priority FROM `+b.quoted()+`.outbox ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	want, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*outbox.Message, error) {
		m := &outbox.Message{}
		return m, pgsql.ScanMessage(row, m, &m.Priority)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(want) != 4+len(bulky) || len(got[0].Rows) != 4 || len(got[0].Seqs) != 4 {
		t.Fatalf("%d rows in the table, transaction %+v: want %d rows, and 4 in the first transaction", len(want), got[0], 4+len(bulky))
	}
	for i, m := range got[0].Rows[:3] {
		if diff := messageDiff(m, want[i]); diff != "" {
			t.Errorf("row %d: %s", i, diff)
		}
	}
	if d := got[0].Rows[3]; d == nil || d.DeliverAt.IsZero() || d.Key != "k3" {
		t.Errorf("the delayed message came as %+v; want it with its DeliverAt", d)
	}
	if len(got[1].Seqs) != len(bulky) || got[1].Seqs[0] != want[4].Seq || got[1].Rows != nil {
		t.Errorf("the transaction over the budget: seqs %v, %d rows; want %d from %d and none", got[1].Seqs, len(got[1].Rows), len(bulky), want[4].Seq)
	}

	// A ring move inserts the pending rows again as they are: the delayed one still
	// waits. (The bulky ones go first, which the publication does not publish, so the
	// move's rows fit the budget.)
	b.exec(t, `DELETE FROM %s.outbox WHERE topic = 'big'`)
	b.awaitRingMove(t)
	all := r.awaitTxns(t, 3)
	seen := false
	for _, x := range all[2:] {
		for i, seq := range x.Seqs {
			if seq == got[0].Seqs[3] {
				seen = true
				if x.Rows == nil || x.Rows[i] == nil || x.Rows[i].DeliverAt.IsZero() {
					t.Errorf("the delayed message, moved, came as %+v; want it with its DeliverAt", x)
				}
			}
		}
	}
	if !seen {
		t.Errorf("the move's transactions %+v do not hold the delayed message %d", all[2:], got[0].Seqs[3])
	}
}

// Waiting returns the rows that wait and the other pending rows of their keys, of the
// shards asked for, keyless ones left out, and at most limit+1 of them.
func testStreamWaiting(t *testing.T, srv *testpg.Server) {
	b := newStreamBundle(t, srv, Config{}, false)
	ctx := testenv.Context(t)
	later := time.Now().Add(time.Hour)
	msg := func(key string, at time.Time) outbox.Message {
		return outbox.Message{Topic: "t", Key: key, Payload: []byte("p"), DeliverAt: at}
	}
	b.writeMsgs(t, msg("fresh", time.Time{}), msg("held", time.Time{}))
	b.writeMsgs(t, msg("held", later), msg("", later))
	b.writeMsgs(t, msg("held", time.Time{}), msg("other", time.Time{}))
	var first int64 // seqs: fresh first, held first+1, held (delayed) first+2, keyless
	// (delayed) first+3, held first+4, other first+5
	if err := b.pool.QueryRow(ctx, fmt.Sprintf(`SELECT min(seq) FROM %s.outbox`, b.quoted())).Scan(&first); err != nil {
		t.Fatal(err)
	}
	all := make([]outboxdriver.Lease, 64)
	for i := range all {
		all[i] = outboxdriver.Lease{Shard: i}
	}
	var before string
	if err := b.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	got, pos, err := b.drv.Waiting(ctx, all, 100)
	if err != nil {
		t.Fatal(err)
	}
	if lsn, err := pglogrepl.ParseLSN(before); err != nil || pos < uint64(lsn) {
		t.Errorf("Waiting's position %s, before it the log was at %s: want it at or past", pglogrepl.LSN(pos), before)
	}
	slices.SortFunc(got, func(a, b outboxdriver.WaitingRow) int { return cmp.Compare(a.Seq, b.Seq) })
	want := []outboxdriver.WaitingRow{{Seq: first + 1, Key: "held"}, {Seq: first + 2, Key: "held"}, {Seq: first + 4, Key: "held"}}
	if !slices.Equal(got, want) {
		t.Errorf("Waiting: %v, want %v", got, want)
	}
	if got, _, err := b.drv.Waiting(ctx, all, 1); err != nil || len(got) != 2 {
		t.Errorf("Waiting with limit 1: %v, %v; want 2 rows (one over the limit)", got, err)
	}
	var heldShard int
	if err := b.pool.QueryRow(ctx, fmt.Sprintf(`SELECT shard FROM %s.outbox WHERE key = 'held' LIMIT 1`, b.quoted())).Scan(&heldShard); err != nil {
		t.Fatal(err)
	}
	others := slices.DeleteFunc(slices.Clone(all), func(l outboxdriver.Lease) bool { return l.Shard == heldShard })
	if got, pos, err := b.drv.Waiting(ctx, others, 100); err != nil || len(got) != 0 || pos == 0 {
		t.Errorf("Waiting of the other shards: %v at %s, %v; want none, and the log's position", got, pglogrepl.LSN(pos), err)
	}
}

// Between transactions, keepalives give idle positions past the last one. An ack of 0
// keeps the server's walsender talking without confirming anything.
func testStreamIdle(t *testing.T, srv *testpg.Server) {
	b := newStreamBundle(t, srv, Config{}, true)
	start := b.confirmed(t)
	b.write(t, "a")
	r := b.stream(t, outboxdriver.StreamRequest{StatusInterval: 50 * time.Millisecond})
	got := r.awaitTxns(t, 1)
	r.ack(t, outboxdriver.StreamAck{LSN: 0, Until: time.Now().Add(time.Hour)})
	b.exec(t, `CREATE TABLE %s.other (x int); INSERT INTO %s.other VALUES (1)`) // WAL past the transaction
	testenv.Await(t, "an idle position past the transaction", func() (any, bool) {
		bs := r.batches()
		if r.ended() {
			t.Fatalf("Stream returned %v", r.err)
		}
		for _, bt := range bs {
			if bt.Idle > got[0].End {
				return nil, true
			}
		}
		return fmt.Sprintf("%+v", bs), false
	})
	if !b.replied(t) {
		t.Error("the ack of 0 was not sent")
	}
	if c := b.confirmed(t); c != start {
		t.Errorf("confirmed_flush_lsn moved from %s to %s with an ack of 0", pglogrepl.LSN(start), pglogrepl.LSN(c))
	}
}

// Each failure is told by its reason.
func testStreamErrors(t *testing.T, srv *testpg.Server) {
	b := newStreamBundle(t, srv, Config{}, true)
	noop := func(outboxdriver.StreamBatch) {}
	req := outboxdriver.StreamRequest{RelayID: "r1", Slot: "no_such_slot", Publication: b.pub}
	wantReason(t, "a missing slot", b.drv.Stream(testenv.Context(t), req, noop), outboxdriver.StreamSlotMissing)

	r := b.stream(t, outboxdriver.StreamRequest{RelayID: "r1"})
	b.awaitActive(t)
	req = outboxdriver.StreamRequest{RelayID: "r2", Slot: b.slot, Publication: b.pub}
	wantReason(t, "a slot another connection reads", b.drv.Stream(testenv.Context(t), req, noop), outboxdriver.StreamSlotActive)
	var app string
	if err := b.pool.QueryRow(testenv.Context(t), `SELECT application_name FROM pg_stat_replication
WHERE pid = (SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1)`, b.slot).Scan(&app); err != nil || app != "outbox relay r1" {
		t.Errorf("the walsender's application_name %q (%v); want %q", app, err, "outbox relay r1")
	}
	_ = r.stop(t)
	b.awaitInactive(t)

	// START succeeds; the first change finds the publication missing.
	r = b.stream(t, outboxdriver.StreamRequest{Publication: "no_such_pub"})
	b.write(t, "a")
	wantReason(t, "a missing publication", r.awaitExit(t), outboxdriver.StreamPublication)

	role := "norepl_" + b.schema
	b.exec(t, `CREATE ROLE `+role+` LOGIN`)
	pool := streamPool(t, "postgres://"+role+"@"+srv.Addr()+"/"+testpg.Database+"?sslmode=disable")
	drv, err := New(pool, Config{Schema: b.schema})
	if err != nil {
		t.Fatal(err)
	}
	req = outboxdriver.StreamRequest{RelayID: "r3", Slot: b.slot, Publication: b.pub}
	wantReason(t, "a role without REPLICATION", drv.Stream(testenv.Context(t), req, noop), outboxdriver.StreamPrivilege)

	// A stopped stream is no failure.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.drv.Stream(ctx, req, noop); err != nil {
		t.Errorf("Stream with its context done: %v, want nil", err)
	}
}

// NextDue finds the earliest waiting message of the shards asked about: a retry backing
// off or a delayed message, not a fresh one nor a retry already due.
func testStreamNextDue(t *testing.T, srv *testpg.Server) {
	b := newStreamBundle(t, srv, Config{}, false)
	ctx := testenv.Context(t)
	deliverAt := time.Now().Add(30 * time.Minute)
	b.writeMsgs(t, outbox.Message{Topic: "t", Key: "delayed", Payload: []byte("p"), DeliverAt: deliverAt})
	keys := make([]string, 32)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	b.write(t, keys...)
	shard := map[string]int{}
	rows, err := b.pool.Query(ctx, fmt.Sprintf(`SELECT key, shard FROM %s.outbox`, b.quoted()))
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		var s int
		if err := rows.Scan(&k, &s); err != nil {
			t.Fatal(err)
		}
		shard[k] = s
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// Keys in shards of their own: one retried in an hour, one retried and due already,
	// one fresh.
	var retried, due, fresh string
	used := map[int]bool{shard["delayed"]: true}
	for _, k := range keys {
		if used[shard[k]] {
			continue
		}
		used[shard[k]] = true
		switch {
		case retried == "":
			retried = k
		case due == "":
			due = k
		case fresh == "":
			fresh = k
		}
	}
	if fresh == "" {
		t.Fatalf("32 keys fell into too few shards: %v", shard)
	}
	t0 := time.Now()
	b.exec(t, `UPDATE %s.outbox SET attempts = 1, next_attempt_at = now() + interval '1 hour' WHERE key = $1`, retried)
	b.exec(t, `UPDATE %s.outbox SET attempts = 1, next_attempt_at = created_at + interval '1 millisecond' WHERE key = $1`, due)
	leases := func(keys ...string) []outboxdriver.Lease {
		var ls []outboxdriver.Lease
		for _, k := range keys {
			ls = append(ls, outboxdriver.Lease{Shard: shard[k], Token: 1})
		}
		return ls
	}
	next := func(ls []outboxdriver.Lease) time.Time {
		t.Helper()
		got, err := b.drv.NextDue(ctx, ls)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	// The database says how long until then; the time is on this clock.
	if got := next(leases(retried, due, fresh)); got.Before(t0.Add(time.Hour-time.Second)) || got.After(time.Now().Add(time.Hour+time.Second)) {
		t.Errorf("retried in an hour: next due in %s", time.Until(got))
	}
	if got := next(leases(retried, "delayed")); got.Sub(deliverAt).Abs() > 2*time.Second {
		t.Errorf("delayed until %s: next due %s", deliverAt, got)
	}
	for _, ls := range [][]outboxdriver.Lease{leases(due, fresh), nil} {
		if got := next(ls); !got.IsZero() {
			t.Errorf("shards %v hold nothing waiting: next due %s, want none", ls, got)
		}
	}
}

// TestStreamWALLevel: on a server with wal_level=replica (the shared one), the stream
// fails with StreamWALLevel.
func TestStreamWALLevel(t *testing.T) {
	t.Parallel()
	// testdb.URL's default, which this package's own tests cannot import.
	url := cmp.Or(os.Getenv("OUTBOX_TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	pool := streamPool(t, url)
	var level string
	if err := pool.QueryRow(testenv.Context(t), `SELECT current_setting('wal_level')`).Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level == "logical" { // the shared server is meant to run replica; check on one that does
		pool = streamPool(t, testpg.StartServer(t, "wal_level=replica").URL())
	}
	drv, err := New(pool, Config{})
	if err != nil {
		t.Fatal(err)
	}
	req := outboxdriver.StreamRequest{RelayID: "r1", Slot: pgsql.WALSlotDefault, Publication: pgsql.WALPublicationDefault}
	err = drv.Stream(testenv.Context(t), req, func(outboxdriver.StreamBatch) {})
	wantReason(t, "wal_level=replica", err, outboxdriver.StreamWALLevel)
	if err != nil && !strings.Contains(err.Error(), "wal_level") {
		t.Errorf("the error does not name wal_level: %v", err)
	}
}

// TestStreamImmediateStop: a server that crashes ends the stream with a transient
// error; the next stream delivers every transaction not acknowledged. (One that was may
// come again: PostgreSQL saves the slot's confirmed position at checkpoints.)
func TestStreamImmediateStop(t *testing.T) {
	t.Parallel()
	srv := testpg.StartServer(t, "wal_level=logical")
	b := newStreamBundle(t, srv, Config{}, true)
	b.write(t, "a")
	b.write(t, "b")
	r := b.stream(t, outboxdriver.StreamRequest{})
	first := r.awaitTxns(t, 2)
	r.ack(t, outboxdriver.StreamAck{LSN: first[0].End, Until: time.Now().Add(time.Hour)})
	b.awaitConfirmed(t, first[0].End)

	srv.Stop(testpg.Immediate)
	wantReason(t, "the server stopped", r.awaitExit(t), outboxdriver.StreamTransient)
	srv.Start()
	b.pool.Reset() // its connections died with the server

	r = b.stream(t, outboxdriver.StreamRequest{})
	var again []outboxdriver.StreamTxn
	testenv.Await(t, "the unacknowledged transaction again", func() (any, bool) {
		if r.ended() {
			t.Fatalf("Stream returned %v", r.err)
		}
		again = r.txns()
		return len(again), slices.ContainsFunc(again, func(x outboxdriver.StreamTxn) bool { return fmt.Sprint(x) == fmt.Sprint(first[1]) })
	})
	if fmt.Sprint(again[len(again)-1]) != fmt.Sprint(first[1]) || len(again) > 2 {
		t.Errorf("after the crash: %+v; want %+v last, after at most %+v", again, first[1], first[0])
	}
	t.Logf("after the crash, %d of the 2 transactions came again (the first was acknowledged)", len(again))
}

// TestStreamSlotLost: a slot that PostgreSQL invalidated, because it held more WAL
// than max_slot_wal_keep_size allows, fails with StreamSlotLost.
func TestStreamSlotLost(t *testing.T) {
	t.Parallel()
	srv := testpg.StartServer(t, "wal_level=logical", "max_slot_wal_keep_size=1MB")
	b := newStreamBundle(t, srv, Config{}, true)
	b.exec(t, `CREATE TABLE %s.filler (x int)`)
	testenv.Await(t, "the slot to be lost", func() (any, bool) {
		b.exec(t, `INSERT INTO %s.filler SELECT generate_series(1, 1000)`)
		b.exec(t, `SELECT pg_switch_wal()`)
		b.exec(t, `CHECKPOINT`)
		var status string
		if err := b.pool.QueryRow(testenv.Context(t), `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, b.slot).Scan(&status); err != nil {
			t.Fatal(err)
		}
		return status, status == "lost"
	})
	r := b.stream(t, outboxdriver.StreamRequest{})
	wantReason(t, "a lost slot", r.awaitExit(t), outboxdriver.StreamSlotLost)
}

func wantReason(t *testing.T, what string, err error, want outboxdriver.StreamReason) {
	t.Helper()
	var se *outboxdriver.StreamError
	if !errors.As(err, &se) || se.Reason != want {
		t.Errorf("%s: %v; want a StreamError %s", what, err, want)
		return
	}
	t.Logf("%s: %v", what, err)
}

// ---- helpers ----

// streamBundle is one test's outbox on a server: its own schema, a driver and a writer,
// and, set up, the slot and publication WAL mode reads.
type streamBundle struct {
	pool      *pgxpool.Pool
	drv       *Driver
	w         *outbox.Writer[pgx.Tx]
	schema    string
	slot, pub string
}

func newStreamBundle(t *testing.T, srv *testpg.Server, cfg Config, setup bool) *streamBundle {
	t.Helper()
	ctx := testenv.Context(t)
	var r [4]byte
	_, _ = rand.Read(r[:])
	cfg.Schema = "s_" + hex.EncodeToString(r[:])
	b := &streamBundle{pool: streamPool(t, srv.URL()), schema: cfg.Schema}
	var err error
	if b.drv, err = New(b.pool, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := b.drv.MigrateUp(ctx, 0); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if b.w, err = outbox.NewWriter(b.drv, outbox.WriterConfig{}); err != nil {
		t.Fatal(err)
	}
	b.slot, b.pub = b.drv.names.WALDefaults()
	if setup {
		// Creating a slot waits for the transactions open in the whole server, other
		// subtests' too.
		o := pgsql.WALSetupOptions{Slot: b.slot, Publication: b.pub, SlotTimeout: testenv.Stall()}
		if _, err := b.drv.names.WALSetup(ctx, b.drv.inTx, o); err != nil {
			t.Fatalf("wal setup: %v", err)
		}
	}
	return b
}

func streamPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := testenv.CallContext()
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// awaitRingMove recycles the pending ring until it moved a pending row (RotateRows 1
// retires the bucket that holds it).
func (b *streamBundle) awaitRingMove(t *testing.T) {
	t.Helper()
	moved := 0
	testenv.Await(t, "the ring to move the pending rows", func() (any, bool) {
		ctx, cancel := testenv.CallContext()
		defer cancel()
		rc, err := b.drv.Recycle(ctx)
		if err != nil {
			t.Fatal(err)
		}
		moved += rc.Moved
		return fmt.Sprintf("%+v", rc), moved > 0
	})
}

func (b *streamBundle) quoted() string { return `"` + b.schema + `"` }

// exec runs q with every %s replaced by the quoted schema.
func (b *streamBundle) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	q = strings.ReplaceAll(q, "%s", b.quoted())
	if _, err := b.pool.Exec(testenv.Context(t), q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func (b *streamBundle) begin(t *testing.T) pgx.Tx {
	t.Helper()
	tx, err := b.pool.Begin(testenv.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	return tx
}

func (b *streamBundle) commit(t *testing.T, tx pgx.Tx) {
	t.Helper()
	if err := tx.Commit(testenv.Context(t)); err != nil {
		t.Fatal(err)
	}
}

// write commits one transaction that writes a message of each key, and returns their
// seqs.
func (b *streamBundle) write(t *testing.T, keys ...string) []int64 {
	t.Helper()
	tx := b.begin(t)
	seqs := b.writeIn(t, tx, keys...)
	b.commit(t, tx)
	return seqs
}

// writeIn writes a message of each key in tx, and returns their seqs in order.
func (b *streamBundle) writeIn(t *testing.T, tx pgx.Tx, keys ...string) []int64 {
	t.Helper()
	msgs := make([]outbox.Message, len(keys))
	for i, k := range keys {
		msgs[i] = outbox.Message{Topic: "t", Key: k, Payload: []byte("p")}
	}
	ctx := testenv.Context(t)
	if err := b.w.Write(ctx, tx, msgs...); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT seq FROM %s.outbox WHERE key = ANY($1) ORDER BY seq`, b.quoted()), keys)
	if err != nil {
		t.Fatal(err)
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(seqs) != len(keys) {
		t.Fatalf("seqs of %v: %v, %v", keys, seqs, err)
	}
	return seqs
}

func (b *streamBundle) writeMsgs(t *testing.T, msgs ...outbox.Message) {
	t.Helper()
	ctx := testenv.Context(t)
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return b.w.Write(ctx, tx, msgs...) }); err != nil {
		t.Fatal(err)
	}
}

// confirmed returns the slot's confirmed_flush_lsn.
func (b *streamBundle) confirmed(t *testing.T) uint64 {
	t.Helper()
	var s string
	if err := b.pool.QueryRow(testenv.Context(t), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, b.slot).Scan(&s); err != nil {
		t.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(lsn)
}

func (b *streamBundle) awaitConfirmed(t *testing.T, want uint64) {
	t.Helper()
	testenv.Await(t, "confirmed_flush_lsn "+pglogrepl.LSN(want).String(), func() (any, bool) {
		c := b.confirmed(t)
		return pglogrepl.LSN(c), c == want
	})
}

// replyTime returns when the slot's walsender last heard a status update, "" for never.
func (b *streamBundle) replyTime(t *testing.T) string {
	t.Helper()
	var at string
	err := b.pool.QueryRow(testenv.Context(t), `SELECT coalesce(r.reply_time::text, '') FROM pg_stat_replication r
JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1`, b.slot).Scan(&at)
	if err != nil {
		t.Fatalf("the slot's walsender: %v", err)
	}
	return at
}

func (b *streamBundle) replied(t *testing.T) bool { t.Helper(); return b.replyTime(t) != "" }

// slotActive reports whether the slot is being read; false while it does not exist (a
// slot dropped and not yet made anew).
func (b *streamBundle) slotActive(t *testing.T) bool {
	t.Helper()
	var active bool
	err := b.pool.QueryRow(testenv.Context(t), `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, b.slot).Scan(&active)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return active
}

func (b *streamBundle) awaitActive(t *testing.T) {
	t.Helper()
	testenv.AwaitCond(t, "the slot to be read", func() bool { return b.slotActive(t) })
}

// awaitInactive waits for the walsender of a stopped stream to let the slot go.
func (b *streamBundle) awaitInactive(t *testing.T) {
	t.Helper()
	testenv.AwaitCond(t, "the slot to be free", func() bool { return !b.slotActive(t) })
}

// streamRun is a Stream running in the background, and what it emitted.
type streamRun struct {
	acks   chan outboxdriver.StreamAck
	cancel context.CancelFunc
	exited chan struct{}
	err    error // Stream's, once exited is closed

	mu  sync.Mutex
	got []outboxdriver.StreamBatch
}

// stream runs b's driver's Stream with req, filling in the relay, slot and publication
// unless set; it is stopped when the test ends.
func (b *streamBundle) stream(t *testing.T, req outboxdriver.StreamRequest) *streamRun {
	t.Helper()
	req.RelayID = cmp.Or(req.RelayID, "r1")
	req.Slot = cmp.Or(req.Slot, b.slot)
	req.Publication = cmp.Or(req.Publication, b.pub)
	r := &streamRun{acks: make(chan outboxdriver.StreamAck), exited: make(chan struct{})}
	req.Acks = r.acks
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		defer close(r.exited)
		r.err = b.drv.Stream(ctx, req, func(bt outboxdriver.StreamBatch) {
			r.mu.Lock()
			r.got = append(r.got, bt)
			r.mu.Unlock()
		})
	}()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *streamRun) batches() []outboxdriver.StreamBatch {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

func (r *streamRun) txns() []outboxdriver.StreamTxn {
	var out []outboxdriver.StreamTxn
	for _, bt := range r.batches() {
		out = append(out, bt.Txns...)
	}
	return out
}

func (r *streamRun) ended() bool {
	select {
	case <-r.exited:
		return true
	default:
		return false
	}
}

// awaitTxns waits until at least n transactions arrived, and returns them all.
func (r *streamRun) awaitTxns(t *testing.T, n int) []outboxdriver.StreamTxn {
	t.Helper()
	testenv.Await(t, fmt.Sprintf("%d transactions from the stream", n), func() (any, bool) {
		got := r.txns()
		if len(got) < n && r.ended() {
			t.Fatalf("Stream returned %v after %d of %d transactions: %+v", r.err, len(got), n, got)
		}
		return fmt.Sprintf("%+v", got), len(got) >= n
	})
	return r.txns()
}

func (r *streamRun) ack(t *testing.T, a outboxdriver.StreamAck) {
	t.Helper()
	select {
	case r.acks <- a:
	case <-r.exited:
		t.Fatalf("Stream returned %v before taking ack %+v", r.err, a)
	case <-time.After(testenv.Stall()):
		t.Fatalf("Stream did not take ack %+v in %s", a, testenv.Stall())
	}
}

// awaitExit waits for Stream to return on its own, and returns its error.
func (r *streamRun) awaitExit(t *testing.T) error {
	t.Helper()
	testenv.AwaitChan(t, "Stream to return", r.exited, func() any { return fmt.Sprintf("%+v", r.batches()) })
	return r.err
}

// stop ends the stream and returns its error.
func (r *streamRun) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	return r.awaitExit(t)
}
