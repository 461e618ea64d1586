package outboxpgx_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
)

// BenchmarkInbox measures what the inbox adds to a handler: the same transaction (one
// effect row per message) without and with the inbox claim, one message per transaction
// and a hundred per transaction (ClaimBatch). Run with
//
//	go test -run '^$' -bench Inbox -count 5 ./outboxpgx
//
// and compare each "inbox" line with its "plain" line. The claim is one statement in the
// handler's transaction: one extra round trip per transaction, whatever its size.
func BenchmarkInbox(b *testing.B) {
	db := testdb.Migrated(b)
	ctx := context.Background()
	effects := `"` + db.Schema + `".effects`
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE `+effects+` (id text NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	in, err := outbox.NewInbox[pgx.Tx](db.Driver, outbox.InboxConfig{Consumer: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	nextIDs := func(k int) []string {
		ids := make([]string, k)
		for i := range ids {
			n++
			ids[i] = "m-" + strconv.Itoa(n)
		}
		return ids
	}
	for _, size := range []int{1, 100} {
		for _, withInbox := range []bool{false, true} {
			name := "plain"
			if withInbox {
				name = "inbox"
			}
			b.Run(name+"/batch="+strconv.Itoa(size), func(b *testing.B) {
				for b.Loop() {
					ids := nextIDs(size)
					err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
						if withInbox {
							if _, err := in.ClaimBatch(ctx, tx, ids); err != nil {
								return err
							}
						}
						_, err := tx.Exec(ctx, `INSERT INTO `+effects+` SELECT unnest($1::text[])`, ids)
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size), "ns/msg")
			})
		}
	}
}
