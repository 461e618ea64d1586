package outboxpgx

import (
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/internal/shard"
)

// The rows the stream carries (StreamRequest.Rows) are bounded in bytes: a transaction's
// rows beyond StreamTxnRowBytesMax, and a batch's beyond StreamBatchRowBytesMax, are left
// out (their seqs still come), so that a bulk load or a 16 MiB payload costs the relay
// no more than these. A row's bytes are its columns' bytes as the server sent them.
const (
	StreamTxnRowBytesMax   = 4 << 20
	StreamBatchRowBytesMax = 64 << 20
)

// rowField is the field of a message a column of the outbox table fills.
type rowField uint8

const (
	fieldNone rowField = iota // a column the relay does not read
	fieldSeq
	fieldID
	fieldTopic
	fieldKey
	fieldAggregateType
	fieldEventType
	fieldContentType
	fieldPayload
	fieldHeaders
	fieldDedupKey
	fieldCreatedAt
	fieldNextAttemptAt
	fieldAttempts
	fieldLastError
	fieldPriority
)

var rowFields = map[string]rowField{
	"seq": fieldSeq, "id": fieldID, "topic": fieldTopic, "key": fieldKey,
	"aggregate_type": fieldAggregateType, "event_type": fieldEventType, "content_type": fieldContentType,
	"payload": fieldPayload, "headers": fieldHeaders, "dedup_key": fieldDedupKey,
	"created_at": fieldCreatedAt, "next_attempt_at": fieldNextAttemptAt, "attempts": fieldAttempts,
	"last_error": fieldLastError, "priority": fieldPriority,
}

// rowNeeds are the fields a row must carry for the log to give its message; priority
// is not among them (an outbox before migration 10 has none: 0).
var rowNeeds = []rowField{fieldSeq, fieldID, fieldTopic, fieldKey, fieldAggregateType, fieldEventType,
	fieldContentType, fieldPayload, fieldHeaders, fieldDedupKey, fieldCreatedAt, fieldNextAttemptAt, fieldAttempts}

// walColumn is a column of the outbox table as a Relation message describes it.
type walColumn struct {
	field rowField
	oid   uint32
}

// rowColumns returns the outbox table's columns as m describes them, or nil when a
// column a message needs is missing (the relay then fetches every row: the log cannot
// give one).
func rowColumns(m *pglogrepl.RelationMessage) []walColumn {
	cols := make([]walColumn, len(m.Columns))
	var has [fieldPriority + 1]bool
	for i, c := range m.Columns {
		f := rowFields[c.Name]
		cols[i] = walColumn{field: f, oid: c.DataType}
		has[f] = true
	}
	for _, f := range rowNeeds {
		if !has[f] {
			return nil
		}
	}
	return cols
}

// tupleBytes is the size of a row as the server sent it, for the budgets.
func tupleBytes(t *pglogrepl.TupleData) int {
	n := 0
	for _, c := range t.Columns {
		n += len(c.Data)
	}
	return n
}

// keyRow returns the message of an insert into the outbox table with its seq and key
// alone (the key column at index key, as text or binary: both are its UTF-8 bytes), and
// its size for the budgets; nil when the key cannot be read.
func keyRow(seq int64, key int, t *pglogrepl.TupleData) (*outbox.Message, int) {
	if key >= len(t.Columns) {
		return nil, 0
	}
	c := t.Columns[key]
	if c.DataType != pglogrepl.TupleDataTypeBinary && c.DataType != pglogrepl.TupleDataTypeText {
		return nil, 0
	}
	return &outbox.Message{Seq: seq, Key: string(c.Data)}, len(c.Data)
}

// decodeRow returns the message of an insert into the outbox table, as the store's fetch
// would return it, with DeliverAt set when the row waits (its next attempt is not at its
// creation: a delayed message, or a retry a ring move inserted again), or nil for a row
// with a column it cannot read.
func decodeRow(types *pgtype.Map, cols []walColumn, t *pglogrepl.TupleData) *outbox.Message {
	if len(t.Columns) != len(cols) {
		return nil
	}
	m := &outbox.Message{}
	var (
		id        pgtype.UUID
		headers   []byte
		next      time.Time
		attempts  int32
		priority  int16
		lastError pgtype.Text
	)
	for i, c := range t.Columns {
		col := cols[i]
		var dst any
		switch col.field {
		case fieldNone:
			continue
		case fieldSeq:
			dst = &m.Seq
		case fieldID:
			dst = &id
		case fieldTopic:
			dst = &m.Topic
		case fieldKey:
			dst = &m.Key
		case fieldAggregateType:
			dst = &m.AggregateType
		case fieldEventType:
			dst = &m.EventType
		case fieldContentType:
			dst = &m.ContentType
		case fieldPayload:
			dst = &m.Payload
		case fieldHeaders:
			dst = &headers
		case fieldDedupKey:
			dst = &m.DedupKey
		case fieldCreatedAt:
			dst = &m.CreatedAt
		case fieldNextAttemptAt:
			dst = &next
		case fieldAttempts:
			dst = &attempts
		case fieldLastError:
			if c.DataType == pglogrepl.TupleDataTypeNull {
				continue
			}
			dst = &lastError
		case fieldPriority:
			dst = &priority
		}
		var format int16
		switch c.DataType {
		case pglogrepl.TupleDataTypeBinary:
			format = pgtype.BinaryFormatCode
		case pglogrepl.TupleDataTypeText:
			format = pgtype.TextFormatCode
		default: // a null in a column that is NOT NULL, or an unchanged TOAST value (never in an insert)
			return nil
		}
		if err := types.Scan(col.oid, format, c.Data, dst); err != nil {
			return nil
		}
	}
	h, err := pgsql.DecodeHeaders(m.Seq, headers)
	if err != nil || !id.Valid {
		return nil
	}
	m.ID, m.Headers, m.Priority, m.Attempts, m.LastError = id.Bytes, h, int(priority), int(attempts), lastError.String
	if !next.Equal(m.CreatedAt) {
		m.DeliverAt = next
	}
	if m.Payload == nil {
		m.Payload = []byte{}
	}
	m.Shard = shard.Of(m.Key, m.ID)
	return m
}
