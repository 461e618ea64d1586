package outboxprom

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
)

// TestStatusCollectorPostgres reads a known outbox in PostgreSQL: two topics with due,
// delayed, retrying, old and dead messages, and one relay holding every shard.
func TestStatusCollectorPostgres(t *testing.T) {
	t.Parallel()
	db := testdb.Migrated(t)
	dead := outbox.NewID()
	db.Write(t,
		outbox.Message{Topic: "orders", Key: "o1", Payload: []byte(`{}`)}, // made an hour old below
		outbox.Message{Topic: "orders", Key: "o2", Payload: []byte(`{}`)}, // made a retry below
		outbox.Message{Topic: "orders", Key: "o3", Payload: []byte(`{}`), DeliverAt: time.Now().Add(time.Hour)},
		outbox.Message{Topic: "billing", Key: "b1", Payload: []byte(`{}`)},
		outbox.Message{ID: dead, Topic: "billing", Key: "b2", Payload: []byte(`{}`)},
	)
	db.Exec(t, `UPDATE %[1]s.outbox SET created_at = now() - interval '1 hour' WHERE key = 'o1'`)
	db.Exec(t, `UPDATE %[1]s.outbox SET attempts = 1, next_attempt_at = now() + interval '1 hour' WHERE key = 'o2'`)
	db.Kill(t, dead, 3, "refused", 0)
	if _, err := db.Driver.SyncLeases(testenv.Context(t), outboxdriver.LeaseRequest{RelayID: "status-test", Hostname: "h", PID: 1, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(NewStatusCollector(db.Driver, StatusConfig{}))
	want := `
# HELP outbox_dead Dead-lettered messages.
# TYPE outbox_dead gauge
outbox_dead{topic="billing"} 1
outbox_dead{topic="orders"} 0
# HELP outbox_due Pending messages due now (not waiting for a retry backoff or DeliverAt).
# TYPE outbox_due gauge
outbox_due{topic="billing"} 1
outbox_due{topic="orders"} 1
# HELP outbox_pending Messages not yet published and not dead, due or not.
# TYPE outbox_pending gauge
outbox_pending{topic="billing"} 1
outbox_pending{topic="orders"} 3
# HELP outbox_relays_live Relays with an unexpired heartbeat.
# TYPE outbox_relays_live gauge
outbox_relays_live 1
# HELP outbox_retrying Pending messages rejected at least once, waiting for or due for another attempt.
# TYPE outbox_retrying gauge
outbox_retrying{topic="billing"} 0
outbox_retrying{topic="orders"} 1
# HELP outbox_shards Shards the outbox is divided into.
# TYPE outbox_shards gauge
outbox_shards 64
# HELP outbox_shards_leased Shards with an unexpired lease.
# TYPE outbox_shards_leased gauge
outbox_shards_leased 64
# HELP outbox_status_up 1 when the last read of the outbox's status succeeded, 0 when it failed or timed out.
# TYPE outbox_status_up gauge
outbox_status_up 1
`
	got := exposition(t, reg, "outbox_dead", "outbox_due", "outbox_pending",
		"outbox_relays_live", "outbox_retrying", "outbox_shards", "outbox_shards_leased", "outbox_status_up")
	if strings.TrimSpace(got) != strings.TrimSpace(want) {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	// The oldest pending age is database time since created_at: an hour for orders,
	// moments for billing.
	orders := value(t, reg, "outbox_oldest_pending_age_seconds", map[string]string{"topic": "orders"})
	billing := value(t, reg, "outbox_oldest_pending_age_seconds", map[string]string{"topic": "billing"})
	if orders < 3600 || orders > 3600+600 || billing < 0 || billing > 600 {
		t.Fatalf("oldest pending age: orders %vs (want about 3600), billing %vs (want about 0)", orders, billing)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		n += len(mf.GetMetric())
	}
	if n != 2*5+10 {
		t.Fatalf("%d series, want 5 per topic and 10 others", n)
	}
	if p, ahead := value(t, reg, "outbox_partitions", nil), value(t, reg, "outbox_partition_days_ahead", nil); p != 8 || ahead != 7 {
		t.Fatalf("outbox_partitions %v, outbox_partition_days_ahead %v; want 8 and 7 after the migration", p, ahead)
	}
	if rot, rows := value(t, reg, "outbox_ring_rotations", nil), value(t, reg, "outbox_ring_rows_since_rotation", nil); rot != 0 || rows < 1 {
		t.Fatalf("outbox_ring_rotations %v, outbox_ring_rows_since_rotation %v; want no rotation and the rows written", rot, rows)
	}
}
