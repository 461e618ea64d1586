package outboxpgx_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
)

// TestNotifySaysWhereWritesStart: the NOTIFY trigger's payload (migration 6) is the lowest
// seq the transaction wrote, once per transaction, again only for a later statement that
// wrote a lower seq; a statement that wrote nothing notifies nothing.
func TestNotifySaysWhereWritesStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	froms := make(chan int64, 64)
	done := make(chan error, 1)
	go func() {
		done <- b.Driver.Listen(ctx, func(w outboxdriver.Wake, from int64) {
			if w == outboxdriver.WakeWritten {
				froms <- from
			}
		}, outboxdriver.Gate{})
	}()
	defer func() { cancel(); <-done }()
	b.holdGate(t) // as a waiting relay would: every writer notifies
	if from := testenv.AwaitRecv(t, "Listen's first wake-up", froms); from != 0 {
		t.Fatalf("the wake-up for what was written before LISTEN says %d, want 0", from)
	}
	maxSeq := func() int64 {
		var seq int64
		if err := b.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(max(seq), 0) FROM "%s".outbox`, b.Schema)).Scan(&seq); err != nil {
			t.Fatal(err)
		}
		return seq
	}
	msg := func(key string) outbox.Message { return outbox.Message{Topic: "t", Key: key, Payload: []byte(`1`)} }
	// expect reads the notifications up to the one a single write then sends (they come
	// in commit order), and checks those before it.
	expect := func(step string, want ...int64) {
		t.Helper()
		b.Write(t, msg("marker"))
		marker := maxSeq()
		var got []int64
		for {
			from := testenv.AwaitRecv(t, step, froms)
			if from == marker {
				break
			}
			got = append(got, from)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: notified %v, want %v", step, got, want)
		}
	}

	base := maxSeq()
	b.Write(t, msg("a"), msg("b"), msg("c"))
	expect("one statement of three rows", base+1)

	b.Exec(t, `DELETE FROM %[1]s.outbox WHERE seq = 1`) // its seq is written again below
	base = maxSeq()
	err := pgx.BeginFunc(ctx, b.Pool, func(tx pgx.Tx) error {
		for _, k := range []string{"d", "e"} {
			if err := b.Writer.Write(ctx, tx, msg(k)); err != nil {
				return err
			}
		}
		// A lower seq later in the transaction (as a replay writes one): notified again.
		_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO "%s".outbox (seq, id, topic, key, payload, dedup_key) OVERRIDING SYSTEM VALUE
			SELECT 1, gen_random_uuid(), 't', 'f', '1', 'replayed'`, b.Schema))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	expect("two statements, then a lower seq", base+1, 1)

	b.Exec(t, `INSERT INTO %[1]s.outbox (topic, key, payload) SELECT 't', 'g', '1' WHERE false`)
	expect("a statement that wrote nothing")
}

// TestNotifyMigrationKeepsTriggerState: migration 6 creates the trigger again, up and down,
// and keeps it disabled where WAL mode's setup disabled it.
func TestNotifyMigrationKeepsTriggerState(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	state := func() string {
		var s string
		if err := b.Pool.QueryRow(ctx, `SELECT tgenabled::text FROM pg_catalog.pg_trigger
			WHERE tgrelid = to_regclass($1) AND tgname = 'outbox_notify'`, `"`+b.Schema+`".outbox`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	b.Exec(t, `ALTER TABLE %[1]s.outbox DISABLE TRIGGER outbox_notify`)
	if _, err := b.Driver.MigrateDown(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if s := state(); s != "D" {
		t.Fatalf("after migrating down to 5 the trigger is %q, want D (disabled)", s)
	}
	if _, err := b.Driver.MigrateUp(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if s := state(); s != "D" {
		t.Fatalf("after migrating up to 6 the trigger is %q, want D (disabled)", s)
	}
	b.Exec(t, `ALTER TABLE %[1]s.outbox ENABLE TRIGGER outbox_notify`)
	if _, err := b.Driver.MigrateDown(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if s := state(); s != "O" {
		t.Fatalf("after migrating down to 5 the enabled trigger is %q, want O", s)
	}
}
