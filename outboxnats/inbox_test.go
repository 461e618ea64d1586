package outboxnats_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testnats"
	"github.com/outboxkit/outbox/outboxnats"
)

// TestConsumeInboxExactlyOnce delivers n messages, and for about one in eight simulates a crash
// after the handler's transaction committed and before the ack (the handler reports an
// error after its commit, so the message is delivered again): every effect must happen
// exactly once. OUTBOX_TEST_INBOX_MESSAGES sets n: the default 10,000 gives about 1,000
// redeliveries, which is what the check needs; docs/robustness.md has a 100,000-message
// run. The test fails only when the consumer stops making progress, never on how long the
// whole run takes.
func TestConsumeInboxExactlyOnce(t *testing.T) {
	n := 10_000
	if v, err := strconv.Atoi(os.Getenv("OUTBOX_TEST_INBOX_MESSAGES")); err == nil && v > 0 {
		n = v
	}
	js := testnats.JetStream(t, "")
	stream, _ := consumeSetup(t, js, n, 1000)
	db := testdb.Migrated(t)
	ctx := context.Background()
	effects := `"` + db.Schema + `".effects`
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE `+effects+` (id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	in, err := outbox.NewInbox[pgx.Tx](db.Driver, outbox.InboxConfig{Consumer: "effects"})
	if err != nil {
		t.Fatal(err)
	}
	inTx := func(ctx context.Context, fn func(pgx.Tx) error) error { return pgx.BeginFunc(ctx, db.Pool, fn) }
	work := outbox.InboxHandler(in, inTx, func(ctx context.Context, tx pgx.Tx, d *outbox.Delivery) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+effects+` VALUES ($1)`, d.ID)
		return err
	})
	var handled, crashed atomic.Int64
	done := make(chan struct{})
	h := func(ctx context.Context, d *outbox.Delivery) error {
		if err := work(ctx, d); err != nil {
			return err
		}
		if d.Attempt == 1 && len(d.ID) > 0 && d.ID[len(d.ID)-1]%10 == 0 { // about one in eight
			crashed.Add(1)
			return outbox.Retry(errors.New("crash before ack"), 0)
		}
		if handled.Add(1) == int64(n) {
			close(done)
		}
		return nil
	}
	cfg := outboxnats.ConsumerConfig{Stream: stream, Durable: "inbox", Concurrency: 8, RetryDelay: 1}
	seen := func() any { return fmt.Sprintf("%d of %d handled, %d redelivered", handled.Load(), n, crashed.Load()) }
	if err := consumeUntil(t, js, cfg, h, done, seen); err != nil {
		t.Fatal(err)
	}
	var rows, distinct int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT id) FROM `+effects).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d messages, %d redelivered after a simulated crash", n, crashed.Load())
	if rows != n || distinct != n || crashed.Load() == 0 {
		t.Fatalf("%d effects (%d distinct) for %d messages with %d redeliveries; want exactly one each", rows, distinct, n, crashed.Load())
	}
}
