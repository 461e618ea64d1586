package torture

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
)

// Delivery is one copy of an event read back from the broker.
type Delivery struct {
	ID      outbox.ID
	Key     string
	Seq     int64 // from the payload; 0 when the payload could not be parsed
	Sum     Sum   // checksum of the payload as received
	Headers map[string]string
	// Dest is where the broker holds the copy (a NATS subject), when the read-back says:
	// a run of several outboxes checks that each copy is in its own outbox's
	// destination.
	Dest string
	// Arrived is when the copy reached the broker, as the broker stamped it (JetStream's
	// stored time): the first instant any subscriber could receive it, whatever its own
	// reconnects. Zero when the broker's read-back gives no such time; Measure then
	// leaves the copy out.
	Arrived time.Time
}

// DeliveryLog is what a reader got back: the broker's copies in broker order (per key,
// the order of a partition, a stream or a single queue), and the dead letters read from
// the outbox's dead table. It is safe for concurrent use, but copies of one key must be
// added by one reader in the order the broker gave them.
type DeliveryLog struct {
	mu         sync.Mutex
	deliveries []Delivery
	dead       map[outbox.ID]string
}

// Add appends a copy in broker order.
func (l *DeliveryLog) Add(d Delivery) {
	l.mu.Lock()
	l.deliveries = append(l.deliveries, d)
	l.mu.Unlock()
}

// AddDead records a dead-lettered event and the reason the relay gave.
func (l *DeliveryLog) AddDead(id outbox.ID, reason string) {
	l.mu.Lock()
	if l.dead == nil {
		l.dead = map[outbox.ID]string{}
	}
	l.dead[id] = reason
	l.mu.Unlock()
}

// Copies returns the copies added, in the order they were added.
func (l *DeliveryLog) Copies() []Delivery {
	d, _ := l.snapshot()
	return d
}

// Len returns the number of copies added.
func (l *DeliveryLog) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.deliveries)
}

func (l *DeliveryLog) snapshot() ([]Delivery, map[outbox.ID]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := make([]Delivery, len(l.deliveries))
	copy(d, l.deliveries)
	dead := make(map[outbox.ID]string, len(l.dead))
	for k, v := range l.dead {
		dead[k] = v
	}
	return d, dead
}

// payload is the JSON body the workload writes. Filler pads it to its size.
type payload struct {
	ID     string `json:"id"`
	Key    string `json:"key"`
	Seq    int64  `json:"seq"`
	Filler string `json:"filler"`
}

// ParseDelivery builds a Delivery from a message as a broker returned it: the id from
// the Outbox-Id header (or, failing that, the payload), the key from Outbox-Key (or the
// payload), the seq from the payload, and the checksum of the payload bytes as received.
// A truncated or corrupted payload still yields a Delivery (its checksum will not match);
// only a copy with no recognisable id is an error.
func ParseDelivery(headers map[string]string, body []byte) (Delivery, error) {
	d := Delivery{Sum: Checksum(body), Headers: headers, Key: headers[outbox.HeaderKey]}
	var p payload
	perr := json.Unmarshal(body, &p)
	if perr == nil {
		d.Seq = p.Seq
		if d.Key == "" {
			d.Key = p.Key
		}
	}
	idText := headers[outbox.HeaderID]
	if idText == "" {
		idText = p.ID
	}
	id, err := outbox.ParseID(idText)
	if err != nil {
		return d, fmt.Errorf("torture: delivered copy has no event id (header %s %q, payload parse: %v)", outbox.HeaderID, strconv.Quote(idText), perr)
	}
	d.ID = id
	return d, nil
}

// LoadDead adds every event of schema's dead-letter table to l, with its last error as
// the reason. A runner calls it after the relay has drained.
func (l *DeliveryLog) LoadDead(ctx context.Context, db Querier, schema string) error {
	rows, err := db.Query(ctx, fmt.Sprintf(`SELECT id, last_error FROM %s.outbox_dead`, pgx.Identifier{schema}.Sanitize()))
	if err != nil {
		return fmt.Errorf("read dead letters: %w", err)
	}
	var id [16]byte
	var reason string
	_, err = pgx.ForEachRow(rows, []any{&id, &reason}, func() error {
		l.AddDead(id, reason)
		return nil
	})
	if err != nil {
		return fmt.Errorf("read dead letters: %w", err)
	}
	return nil
}
