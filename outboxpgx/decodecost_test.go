package outboxpgx

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testpg"
	"github.com/outboxkit/outbox/outboxtest"
)

// TestDecodeCost measures what logical decoding costs per event, and where it goes
// (docs/design-wal.md, "What the walsender decodes"). On demand only:
//
//	OUTBOX_DECODE_COST=20000 go test -run TestDecodeCost -v ./outboxpgx
//
// On a private server with wal_level=logical, an outbox set up for WAL mode, and slots
// made before any work (so each keeps the same window of WAL), writers commit the events
// (10 a transaction) while a polling relay publishes them: the writers' inserts, the
// relay's fetches, outcomes, history, leases and heartbeats, as a drain with writers
// produces them. Then the window is decoded several ways with the peek functions, which
// decode as a walsender does without moving a slot: test_decoding, to count every change
// by table and kind; pgoutput with a publication of no table (every change decoded and
// dropped at the end: the floor of any publication); of the outbox's seq column only; of
// every column in text (WAL mode's publication today); and in binary.
func TestDecodeCost(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("OUTBOX_DECODE_COST"))
	if n <= 0 {
		t.Skip("on demand: OUTBOX_DECODE_COST=<events>")
	}
	srv := testpg.StartServer(t, "wal_level=logical", "max_wal_size=4GB")
	b := newStreamBundle(t, srv, Config{}, true)
	ctx := testenv.Context(t)
	b.exec(t, `CREATE PUBLICATION cost_none`)
	b.exec(t, `CREATE PUBLICATION cost_seq FOR TABLE %s.outbox (seq) WITH (publish = 'insert', publish_via_partition_root = true)`)
	for _, s := range [][2]string{{"cost_changes", "test_decoding"}, {"cost_pgoutput", "pgoutput"}} {
		b.exec(t, `SELECT pg_create_logical_replication_slot($1, $2)`, s[0], s[1])
	}

	pub := &outboxtest.Publisher{}
	relay, err := outbox.NewRelay(b.drv, pub, outbox.RelayConfig{ID: "cost", PollInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil {
		t.Fatal(err)
	}
	payload := []byte(`{"order":"` + strings.Repeat("x", 100) + `"}`)
	start := time.Now()
	for i := 0; i < n; i += 10 {
		tx := b.begin(t)
		msgs := make([]outbox.Message, 0, 10)
		for j := i; j < i+10 && j < n; j++ {
			msgs = append(msgs, outbox.Message{Topic: "orders", Key: "k" + strconv.Itoa(j%1000), Payload: payload})
		}
		if err := b.w.Write(ctx, tx, msgs...); err != nil {
			t.Fatal(err)
		}
		b.commit(t, tx)
	}
	err = testenv.Progress(ctx, fmt.Sprintf("%d events published", n), testenv.Stall(), func() (any, bool) {
		got := len(pub.Messages())
		return got, got >= n
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := relay.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d events written and published in %v", n, time.Since(start).Round(time.Millisecond))

	var window string
	if err := b.pool.QueryRow(ctx, `SELECT pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn))
FROM pg_replication_slots WHERE slot_name = 'cost_pgoutput'`).Scan(&window); err != nil {
		t.Fatal(err)
	}
	t.Logf("WAL window: %s", window)
	rows, err := b.pool.Query(ctx, `SELECT coalesce(substring(data FROM '^table ([^:]+):'), split_part(data, ' ', 1)),
    coalesce(substring(data FROM '^table [^:]+: ([A-Z]+):'), ''), count(*)
FROM pg_logical_slot_peek_changes('cost_changes', NULL, NULL, 'skip-empty-xacts', '1')
GROUP BY 1, 2 ORDER BY 3 DESC`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var target, kind string
		var count int64
		if err := rows.Scan(&target, &kind, &count); err != nil {
			t.Fatal(err)
		}
		t.Logf("changes: %-48s %-7s %9d  %.2f an event", target, kind, count, float64(count)/float64(n))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, v := range []struct{ name, pub, binary string }{
		{"no table", "cost_none", "false"},
		{"seq column only", "cost_seq", "false"},
		{"every column, text", b.pub, "false"},
		{"every column, binary", b.pub, "true"},
	} {
		best := time.Duration(1 << 62)
		var msgs, bytes int64
		for range 3 { // the best of three: the first also reads the WAL from disk
			began := time.Now()
			err := b.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(length(data)), 0)
FROM pg_logical_slot_peek_binary_changes('cost_pgoutput', NULL, NULL, 'proto_version', '1', 'publication_names', $1, 'binary', $2)`,
				v.pub, v.binary).Scan(&msgs, &bytes)
			if err != nil {
				t.Fatalf("%s: %v", v.name, err)
			}
			best = min(best, time.Since(began))
		}
		t.Logf("pgoutput, %-22s %8v  %5.2f µs an event, %d messages, %d bytes", v.name+":", best.Round(time.Millisecond),
			float64(best.Microseconds())/float64(n), msgs, bytes)
	}
}
