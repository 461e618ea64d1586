package outboxsql_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
)

// The database/sql drivers report a missing day of published history as ErrNoPartition,
// keep the message pending, and their Maintain creates the day.
func TestMissingPartitionKeepsPending(t *testing.T) {
	forEachDriver(t, func(t *testing.T, b *testBundle) {
		ctx := context.Background()
		if err := b.write(t, outbox.Message{Topic: "t", Key: "k", Payload: []byte(`1`)}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.pool.Exec(testenv.Context(t), `DROP TABLE "`+b.schema+`".outbox_published_`+todayUTC(t, b).Format("20060102")); err != nil {
			t.Fatal(err)
		}
		st, err := b.drv.SyncLeases(ctx, outboxdriver.LeaseRequest{RelayID: "r", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		got, err := b.drv.Fetch(ctx, outboxdriver.FetchRequest{RelayID: "r", Leases: st.Held, Limit: 10})
		if err != nil || len(got) != 1 {
			t.Fatalf("fetch: %d messages, %v", len(got), err)
		}
		var token int64
		for _, l := range st.Held {
			if l.Shard == got[0].Shard {
				token = l.Token
			}
		}
		c := outboxdriver.Completion{RelayID: "r", Published: []outboxdriver.Outcome{{Seq: got[0].Seq, Token: token}}}
		if _, err := b.drv.Complete(ctx, c); !errors.Is(err, pgsql.ErrNoPartition) {
			t.Fatalf("Complete without today's partition: %v; want ErrNoPartition", err)
		}
		m, err := b.drv.Maintain(ctx, outboxdriver.MaintainRequest{Retention: time.Hour, Limit: 100})
		if err != nil || len(m.Created) != 1 {
			t.Fatalf("Maintain: %+v, %v; want today created", m, err)
		}
		if refused, err := b.drv.Complete(ctx, c); err != nil || len(refused) != 0 {
			t.Fatalf("Complete once the day exists: refused %v, %v", refused, err)
		}
	})
}

// todayUTC is the database's current UTC day, which names the day's partition.
func todayUTC(t *testing.T, b *testBundle) time.Time {
	t.Helper()
	var day time.Time
	if err := b.pool.QueryRow(testenv.Context(t), `SELECT (now() AT TIME ZONE 'UTC')::date::timestamp`).Scan(&day); err != nil {
		t.Fatal(err)
	}
	return day
}
