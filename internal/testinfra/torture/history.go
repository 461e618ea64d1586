package torture

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
)

// Sum is the SHA-256 checksum of an event's payload.
type Sum [32]byte

// Checksum returns the checksum of payload.
func Checksum(payload []byte) Sum { return sha256.Sum256(payload) }

// Event is one event a writer attempted to write.
type Event struct {
	ID     outbox.ID
	Key    string
	Seq    int64 // per-key sequence, assigned under the aggregate's row lock
	Sum    Sum   // checksum of the payload written
	Poison bool  // carries PoisonHeader: the broker side refuses it, the relay must dead-letter it
	Size   int   // payload bytes
}

// Outcome is what became of a transaction.
type Outcome int

const (
	// Unknown means the COMMIT call itself failed (connection lost, context cancelled):
	// the transaction may or may not have committed. Resolve settles it.
	Unknown Outcome = iota
	// Committed means COMMIT returned success, or Resolve found the events.
	Committed
	// RolledBack means the writer rolled back on purpose, failed before sending COMMIT,
	// the server answered COMMIT with ROLLBACK, or Resolve found none of the events.
	RolledBack
)

func (o Outcome) String() string {
	switch o {
	case Committed:
		return "committed"
	case RolledBack:
		return "rolled_back"
	default:
		return "unknown"
	}
}

// Txn is one transaction a writer attempted.
type Txn struct {
	Writer   int
	Events   []Event
	Outcome  Outcome
	Resolved bool   // the outcome was Unknown and Resolve settled it from the database
	Long     bool   // held open on purpose before its outcome
	Err      string // the error that ended it, if any (empty for a purposeful rollback)
	Start    time.Time
	End      time.Time
}

// History is everything the writers attempted and what became of it. It is safe for
// concurrent use: writers Record into it while the run goes on.
type History struct {
	mu     sync.Mutex
	txns   []*Txn
	events atomic.Int64
}

// Record appends a finished transaction.
func (h *History) Record(t Txn) {
	h.mu.Lock()
	h.txns = append(h.txns, &t)
	h.mu.Unlock()
	h.events.Add(int64(len(t.Events)))
}

// Events returns the number of events recorded so far, whatever their outcome.
func (h *History) Events() int { return int(h.events.Load()) }

// Txns returns a copy of the recorded transactions.
func (h *History) Txns() []Txn {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Txn, len(h.txns))
	for i, t := range h.txns {
		out[i] = *t
	}
	return out
}

// Counts returns the number of transactions per outcome and the number of events.
func (h *History) Counts() (committed, rolledBack, unknown, events int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, t := range h.txns {
		events += len(t.Events)
		switch t.Outcome {
		case Committed:
			committed++
		case RolledBack:
			rolledBack++
		default:
			unknown++
		}
	}
	return
}

// Querier runs a query: a *pgx.Conn, a *pgxpool.Pool or a pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Resolve settles every Unknown outcome by looking its events up in the database after
// the run: in the business ledger the workload writes in the same transaction, and in
// the outbox's pending, published and dead tables of schema. A transaction whose events
// are all found committed; one with none found rolled back. Finding only some of them
// means the database broke atomicity, and Resolve returns an error rather than guess.
//
// Run it once writers have stopped and no connection that issued an unknown COMMIT can
// still be finishing it (the backend is gone from pg_stat_activity).
func (h *History) Resolve(ctx context.Context, db Querier, schema string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ids [][16]byte
	for _, t := range h.txns {
		if t.Outcome == Unknown {
			for _, e := range t.Events {
				ids = append(ids, e.ID)
			}
		}
	}
	if len(ids) == 0 {
		return nil
	}
	q := fmt.Sprintf(`SELECT event_id FROM %[1]s.%[2]s WHERE event_id = ANY($1)
UNION SELECT id FROM %[1]s.outbox WHERE id = ANY($1)
UNION SELECT id FROM %[1]s.outbox_published WHERE id = ANY($1)
UNION SELECT id FROM %[1]s.outbox_dead WHERE id = ANY($1)`, pgx.Identifier{schema}.Sanitize(), LedgerTable)
	rows, err := db.Query(ctx, q, ids)
	if err != nil {
		return fmt.Errorf("resolve unknown outcomes: %w", err)
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[[16]byte])
	if err != nil {
		return fmt.Errorf("resolve unknown outcomes: %w", err)
	}
	in := make(map[outbox.ID]bool, len(found))
	for _, id := range found {
		in[id] = true
	}
	for _, t := range h.txns {
		if t.Outcome != Unknown {
			continue
		}
		n := 0
		for _, e := range t.Events {
			if in[e.ID] {
				n++
			}
		}
		switch n {
		case len(t.Events):
			t.Outcome = Committed
		case 0:
			t.Outcome = RolledBack
		default:
			return fmt.Errorf("resolve: transaction of writer %d has %d of its %d events in the database: atomicity broken", t.Writer, n, len(t.Events))
		}
		t.Resolved = true
	}
	return nil
}

// txnRecord is one line of WriteJSONL.
type txnRecord struct {
	Writer   int           `json:"writer"`
	Outcome  string        `json:"outcome"`
	Resolved bool          `json:"resolved,omitempty"`
	Long     bool          `json:"long,omitempty"`
	Err      string        `json:"err,omitempty"`
	Start    time.Time     `json:"start"`
	End      time.Time     `json:"end"`
	Events   []eventRecord `json:"events"`
}

type eventRecord struct {
	ID     outbox.ID `json:"id"`
	Key    string    `json:"key"`
	Seq    int64     `json:"seq"`
	Sum    string    `json:"sha256"`
	Poison bool      `json:"poison,omitempty"`
	Size   int       `json:"size"`
}

// WriteJSONL writes the history as history.jsonl, one transaction a line in the order
// they finished: the failure artifact a failing run keeps next to its seed.
func (h *History) WriteJSONL(w io.Writer) error {
	enc := json.NewEncoder(w)
	for _, t := range h.Txns() {
		rec := txnRecord{Writer: t.Writer, Outcome: t.Outcome.String(), Resolved: t.Resolved, Long: t.Long, Err: t.Err, Start: t.Start, End: t.End}
		for _, e := range t.Events {
			rec.Events = append(rec.Events, eventRecord{ID: e.ID, Key: e.Key, Seq: e.Seq, Sum: hex.EncodeToString(e.Sum[:]), Poison: e.Poison, Size: e.Size})
		}
		if err := enc.Encode(rec); err != nil {
			return err
		}
	}
	return nil
}
